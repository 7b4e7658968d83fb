"""What the levers PyTorch and transformers offer do to one training step on this machine.

One process, MiniLM-L6, batch 16, random ids with a full attention mask, forward + backward +
fused AdamW, for each lever against the default (transformers' `sdpa` attention, the model's
own dropout, fp32). The variants are timed in turns, round after round (noise that hits a round
hits them all), and each row is the median step time and its ratio to the default's:

- `eager`: transformers' own attention (matmul, softmax, dropout, matmul) instead of SDPA;
- `sdpa, no attention dropout`: attention-probability dropout 0 (the hidden dropout kept),
  the only way torch's fused CPU attention kernel (flash) is used in training: it takes no
  dropout, so with the model's 0.1 SDPA falls back to its unfused math path;
- `nlptrain's CPU dropout`: what a Trainer on a CPU runs by default (`[train] cpu_dropout`,
  `nlptrain/cpu_dropout.py`): masks from 16 random bits an element, attention dropout outside
  SDPA's math path;
- `--precisions ... bf16`: the default step and nlptrain's CPU dropout under bf16 autocast;
- `--seqs`: more lengths, e.g. `41 48` to see whether a multiple of 8 suits the kernels.

    python bench/step_levers.py [--threads 1] [--seqs 32 128] [--rounds 6] [--precisions fp32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

# name -> (attention implementation, attention dropout: None keeps the model's, nlptrain's CPU
# dropout)
LEVERS = {
    "default (sdpa)": ("sdpa", None, False),
    "eager attention": ("eager", None, False),
    "sdpa, no attention dropout": ("sdpa", 0.0, False),
    "nlptrain's CPU dropout": ("sdpa", None, True),
}
EVERY_PRECISION = ("default (sdpa)", "nlptrain's CPU dropout")  # the others: fp32 only


def build(attention: str, attention_dropout: float | None, cpu_dropout: bool):
    import torch

    from nlptrain.models import load_model

    torch.manual_seed(0)
    model = load_model("minilm", ["a", "b"])
    model.set_attn_implementation(attention)
    if attention_dropout is not None:
        for module in model.modules():
            if type(module).__name__.endswith("SelfAttention"):
                module.dropout.p = attention_dropout
    if cpu_dropout:
        from nlptrain.cpu_dropout import use_cpu_dropout

        use_cpu_dropout(model)
    model.train()
    return model, torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1,
                        help="torch threads (1: a rank of the benchmark's 2 ranks x 1 thread)")
    parser.add_argument("--seqs", type=int, nargs="+", default=[32, 128])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=6, help="rounds of 2 steps; the first warms up")
    parser.add_argument("--precisions", nargs="+", default=["fp32"])
    args = parser.parse_args()
    import torch

    from nlptrain.precision import autocast

    torch.set_num_threads(args.threads)
    print(f"CPU: {common.cpu_model()}, {args.threads} thread(s); MiniLM-L6, batch {args.batch_size}; "
          f"torch {torch.__version__}; median of {args.rounds - 1} rounds x 2 steps\n")
    cpu = torch.device("cpu")
    variants = [(name, precision) for precision in args.precisions for name in LEVERS
                if precision == "fp32" or name in EVERY_PRECISION]
    models = {name: build(*LEVERS[name]) for name in LEVERS}
    print("| seq | lever | precision | ms per step | us per token | x default (same precision) |")
    print("|---|---|---|---|---|---|")
    for seq in args.seqs:
        batch = {"input_ids": torch.randint(1000, 20000, (args.batch_size, seq)),
                 "attention_mask": torch.ones(args.batch_size, seq, dtype=torch.long),
                 "labels": torch.randint(0, 2, (args.batch_size,))}
        times: dict[tuple[str, str], list[float]] = {v: [] for v in variants}
        for round_ in range(args.rounds):
            for name, precision in variants:
                model, optimizer = models[name]
                for _ in range(2):
                    start = time.perf_counter()
                    with autocast(cpu, precision):
                        loss = model(**batch).loss
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    if round_:
                        times[(name, precision)].append(time.perf_counter() - start)
        for name, precision in variants:
            step = statistics.median(times[(name, precision)])
            ratio = f"{statistics.median(times[('default (sdpa)', precision)]) / step:.2f}"
            per_token = step * 1e6 / (args.batch_size * seq)
            print(f"| {seq} | {name} | {precision} | {step * 1e3:.0f} | {per_token:.0f} | {ratio} |",
                  flush=True)


if __name__ == "__main__":
    main()
