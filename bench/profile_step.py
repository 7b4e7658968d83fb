"""Where a training step's time goes: torch.profiler over MiniLM steps on this CPU, per op.

One process, batch 16 x 128 tokens (random ids, full attention mask: the kernels see the shapes
of the quick benchmark's padded batches), forward + backward + nlptrain's fused AdamW, in fp32 and in bf16
autocast, after warm-up steps, with freed memory kept in the process as nlptrain's CPU runs do
(`--no-keep-freed-memory`: glibc's default). Prints the CPU, the mean step time of each precision
and the top ops by self CPU time.

    python bench/profile_step.py [--steps 3] [--threads 2] [--seq 128] [--top 12]
                                 [--precisions fp32 bf16] [--no-keep-freed-memory]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import common  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--no-keep-freed-memory", dest="keep_freed_memory", action="store_false",
                        help="leave glibc's thresholds as they are (nlptrain's opt-out)")
    args = parser.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from nlptrain import host_memory
    from nlptrain.models import load_model
    from nlptrain.precision import autocast

    torch.set_num_threads(args.threads)
    kept = args.keep_freed_memory and host_memory.keep_freed_memory()
    print(f"CPU: {common.cpu_model()}, {args.threads} threads; MiniLM-L6, batch {args.batch_size} "
          f"x {args.seq} tokens; torch {torch.__version__}; freed memory "
          f"{'kept' if kept else 'returned (glibc default)'}")
    torch.manual_seed(0)
    model = load_model("minilm", ["a", "b"])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)  # nlptrain's default
    batch = {"input_ids": torch.randint(1000, 20000, (args.batch_size, args.seq)),
             "attention_mask": torch.ones(args.batch_size, args.seq, dtype=torch.long),
             "labels": torch.randint(0, 2, (args.batch_size,))}
    cpu = torch.device("cpu")

    def step(precision: str) -> None:
        with autocast(cpu, precision):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def timed(precision: str) -> float:
        start = time.perf_counter()
        for _ in range(args.steps):
            step(precision)
        return (time.perf_counter() - start) / args.steps

    times = {}
    for precision in args.precisions:
        step(precision)  # warm-up: kernels, allocator
        times[precision] = timed(precision)
        # The profiler's own cost is not even across ops (on one EPYC it made the 47 MB zero-fill
        # of the word embedding's gradient 60-85 ms instead of 1): the step is timed without it too.
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            profiled = timed(precision)
        print(f"\n### {precision}: {times[precision] * 1e3:.0f} ms per step "
              f"({args.batch_size / times[precision]:.1f} samples/s; {profiled * 1e3:.0f} ms under "
              "the profiler), top ops by self CPU time under the profiler\n")
        events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
        total = sum(e.self_cpu_time_total for e in events)
        print("| op | calls per step | self CPU ms per step | share |")
        print("|---|---|---|---|")
        for event in events[: args.top]:
            print(f"| `{event.key}` | {event.count / args.steps:.0f} | "
                  f"{event.self_cpu_time_total / 1e3 / args.steps:.1f} | "
                  f"{event.self_cpu_time_total / total:.1%} |")
    if len(times) > 1:
        first, *rest = args.precisions
        print("\n" + ", ".join(f"{p} step / {first} step: {times[p] / times[first]:.2f}"
                               for p in rest))


if __name__ == "__main__":
    main()
