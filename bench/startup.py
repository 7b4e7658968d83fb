"""Launch to first training step on SST-2 train (67,349 rows): cold token cache against warm.

Each measurement is a fresh process (`python`, or torchrun with --nproc 2) running what
`nlptrain train --task sst2 --max-length 128 --batch-size 16` runs, with a callback that notes
the time of the first `on_batch_start` and exits there. Launch time is taken in this parent just
before the process starts, so interpreter start and imports count. "cold": an empty temporary
cache_dir (the train, dev and test files are read and tokenized); "warm": the same cache_dir
again (memory-mapped token arrays); "warm, collector on": warm, with the libraries imported as
before nlptrain/startup.py (the cyclic collector running through the imports, nothing frozen).
One untimed launch first warms the OS file cache for Python, torch and the model, so every side
sees the same libraries in memory.

    python bench/startup.py [--runs 3] [--nproc 1]
Target (issue 6): warm <= 0.3 x cold.
"""

from __future__ import annotations

import time

T_PYTHON = time.time()  # before the heavy imports

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import shutil  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

COLLECTOR_ON = "warm, collector on"
KINDS = ("cold", "warm", COLLECTOR_ON)


def child(args: argparse.Namespace) -> None:
    launched = float(os.environ["BENCH_LAUNCH_TIME"])
    if not args.collector_on:  # as `nlptrain train` does before its imports
        from nlptrain.startup import import_libraries

        import_libraries()
    from nlptrain import Callback, cli, recipe

    imported = time.time()
    argv = ["train", "--task", "sst2", "--data-dir", str(args.data_dir),
            "--output-dir", f"{args.out}.run", "--overwrite", "--log-level", "warning",
            "--set", f"data.cache_dir={args.cache_dir}", "--epochs", "1",
            "--batch-size", str(common.JOB["batch_size"]), "--lr", str(common.JOB["lr"]),
            "--max-length", str(common.JOB["max_length"])]
    parsed = cli.build_parser().parse_args(argv)
    task = cli.resolve_task(parsed)

    class FirstStep(Callback):
        train_start = 0.0

        def on_train_start(self, trainer) -> None:
            self.train_start = time.time()

        def on_batch_start(self, trainer, batch) -> None:
            now = time.time()
            common.write_result(args.out, {
                "launch_to_first_step_s": now - launched,
                "python_start_s": T_PYTHON - launched,
                "imports_s": imported - T_PYTHON,
                "data_model_setup_s": self.train_start - imported,
                "train_start_to_first_step_s": now - self.train_start,
                "train_rows": len(trainer.train_data)})
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)  # every rank stops here, before any collective of the step

    opts = recipe.RunOptions(output_dir=f"{args.out}.run", overwrite=True, callbacks=[FirstStep()])
    with recipe.backend(task.train.timeout) as dist:
        cli.start_logging(parsed, dist.rank)
        recipe.train(task, opts, dist)
    raise SystemExit("training ended without a first step")


def launch(cache_dir: Path, out: Path, args: argparse.Namespace, collector_on: bool = False) -> dict:
    me = str(Path(__file__).resolve())
    child_args = ["--child", "--out", str(out), "--data-dir", str(args.data_dir),
                  "--cache-dir", str(cache_dir)] + (["--collector-on"] if collector_on else [])
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={args.nproc}", me] if args.nproc > 1 else [sys.executable, me])
    threads = max(1, args.cores // args.nproc)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1"}
    env["BENCH_LAUNCH_TIME"] = repr(time.time())
    proc = subprocess.run(cmd + child_args, env=env, capture_output=True, text=True,
                          timeout=args.timeout, cwd=common.REPO)
    shutil.rmtree(f"{out}.run", ignore_errors=True)
    path = Path(f"{out}.rank0.json")
    if not path.exists():
        raise SystemExit(f"{' '.join(cmd + child_args)} failed (rc {proc.returncode}):\n"
                         f"{proc.stderr[-3000:]}")
    return json.loads(path.read_text())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--cache-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--collector-on", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, default=common.default_data_dir())
    p.add_argument("--runs", type=int, default=3, help="cold/warm pairs (median of each)")
    p.add_argument("--nproc", type=int, default=1, help="1: python; >1: torchrun ranks")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--no-prime", action="store_true", help="skip the untimed first launch")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--results-dir", type=Path, default=common.BENCH_DIR / "results" /
                   f"startup-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    unusable = common.check_data_dir(args.data_dir, "sst-2")
    if unusable:
        print(unusable, file=sys.stderr)
        return 2
    print(f"CPU: {common.cpu_model()}, {os.cpu_count()} cores", flush=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="nlptrain-startup-"))
    try:
        if not args.no_prime:
            launch(scratch / "prime-cache", scratch / "prime", args)
            print("primed (untimed launch done)", flush=True)
        found: dict[str, list[dict]] = {kind: [] for kind in KINDS}
        for i in range(args.runs):
            cache = scratch / f"cache-{i}"  # new and empty: cold; then the same: warm
            for kind in KINDS:
                r = launch(cache, args.results_dir / f"{kind.replace(', ', '-')}-{i + 1}", args,
                           collector_on=kind == COLLECTOR_ON)
                found[kind].append(r)
                print(f"run {i + 1} {kind}: {r['launch_to_first_step_s']:.2f} s to the first step "
                      f"(python {r['python_start_s']:.2f}, imports {r['imports_s']:.2f}, data+model "
                      f"{r['data_model_setup_s']:.2f}, loader to step "
                      f"{r['train_start_to_first_step_s']:.2f})", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    med = {k: {f: statistics.median(r[f] for r in v) for f in v[0] if f.endswith("_s")}
           for k, v in found.items()}
    rows = found["cold"][0]["train_rows"]
    print(f"\nSST-2 train ({rows} rows), {args.nproc} process(es), launch to first training step, "
          f"median of {args.runs}:")
    print("| cache | launch->first step s | python start | imports | data+model setup | "
          "train start->first step |")
    print("|---|---|---|---|---|---|")
    for kind in KINDS:
        m = med[kind]
        print(f"| {kind} | {m['launch_to_first_step_s']:.2f} | {m['python_start_s']:.2f} | "
              f"{m['imports_s']:.2f} | {m['data_model_setup_s']:.2f} | "
              f"{m['train_start_to_first_step_s']:.2f} |")
    ratio = med["warm"]["launch_to_first_step_s"] / med["cold"]["launch_to_first_step_s"]
    print(f"[{'PASS' if ratio <= 0.3 else 'FAIL'}] warm / cold: {ratio:.3f} (target <= 0.3)")
    frozen = med[COLLECTOR_ON]["launch_to_first_step_s"] / med["warm"]["launch_to_first_step_s"]
    print(f"[info] warm, collector on / warm (the imports frozen, as nlptrain does): {frozen:.2f}x "
          f"({med[COLLECTOR_ON]['imports_s']:.2f} s vs {med['warm']['imports_s']:.2f} s of imports)")
    after = {k: med[k]["data_model_setup_s"] + med[k]["train_start_to_first_step_s"]
             for k in med}
    print(f"[info] after `import nlptrain...` (torch, transformers, sklearn): warm / cold "
          f"{after['warm'] / after['cold']:.3f}; the model class import inside data+model setup "
          "still counts (py-spy the child to split it further)")
    (args.results_dir / "startup.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
