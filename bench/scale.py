"""What a step, an evaluation and a checkpoint cost as the world grows: DDP against FSDP2 on 1-8
ranks (gloo on loopback), measured, for the README's "At scale" section.

Each setting runs `DistTrainer` under `torchrun --standalone --nproc_per_node N` on random token
ids (seq 32, 2 rows a rank per step, so the compute stays small and the communication shows):
  - per optimizer step: every collective the process group ran during 2 profiled steps
    (torch.profiler's `gloo:*` events: DDP's bucket all-reduces, FSDP2's all-gathers and
    reduce-scatters, the loop's own all-reduce, clipping's), counted and summed in bytes;
  - evaluation of 1,067 rows: the same, around `trainer.evaluate` (the metric gather, and under
    FSDP2 each batch's weight all-gathers);
  - one checkpoint: wall time (slowest rank, from a barrier) and the bytes each rank wrote.

    python bench/scale.py                                   # tiny BERT on 1 2 4 8 ranks (~3 min)
    python bench/scale.py --model bert-base --worlds 2 4    # BERT-base-sized (~5 min, ~10 GB RAM)
    python bench/scale.py --report DIR [DIR ...]            # the table of earlier runs again

Bytes are the tensors through each collective (an all-gather's gathered output, an all-reduce's
buffer), counted at 4 bytes an element. On gloo FSDP2's reduce-scatters run as all-reduces.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

MODELS = {"tiny": {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 64},
          "bert-base": {}}  # BertConfig's defaults are BERT-base's
EVAL_ROWS, SEQ = 1067, 32


def collectives(prof) -> dict[str, list[int]]:
    """{collective: [calls, bytes]} from a profile's gloo/nccl events (their first input's size)."""
    found: dict[str, list[int]] = {}
    for event in prof.events():
        backend, _, op = event.name.partition(":")
        if backend not in ("gloo", "nccl") or not op:
            continue
        shape = event.input_shapes[0] if event.input_shapes and event.input_shapes[0] else []
        elements = 1
        for size in shape:
            elements *= size
        entry = found.setdefault(op, [0, 0])
        entry[0] += 1
        entry[1] += elements * 4  # fp32 tensors and float64/int64 flags: bytes are approximate
    return found


def worker(args: argparse.Namespace) -> None:
    from torch.profiler import ProfilerActivity, profile
    from transformers import BertConfig, BertForSequenceClassification

    from nlptrain import Callback, DistTrainer, TrainConfig, distributed
    from nlptrain.checkpoint import save_checkpoint
    from nlptrain.data import TokenizedDataset

    dist = distributed.from_env(600)
    generator = torch.Generator().manual_seed(0)

    def random_rows(n: int) -> TokenizedDataset:
        ids = torch.randint(1000, 30000, (n * SEQ,), generator=generator).numpy().astype("int32")
        offsets = (torch.arange(n + 1) * SEQ).numpy()
        return TokenizedDataset(ids, offsets, torch.randint(0, 2, (n,), generator=generator).numpy())

    train, test = random_rows(2 * dist.world_size * 6), random_rows(EVAL_ROWS)
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=2, **MODELS[args.model]))
    profiled: dict[str, dict] = {}

    class ProfileSteps(Callback):  # steps 3 and 4: after the first steps' one-time work
        def on_step_end(self, trainer) -> None:
            if trainer.global_step == 2:
                self.prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
                self.prof.__enter__()
            elif trainer.global_step == 4:
                self.prof.__exit__(None, None, None)
                profiled["step"] = {k: [v[0] / 2, v[1] / 2] for k, v in collectives(self.prof).items()}
                trainer.should_stop = True

    # The collectives as between hosts: gloo's, not one host's shared-memory sums.
    config = TrainConfig(epochs=1, batch_size=2, lr=1e-4, strategy=args.strategy, precision="fp32",
                         eval_batch_size=64, warmup_ratio=0.0, timeout=600,
                         shared_memory_all_reduce=False)
    trainer = DistTrainer(model, train, None, config=config, callbacks=[ProfileSteps()], dist=dist)
    trainer.fit()
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        metrics = trainer.evaluate(test)
    profiled["eval"] = collectives(prof)
    shared = Path(args.out).with_suffix("")  # every rank writes into the same folder
    dist.barrier()
    start = time.perf_counter()
    save_checkpoint(trainer, shared / "checkpoint")
    dist.barrier()
    write_s = time.perf_counter() - start
    files = [p for p in (shared / "checkpoint").rglob("*") if p.is_file()]
    own = [p for p in files if p.name.endswith(".distcp") and p.name.startswith(f"__{dist.rank}_")]
    if dist.is_main:  # rank 0 writes the rest: whole weights (DDP), state.pt, metadata
        own += [p for p in files if not p.name.endswith(".distcp")]
    mine = {"rank": dist.rank, "write_s": write_s, "wrote_bytes": sum(p.stat().st_size for p in own),
            **profiled, "rows": metrics["rows"], "kind": type(trainer.strategy).__name__}
    everyone = dist.gather_objects(mine)
    trainer.close()
    if dist.is_main:
        Path(args.out).write_text(json.dumps({"world": dist.world_size, "strategy": args.strategy,
                                              "model": args.model, "ranks": everyone}))
    dist.close()


def run_one(world: int, strategy: str, args: argparse.Namespace, out: Path) -> dict:
    result = out / f"{args.model}-{strategy}-{world}.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               f"--nproc_per_node={world}", __file__, "worker", "--strategy", strategy,
               "--model", args.model, "--out", str(result)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{strategy} on {world} ranks failed:\n{done.stderr[-3000:]}")
    return json.loads(result.read_text())


def describe(ops: dict[str, list[float]]) -> tuple[str, float]:
    calls = ", ".join(f"{v[0]:g} {k}" for k, v in sorted(ops.items()))
    return calls or "none", sum(v[1] for v in ops.values())


def table(results: list[dict]) -> str:
    lines = ["| model | strategy | ranks | collectives per step | MB per rank per step | "
             "eval: collectives | eval KB per rank | checkpoint s | MB written by each rank |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        first = r["ranks"][0]
        step, step_bytes = describe(first.get("step", {}))
        evals, eval_bytes = describe(first["eval"])
        written = [round(x["wrote_bytes"] / 2**20, 1) for x in r["ranks"]]  # in rank order
        lines.append(f"| {r['model']} | {first['kind']} | {r['world']} | {step} | "
                     f"{step_bytes / 2**20:.2f} | {evals} | {eval_bytes / 2**10:,.0f} | "
                     f"{max(x['write_s'] for x in r['ranks']):.2f} | "
                     f"{' / '.join(f'{w:g}' for w in written)} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="compare", choices=["compare", "worker"])
    parser.add_argument("--model", default="tiny", choices=list(MODELS))
    parser.add_argument("--worlds", nargs="+", type=int, default=[1, 2, 4, 8])
    parser.add_argument("--strategies", nargs="+", default=["ddp", "fsdp"])
    parser.add_argument("--strategy", default="ddp")
    parser.add_argument("--out", default="")
    parser.add_argument("--report", nargs="+", type=Path, help="print the table of earlier runs")
    args = parser.parse_args()
    if args.mode == "worker":
        worker(args)
        return
    if args.report:
        found = [json.loads(f.read_text()) for d in args.report for f in sorted(d.glob("*.json"))]
        print(table(sorted(found, key=lambda r: (r["model"] != "tiny", r["world"], r["strategy"]))))
        return
    out = Path(args.out or tempfile.mkdtemp(prefix="scale-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {platform.processor() or platform.machine()} ({common.cpu_model()}), "
          f"{os.cpu_count()} cores; 1 thread a rank; results in {out}", flush=True)
    results = []
    for world in args.worlds:
        for strategy in args.strategies:
            if strategy == "fsdp" and world == 1:
                continue  # one process: nothing to shard (it runs as a single device)
            results.append(run_one(world, strategy, args, out))
            print(f"  {strategy} x {world}: done", flush=True)
    print()
    print(table(results))


if __name__ == "__main__":
    main()
