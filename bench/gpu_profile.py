"""Where a GPU step's time goes beyond the matmuls: the attention kernel per batch shape, and the
kernels and host work of nlptrain's loop beside the bare step. One GPU, under a minute.

1. Attention: which SDPA kernel runs a bf16 MiniLM step (torch's own choice, then nlptrain's
   forward context, `nlptrain.precision.autocast`), what the first step at each new sequence
   length costs in each (dynamic padding meets dozens of lengths an epoch), the steady step at
   one length, and BERT-base at batch 256 x 128 in both (is the kernel left out faster there?).
2. Loops: torch.profiler over the bare step and nlptrain's `Trainer.fit` on MiniLM at batch 16
   x 128 (bench/gpu_loops.py): CUDA kernels launched per step and the host ops that take longest.

    python bench/gpu_profile.py               # on a GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_bench  # noqa: E402
import gpu_loops  # noqa: E402
from nlptrain.precision import autocast  # noqa: E402

ATTENTION_NAMES = ("attention", "fmha", "flash", "cudnn", "sdpa", "mha")


def train_step(model, batch: int, length: int, context) -> None:
    ids = torch.randint(1000, 30000, (batch, length), device="cuda")
    mask = torch.ones_like(ids)
    mask[: batch // 2, length // 2:] = 0  # padded rows: a real mask, as dynamic padding makes
    labels = torch.randint(0, 2, (batch,), device="cuda")
    with context():
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
    loss.backward()
    model.zero_grad(set_to_none=True)


def timed_step(model, batch: int, length: int, context) -> float:
    """Milliseconds of one training step, between two device synchronizations."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    train_step(model, batch, length, context)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3


def attention(args: argparse.Namespace) -> None:
    contexts = {"torch's choice": lambda: torch.autocast("cuda", dtype=torch.bfloat16),
                "nlptrain's forward": lambda: autocast(torch.device("cuda"), "bf16")}
    print(f"cuDNN {torch.backends.cudnn.version()}; SDPA enabled: cudnn "
          f"{torch.backends.cuda.cudnn_sdp_enabled()}, flash {torch.backends.cuda.flash_sdp_enabled()}"
          f", mem-efficient {torch.backends.cuda.mem_efficient_sdp_enabled()}", flush=True)
    model = gpu_bench.make_model("minilm")[0].cuda().train()
    for offset, (name, context) in enumerate(contexts.items()):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            train_step(model, 16, 40 + offset, context)
            torch.cuda.synchronize()
        kernels = sorted({e.key[:90] for e in prof.key_averages()
                          if any(n in e.key.lower() for n in ATTENTION_NAMES)})
        print(f"MiniLM bf16, {name}: attention kernels {kernels}")
        # New lengths for each context (odd / even), so every first step meets a new shape.
        firsts = [timed_step(model, 16, n, context)
                  for n in range(12 + offset, 12 + offset + 2 * args.lengths, 2)]
        steady = [timed_step(model, 16, 64, context) for _ in range(8)][3:]
        print(f"  first step at each of {args.lengths} new lengths: median "
              f"{statistics.median(firsts):.1f} ms, total {sum(firsts) / 1e3:.2f} s; steady step "
              f"at 16 x 64: {statistics.median(steady):.1f} ms", flush=True)
    big = gpu_bench.make_model("bert-base")[0].cuda().train()
    for name, context in contexts.items():
        steps = [timed_step(big, 256, 128, context) for _ in range(8)][3:]
        print(f"BERT-base bf16 256 x 128, {name}: {statistics.median(steps):.1f} ms a step "
              f"(forward + backward, no optimizer)", flush=True)


def loops(args: argparse.Namespace) -> None:
    data = gpu_bench.load_rows(args.data_dir, 1024, 128)
    for loop in ("bare", "nlptrain"):
        model = gpu_bench.make_model("minilm")[0].cuda().train()
        warmup, steps = 5, 20
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                torch.profiler.ProfilerActivity.CUDA]) as prof:
            seconds = gpu_loops.LOOPS[loop](model, data, 16, warmup, steps, torch.device("cuda"),
                                            torch.bfloat16)
        events = prof.key_averages()
        kernels = sum(e.count for e in events if e.device_type == torch.autograd.DeviceType.CUDA)
        print(f"\n== {loop}: {seconds / steps * 1e3:.1f} ms a step under the profiler; "
              f"{kernels / (warmup + steps):.0f} CUDA kernels a step ==")
        print(events.table(sort_by="self_cpu_time_total", row_limit=args.rows, max_name_column_width=60))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, default=24, help="new sequence lengths to time")
    p.add_argument("--rows", type=int, default=18, help="host ops listed per loop")
    p.add_argument("--data-dir", type=Path, default=gpu_bench.common.default_data_dir())
    p.add_argument("--only", choices=["attention", "loops"])
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: this profile needs a GPU", file=sys.stderr)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    print(f"{torch.cuda.get_device_name()}; torch {torch.__version__}", flush=True)
    for part in (attention, loops):
        if args.only in (None, part.__name__):
            try:
                part(args)
            except Exception:  # the other part still runs
                traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
