"""DDP's gradient sync on a CPU: a bf16 MiniLM step on 2 ranks x 1 thread, with each way of
summing the gradients that nlptrain has, side by side in the same run.

  - gloo: DDP's own bucket all-reduce over loopback sockets;
  - gloo + touched rows: the word embedding's untouched rows left out (`sync_touched_rows`);
  - shared memory: every gradient summed through /dev/shm (`shared_memory_all_reduce`);
  - shared memory + touched rows: both (nlptrain's default where every rank is on one host);
  - no sync: a comm hook that sends nothing (wrong weights; the floor DDP's step can reach).

Each rank trains the same model on its own random token ids (batch 16 x --seq, so a batch
touches a few hundred embedding rows, as real text does); the settings take turns for --rounds
rounds; per setting the median step (forward, backward with the sync, fused AdamW) over the
rounds' steps after the first 3 of each round, and the time spent inside the comm hook.

    python bench/gradient_sync.py [--nproc 2] [--seq 32] [--steps 12] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import common  # noqa: E402

# name: (touched rows, shared memory); None: a hook that sends nothing
SETTINGS = {"gloo": (False, False), "gloo + touched rows": (True, False),
            "shared memory": (False, True), "shared memory + touched rows": (True, True),
            "no sync (floor)": None}


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from nlptrain import host_memory
    from nlptrain.cpu_gradient_sync import CpuGradientSync, register_cpu_gradient_sync
    from nlptrain.models import load_model
    from nlptrain.precision import autocast

    torch.set_num_threads(1)
    host_memory.keep_freed_memory()  # as nlptrain's CPU runs
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ids = torch.Generator().manual_seed(rank)
    times: dict[str, list[float]] = {name: [] for name in SETTINGS}
    in_hook: dict[str, list[float]] = {name: [] for name in SETTINGS}
    for _ in range(args.rounds):
        for name, levers in SETTINGS.items():
            torch.manual_seed(0)
            model = load_model("minilm", ["a", "b"])
            model.train()
            ddp = DistributedDataParallel(model, gradient_as_bucket_view=True)
            spent = [0.0]
            if levers is None:
                ddp.register_comm_hook(None, _send_nothing)
            else:
                hook = register_cpu_gradient_sync(ddp, *levers)
                if hook is not None:
                    _time_hook(hook, spent, CpuGradientSync)
            optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, fused=True)
            for step in range(args.steps):
                batch = {"input_ids": torch.randint(1000, 20000, (16, args.seq), generator=ids),
                         "attention_mask": torch.ones(16, args.seq, dtype=torch.long),
                         "labels": torch.randint(0, 2, (16,), generator=ids)}
                dist.barrier()
                spent[0], start = 0.0, time.perf_counter()
                with autocast(torch.device("cpu"), "bf16"):
                    loss = ddp(**batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=False)
                if step >= 3:  # after the first steps' allocations and DDP's bucket rebuild
                    times[name].append(time.perf_counter() - start)
                    in_hook[name].append(spent[0])
            del ddp, model, optimizer
    if rank == 0:
        result = {name: {"step_ms": 1000 * statistics.median(times[name]),
                         "hook_ms": 1000 * statistics.median(in_hook[name])} for name in SETTINGS}
        Path(args.out).write_text(json.dumps(result))
    dist.destroy_process_group()


def _send_nothing(_, bucket):
    import torch

    done = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def _time_hook(hook, spent: list[float], cls) -> None:
    """Add the seconds spent in `hook`'s calls to spent[0] (the instance's own __call__)."""
    call = cls.__call__

    class Timed(cls):
        def __call__(self, bucket):
            start = time.perf_counter()
            try:
                return call(self, bucket)
            finally:
                spent[0] += time.perf_counter() - start

    hook.__class__ = Timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--seq", type=int, default=32)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"gradient-sync-{os.getpid()}.json"
    print(f"CPU: {common.cpu_model()}; {args.nproc} ranks x 1 thread, gloo; MiniLM-L6 bf16, "
          f"batch 16 x {args.seq} a rank; {args.rounds} rounds x {args.steps} steps", flush=True)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={args.nproc}", __file__, "--worker", "--out", str(out),
                    "--seq", str(args.seq), "--steps", str(args.steps),
                    "--rounds", str(args.rounds)],
                   check=True, env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    result = json.loads(out.read_text())
    out.unlink()
    base = result["gloo"]["step_ms"]
    print("\n| gradient sync | ms per step | in the comm hook, ms | gloo / this |")
    print("|---|---|---|---|")
    for name, row in result.items():
        print(f"| {name} | {row['step_ms']:.1f} | {row['hook_ms']:.1f} | {base / row['step_ms']:.2f} |")


if __name__ == "__main__":
    main()
