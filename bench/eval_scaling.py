"""Evaluation time on the 1,067 rt-polarity test rows: 2 ranks against 1 process.

Times nlptrain's distributed evaluation (`nlptrain.evaluate.predict`: disjoint shares, gather,
back in row order) of MiniLM, `--repeats` times in each setting after one untimed warm-up:
  1 process x 1 thread     the same per-process resources as one rank (the target's baseline)
  1 process x C threads    one process given the whole machine (shown for reference)
  2 ranks   x C/2 threads  torchrun --standalone --nproc_per_node 2
and checks the correct count is identical in all (exact distributed evaluation).

    python bench/eval_scaling.py [--padding dynamic|max_length] [--repeats 3]
Target (issue 6): 2 ranks <= 0.65 x the 1-process time.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def child(args: argparse.Namespace) -> None:
    import torch

    from nlptrain import cli, distributed, recipe
    from nlptrain.data import build_datasets
    from nlptrain.evaluate import compute_metrics, predict
    from nlptrain.models import load_model, load_tokenizer

    argv = ["train", "--task", "rt-polarity", "--data-dir", str(args.data_dir),
            "--max-length", str(common.JOB["max_length"]), "--valid-size", "0",
            "--padding", args.padding, "--set", f"data.cache_dir={args.cache_dir}"]
    task = cli.resolve_task(cli.build_parser().parse_args(argv))
    dist = distributed.from_env()
    try:
        tokenizer = load_tokenizer(task.model.name)
        sets = build_datasets(task, tokenizer, dist)
        torch.manual_seed(common.JOB["seed"])
        model = load_model(task.model.name, sets.vocab.names).to(dist.device)
        collate = recipe.collator(tokenizer, task)
        times, correct = [], None
        for i in range(args.repeats + 1):
            dist.barrier()
            start = time.perf_counter()
            found = predict(model, sets.test, dist, collate, common.JOB["eval_batch_size"],
                            args.precision)
            if i:  # the first pass is a warm-up
                times.append(time.perf_counter() - start)
            metrics = compute_metrics(found, sets.vocab.names)
            correct = (metrics["correct"], metrics["rows"])
        common.write_result(args.out, {"eval_s": times, "correct": correct[0], "rows": correct[1],
                                       "threads": torch.get_num_threads()})
    finally:
        dist.close()


def run(nproc: int, threads: int, out: Path, args: argparse.Namespace) -> dict:
    me = str(Path(__file__).resolve())
    child_args = ["--child", "--out", str(out), "--data-dir", str(args.data_dir),
                  "--cache-dir", str(args.cache_dir), "--padding", args.padding,
                  "--repeats", str(args.repeats), "--precision", args.precision]
    cmd = ([sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={nproc}", me] if nproc > 1 else [sys.executable, me]) + child_args
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    files = [Path(f"{out}.rank{r}.json") for r in range(nproc)]
    if not all(f.exists() for f in files):
        raise SystemExit(f"{' '.join(cmd)} failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
    ranks = [json.loads(f.read_text()) for f in files]
    # Each repeat ends with a gather, so all ranks finish together; take the slowest rank.
    per_repeat = [max(r["eval_s"][i] for r in ranks) for i in range(args.repeats)]
    return {"nproc": nproc, "threads": threads, "eval_s": per_repeat,
            "median_s": statistics.median(per_repeat), "correct": ranks[0]["correct"],
            "rows": ranks[0]["rows"], "rss_mb": [r["peak_rss_mb"] for r in ranks]}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--data-dir", type=Path, default=common.default_data_dir())
    p.add_argument("--cache-dir", type=Path, default=common.BENCH_DIR / ".cache" / "tokens")
    p.add_argument("--padding", choices=["dynamic", "max_length"], default="dynamic",
                   help="nlptrain's default (dynamic) or pad to 128 like the tutorial")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--repeats", type=int, default=3, help="timed passes per setting (median)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--results-dir", type=Path,
                   default=common.BENCH_DIR / "results" / f"eval-{time.strftime('%Y%m%d-%H%M%S')}")
    args = p.parse_args()
    if args.child:
        child(args)
        return 0
    unusable = common.check_data_dir(args.data_dir, "rt-polarity")
    if unusable:
        print(unusable, file=sys.stderr)
        return 2
    print(f"CPU: {common.cpu_model()}, {os.cpu_count()} cores", flush=True)
    args.results_dir.mkdir(parents=True, exist_ok=True)
    half = max(1, args.cores // 2)
    settings = [(1, 1), (1, args.cores), (2, half)] if args.cores > 1 else [(1, 1), (2, 1)]
    found = []
    for nproc, threads in settings:
        r = run(nproc, threads, args.results_dir / f"eval-{nproc}x{threads}", args)
        found.append(r)
        print(f"{nproc} process(es) x {threads} thread(s): {r['median_s']:.2f} s "
              f"(repeats {', '.join(f'{t:.2f}' for t in r['eval_s'])}), "
              f"{r['correct']}/{r['rows']} correct", flush=True)
    base = found[0]["median_s"]
    dist2 = found[-1]
    print(f"\neval of {dist2['rows']} rows, padding {args.padding}, {args.precision}:")
    print("| setting | eval s (median) | x(1 process x 1 thread) | correct/rows | peak RSS MB |")
    print("|---|---|---|---|---|")
    for r in found:
        print(f"| {r['nproc']} x {r['threads']} thread(s) | {r['median_s']:.2f} | "
              f"{r['median_s'] / base:.2f} | {r['correct']}/{r['rows']} | "
              f"{' / '.join(f'{m:.0f}' for m in r['rss_mb'])} |")
    exact = len({(r["correct"], r["rows"]) for r in found}) == 1
    ratio = dist2["median_s"] / base
    print(f"[{'PASS' if ratio <= 0.65 else 'FAIL'}] 2 ranks x {dist2['threads']} thread(s) / 1 "
          f"process x 1 thread: {ratio:.3f} (target <= 0.65)")
    if len(found) == 3:
        whole = dist2["median_s"] / found[1]["median_s"]
        print(f"[{'PASS' if whole <= 0.65 else 'FAIL'}] 2 ranks / 1 process using all "
              f"{args.cores} cores: {whole:.3f} (target <= 0.65)")
    print(f"[{'PASS' if exact else 'FAIL'}] same correct count in every setting (exact gather)")
    (args.results_dir / "eval_scaling.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
