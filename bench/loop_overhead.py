"""What nlptrain's loop costs around a step whose compute is near nothing, on the CPU: the host
time and the device ops it adds to the bare hand-written step (bench/gpu_loops.py's `bare` and
`nlptrain`, the loops gpu_bench.py times on a GPU).

On a GPU at small batches (MiniLM at batch 16) the step is launch-bound: the host's time per step
is the step's time, and each small op the loop adds is a kernel launch costing about what one of
the model's does. This CPU stand-in shows that cost without a GPU: a 6-layer BERT 12 wide (about
MiniLM's op count a step, almost none of its FLOPs), batch 4 x 16 tokens, fp32, fused AdamW in
both loops, nlptrain without its CPU-only dropout (a GPU has no use for it). "kernel ops" counts
the ops a GPU would launch (dispatched aten ops less views and host-only ones).

Each round runs every loop in a fresh process, interleaved (a b c a b c ...); the table gives the
best and median us/step over the rounds. `--against REV` adds nlptrain's loop as it was at git
revision REV, to measure a change against the code before it in the same run.

    python bench/loop_overhead.py                      # ~1 min
    python bench/loop_overhead.py --against HEAD~3     # also the loop at HEAD~3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

ROWS, SEQ, BATCH = 64, 16, 4


def _kernel_ops(run, skipped: int = 5, counted: int = 30) -> Counter:
    """The ops a GPU would launch (not views, not host-only ones) in a loop's steps `skipped`+1
    to `skipped`+`counted`, a step, by name: `run(steps)` runs the loop for `steps` steps."""
    from torch.utils._python_dispatch import TorchDispatchMode

    import gpu_loops

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: Counter[str] = Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if not (func.is_view or func.namespace == "profiler" or func.__name__.split(".")[0]
                    in ("lift_fresh", "_local_scalar_dense", "detach")):
                self.ops[str(func)] += 1
            return func(*args, **(kwargs or {}))

    counting, at = Count(), {}
    step_ended = gpu_loops.StepClock.step_ended

    def snapshot(clock) -> bool:  # the loops' own step counter, at each step's end
        ended = step_ended(clock)
        if clock.done in (skipped, skipped + counted):
            at[clock.done] = Counter(counting.ops)
        return ended

    gpu_loops.StepClock.step_ended = snapshot
    try:
        with counting:
            run(skipped + counted)
    finally:
        gpu_loops.StepClock.step_ended = step_ended
    return Counter({k: v / counted for k, v in (at[skipped + counted] - at[skipped]).items()})


def worker(steps: int, pairs: int, layers: int) -> dict:
    """In this process: `pairs` times the bare loop then nlptrain's, `steps` timed steps each
    (the median step of each run); then each loop's kernel ops a step."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification

    import gpu_loops
    import nlptrain

    torch.set_num_threads(1)

    def model():
        torch.manual_seed(0)
        config = BertConfig(vocab_size=1000, hidden_size=12, num_hidden_layers=layers,
                            num_attention_heads=12, intermediate_size=48,
                            max_position_embeddings=SEQ, num_labels=2)
        return BertForSequenceClassification(config).train()

    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (ROWS, SEQ), generator=generator)
    mask = torch.ones_like(ids)
    mask[:, SEQ - 3:] = 0  # some padding in every row, as dynamic padding leaves
    data = (ids, mask, torch.randint(0, 2, (ROWS,), generator=generator))
    cpu = torch.device("cpu")
    # A step's median within a run, and the two loops run by turns in one process: on a shared
    # VM the machine's speed drifts by +-20% over seconds (other guests), which a pair shares.
    ends: list[float] = []
    step_ended = gpu_loops.StepClock.step_ended

    def timed(clock) -> bool:
        ends.append(time.perf_counter())
        return step_ended(clock)

    def median_step(loop: str) -> float:
        ends.clear()
        gpu_loops.StepClock.step_ended = timed
        try:
            gpu_loops.LOOPS[loop](model(), data, BATCH, 20, steps, cpu, None)
        finally:
            gpu_loops.StepClock.step_ended = step_ended
        return statistics.median(b - a for a, b in zip(ends[20:], ends[21:], strict=False)) * 1e6

    found: dict = {"bare": [], "nlptrain": []}
    for _ in range(pairs):
        for loop in found:
            found[loop].append(median_step(loop))
    ops = {loop: dict(_kernel_ops(lambda n, loop=loop: gpu_loops.LOOPS[loop](
        model(), data, BATCH, 0, n, cpu, None))) for loop in found}
    return {"us_per_step": found, "ops": ops, "nlptrain": str(Path(nlptrain.__file__).parent)}


