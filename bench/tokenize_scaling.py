"""Cold start of the data on 1 and N ranks of this machine: `build_datasets` on SST-2 (train
67,349 rows, dev, test) with an empty token cache, as `nlptrain train --task sst2` runs it.

Each rank count is a fresh job of real processes (nlptrain's launcher, gloo on loopback, one
thread each). A rank's time runs from the moment every rank is up (a barrier) until its sets are
mapped from the cache; the table shows the slowest rank's. With N ranks, each tokenizes 1/N of
each file and the first joins the parts (nlptrain/data/shared_tokenize.py); with 1 rank, it does
all of it, which is also what every rank waited for before the work was shared.

    python bench/tokenize_scaling.py [--ranks 1 2] [--task sst2] [--collective-timeout 2]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))
import common  # noqa: E402


def job(task_name: str, data_dir: str, cache: str, timeout: float) -> dict:
    import torch

    from nlptrain import distributed
    from nlptrain.data import build_datasets
    from nlptrain.models import load_tokenizer
    from nlptrain.task_files import load_task

    torch.set_num_threads(1)
    task = load_task(BENCH.parent / "tasks" / f"{task_name}.toml")
    task.data_dir, task.data.cache_dir = data_dir, cache
    tokenizer = load_tokenizer(task.model.name)
    dist = distributed.from_env(timeout)
    dist.barrier()
    start = time.perf_counter()
    sets = build_datasets(task, tokenizer, dist)
    seconds = time.perf_counter() - start
    rows = sum(len(s) for s in (sets.train, sets.valid, sets.test) if s is not None)
    dist.close()
    return {"seconds": seconds, "rows": rows}


def main() -> None:
    from nlptrain.launch import launch

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--task", default="sst2")
    parser.add_argument("--data-dir", default=str(common.default_data_dir()))
    parser.add_argument("--collective-timeout", type=float, default=600,
                        help="the ranks' --timeout (2 shows that no rank waits in a collective)")
    args = parser.parse_args()
    unusable = common.check_data_dir(args.data_dir, *common.task_folders(args.task))
    if unusable:
        sys.exit(unusable)
    os.environ.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    print(f"CPU: {common.cpu_model()}, {os.cpu_count()} cores; task {args.task}; "
          f"collective timeout {args.collective_timeout:g} s")
    results = {}
    for ranks in args.ranks:
        with tempfile.TemporaryDirectory(prefix="token-cache-") as cache:
            found = launch(job, ranks, args.task, args.data_dir, cache, args.collective_timeout)
        results[ranks] = max(r["seconds"] for r in found), found[0]["rows"]
        print(f"  {ranks} rank(s): {results[ranks][0]:.2f} s", flush=True)
    base = results[args.ranks[0]][0]
    print(f"\n| ranks | cold build_datasets s (slowest rank) | rows | rows/s | vs {args.ranks[0]} rank(s) |")
    print("|---|---|---|---|---|")
    for ranks, (seconds, rows) in results.items():
        print(f"| {ranks} | {seconds:.2f} | {rows} | {rows / seconds:,.0f} | {base / seconds:.2f}x |")


if __name__ == "__main__":
    main()