def run_worker(args: argparse.Namespace, site: Path | None) -> dict:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(args.steps),
                          "--pairs", str(args.pairs), "--layers", str(args.layers)],
                         env=env, capture_output=True, text=True)
    if out.returncode:
        raise SystemExit(f"the worker failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3, help="processes for each nlptrain")
    p.add_argument("--pairs", type=int, default=4, help="bare-then-nlptrain runs in each")
    p.add_argument("--steps", type=int, default=200, help="timed steps a run, after 20 untimed")
    p.add_argument("--layers", type=int, default=1,
                   help="BERT layers (1: the loop's cost is the larger share of a step)")
    p.add_argument("--against", metavar="REV", help="also nlptrain's loop at this git revision")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args.steps, args.pairs, args.layers)))
        return 0

    sites: dict[str, Path | None] = {"nlptrain (this tree)": None}
    if args.against:
        from contenders import checkout_at

        sites[f"nlptrain at {args.against}"] = checkout_at(args.against) / "site"
    print(f"CPU: {common.cpu_model()}, 1 thread; BERT {args.layers} layer(s) 12 wide, batch "
          f"{BATCH} x {SEQ}, fp32; {args.rounds} processes x {args.pairs} pairs x {args.steps} "
          "steps for each nlptrain", flush=True)
    found: dict[str, list[dict]] = {label: [] for label in sites}
    for round_ in range(args.rounds):
        for label, site in sites.items():  # interleaved: a b a b ...
            found[label].append(run_worker(args, site))
            times = found[label][-1]["us_per_step"]
            print(f"round {round_ + 1}/{args.rounds}, {label}: bare "
                  f"{', '.join(f'{t:.0f}' for t in times['bare'])}; nlptrain "
                  f"{', '.join(f'{t:.0f}' for t in times['nlptrain'])} us/step", flush=True)

    print("\n| nlptrain | bare us/step | nlptrain us/step | over bare, us (median of pairs) "
          "| nlptrain / bare | kernel ops/step, bare | nlptrain | over bare |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, runs in found.items():
        bare = [t for r in runs for t in r["us_per_step"]["bare"]]
        ours = [t for r in runs for t in r["us_per_step"]["nlptrain"]]
        over = statistics.median(b - a for a, b in zip(bare, ours, strict=True))
        ops_bare, ops_ours = (sum(runs[0]["ops"][k].values()) for k in ("bare", "nlptrain"))
        print(f"| {label} | {statistics.median(bare):.0f} | {statistics.median(ours):.0f} "
              f"| {over:+.0f} | {statistics.median(ours) / statistics.median(bare):.3f} "
              f"| {ops_bare:.1f} | {ops_ours:.1f} | {ops_ours - ops_bare:+.1f} |")
    for label, runs in found.items():
        extra = Counter(runs[0]["ops"]["nlptrain"])
        extra.subtract(runs[0]["ops"]["bare"])
        listed = ", ".join(f"{name.removeprefix('aten.')} {n:+.1f}" for name, n in
                           sorted(extra.items(), key=lambda kv: -abs(kv[1])) if abs(n) >= 0.05)
        print(f"\n{label} ({runs[0]['nlptrain']}): ops a step over bare: {listed or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
