"""Run the contenders side by side, interleaved (a b c d e a b c d e ...), and print one table.

    python bench/run.py --quick              # 1,024 training rows, median of 3 rounds (minutes)
    python bench/run.py                      # the full epoch (9,595 rows), once per contender
    python bench/run.py --smoke              # 64 rows, 1 round: checks that everything runs
    python bench/run.py --report DIR         # print the table of an earlier run again

Each contender is launched as `torchrun --standalone --nproc_per_node N bench/<script>.py` with
OMP_NUM_THREADS = cores // N per rank, and writes one JSON per rank; see bench/README.md. One
untimed launch first (the first contender on 64 rows) warms the file cache and, on a VM whose
host takes back the memory a guest frees, the pages: else the first timed launch alone pays
for them (its first step 1.5 s against 0.7-1.0, bench/README.md).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from contenders import CONTENDERS, DEFAULT_CONTENDERS, Contender, checkout_at, contender  # noqa: E402
from table import meta_text, summarize  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="contenders: " + "; ".join(
                                    f"{c.key} = {c.label}" for c in CONTENDERS.values()))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true",
                      help=f"first {common.QUICK_ROWS} training rows, 3 rounds")
    mode.add_argument("--smoke", action="store_true", help="64 training rows, 1 round")
    mode.add_argument("--report", type=Path, nargs="+", metavar="DIR",
                      help="only print the table of the results in DIR (several: one table of "
                           "all their runs, e.g. the same job with other --seeds)")
    p.add_argument("--train-rows", type=int, help="training rows (0: all; overrides the mode)")
    p.add_argument("--rounds", type=int, help="rounds (default: 3 with --quick, else 1)")
    p.add_argument("--seeds", default=str(common.JOB["seed"]),
                   help="comma-separated training seeds; each round runs every contender once per "
                        "seed, and accuracy is the mean over seeds (one fine-tuning run varies "
                        "by about a point)")
    p.add_argument("--contenders", default=DEFAULT_CONTENDERS, help="comma-separated keys, run "
                   f"in this order each round (default {DEFAULT_CONTENDERS}; also: "
                   f"{', '.join(k for k in CONTENDERS if k not in DEFAULT_CONTENDERS.split(','))}; "
                   "K@REV: contender K run by nlptrain at git revision REV, e.g. e@HEAD~5)")
    p.add_argument("--nproc", type=int, default=2, help="processes per contender (torchrun)")
    p.add_argument("--cores", type=int, default=os.cpu_count() or 1,
                   help="CPU cores to share out; OMP_NUM_THREADS = cores // nproc per rank")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS per rank (overrides --cores)")
    p.add_argument("--precision", choices=["fp32", "bf16"],
                   help="force this precision on every contender (the GPU run uses bf16)")
    p.add_argument("--data-dir", type=Path, default=common.default_data_dir())
    p.add_argument("--results-dir", type=Path, help="default: bench/results/<mode>-<time>")
    p.add_argument("--timeout", type=float, help="seconds per launch (default 900 quick, 3600 full)")
    p.add_argument("--no-prime", action="store_true",
                   help="skip the untimed launch (the first contender on 64 rows) before round 1")
    return p.parse_args(argv)


# -- launching -----------------------------------------------------------------------------------

def kill_group(proc: subprocess.Popen) -> None:
    """End the launch we started (torchrun and its workers share its session)."""
    for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            continue


def launch(c: Contender, root: Path, out: Path, opts: argparse.Namespace, log: Path,
           seed: int) -> dict[str, Any]:
    """One torchrun of contender `c`, its script and nlptrain taken from the checkout `root`."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           f"--nproc_per_node={opts.nproc}", str(root / "bench" / c.script),
           "--out", str(out), "--train-rows", str(opts.train_rows),
           "--data-dir", str(opts.data_dir), "--seed", str(seed)]
    own = c.args[:c.args.index("--")] if "--" in c.args else c.args  # then: nlptrain's options
    cmd += [*own, *(["--precision", opts.precision] if opts.precision else []),
            *c.args[len(own):]]
    env = {**os.environ, "OMP_NUM_THREADS": str(opts.threads),
           "MKL_NUM_THREADS": str(opts.threads), "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if c.rev:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root / "site"),
                                                          env.get("PYTHONPATH")]))
    files = [Path(f"{out}.rank{r}.json") for r in range(opts.nproc)]
    start = time.perf_counter()
    hung = False
    with open(log, "w") as handle:
        handle.write(" ".join(cmd) + "\n")
        handle.flush()
        proc = subprocess.Popen(cmd, stdout=handle, stderr=subprocess.STDOUT, env=env,
                                cwd=root, start_new_session=True)
        done_at = None
        while proc.poll() is None:
            time.sleep(0.5)
            now = time.perf_counter()
            if done_at is None and all(f.exists() for f in files):
                done_at = now
            if done_at is not None and now - done_at > 120:  # results written, exit hangs
                hung = True
                kill_group(proc)
            elif now - start > opts.timeout:
                kill_group(proc)
                break
    wall = time.perf_counter() - start
    record: dict[str, Any] = {"key": c.key, "rc": proc.returncode, "wall_s": wall,
                              "exit_hang": hung, "log": str(log), "cmd": cmd}
    if all(f.exists() for f in files):
        ranks = [json.loads(f.read_text()) for f in files]
        record.update(ranks[0])
        record["key"] = c.key
        record["rss_mb"] = [r["peak_rss_mb"] for r in ranks]
        record["samples_per_s"] = record["train_rows"] / record["loop_s"]
        record["ok"] = True
    else:
        record["ok"] = False
        record["error"] = tail(log)
    return record


def tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def machine_meta(opts: argparse.Namespace, contenders: list[str]) -> dict:
    import torch
    import transformers

    cpu = common.cpu_model()
    try:  # bf16 autocast on CPU is fast only with AMX (avx512_bf16 alone is not enough)
        cpu += (f" (avx512_bf16 {torch.cpu._is_avx512_bf16_supported()}, "
                f"amx {torch.cpu._is_amx_tile_supported()})")
    except AttributeError:
        pass
    if torch.cuda.is_available():
        cpu += f" + {torch.cuda.get_device_name(0)}"
    return {"train_rows": opts.train_rows, "rounds": opts.rounds, "nproc": opts.nproc,
            "threads": opts.threads, "contenders": contenders, "cpu": f"{cpu}, "
            f"{os.cpu_count()} cores", "torch": torch.__version__,
            "transformers": transformers.__version__,
            "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg()),
            "results_dir": str(opts.results_dir), "precision": opts.precision,
            "seeds": opts.seeds}


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(argv)
    if opts.report:
        saved = [json.loads((folder / "records.json").read_text()) for folder in opts.report]
        # Every folder's contenders, in the order first met (a later folder may add some).
        contenders = list(dict.fromkeys(k for run in saved for k in run["meta"]["contenders"]))
        meta = {**saved[0]["meta"], "contenders": contenders,
                "seeds": sorted({r.get("seed", common.JOB["seed"])
                                 for run in saved for r in run["records"]})}
        print(summarize([r for run in saved for r in run["records"]], meta)[0])
        return 0
    mode = "quick" if opts.quick else "smoke" if opts.smoke else "full"
    if opts.train_rows is None:
        opts.train_rows = {"quick": common.QUICK_ROWS, "smoke": 64, "full": 0}[mode]
    opts.rounds = opts.rounds or (3 if mode == "quick" else 1)
    opts.threads = opts.threads or max(1, opts.cores // opts.nproc)
    opts.data_dir = opts.data_dir.resolve()
    unusable = common.check_data_dir(opts.data_dir, "rt-polarity")
    if unusable:
        print(unusable, file=sys.stderr)
        return 2
    opts.timeout = opts.timeout or (3600 if mode == "full" and not opts.train_rows else 900)
    opts.results_dir = (opts.results_dir or (  # absolute: a K@REV contender runs elsewhere
        common.BENCH_DIR / "results" / f"{mode}-{time.strftime('%Y%m%d-%H%M%S')}")).resolve()
    contenders = [k.strip() for k in opts.contenders.split(",") if k.strip()]
    opts.seeds = [int(s) for s in opts.seeds.split(",") if s.strip()]
    unknown = [k for k in contenders if k.partition("@")[0] not in CONTENDERS]
    if unknown:
        print(f"unknown contender(s) {unknown}; known: {', '.join(CONTENDERS)} (K@REV: K at git "
              "revision REV)", file=sys.stderr)
        return 2
    # Each revision made (and checked) once, before the first round: no install inside a timing.
    roots = {rev: checkout_at(rev) if rev else common.REPO
             for rev in {contender(k).rev for k in contenders}}
    (opts.results_dir / "logs").mkdir(parents=True, exist_ok=True)
    (opts.results_dir / "raw").mkdir(exist_ok=True)
    meta = machine_meta(opts, contenders)
    print(meta_text(meta), flush=True)
    if not opts.no_prime:  # the first timed launch then meets the machine as every later one does
        first = contender(contenders[0])
        primed = launch(first, roots[first.rev], opts.results_dir / "raw" / "prime",
                        argparse.Namespace(**{**vars(opts), "train_rows": 64}),
                        opts.results_dir / "logs" / "prime.log", opts.seeds[0])
        print(f"primed: ({first.key}) on 64 rows, untimed [wall {primed['wall_s']:.0f} s]",
              flush=True)
    records: list[dict] = []
    for rnd, seed, key in itertools.product(range(opts.rounds), opts.seeds, contenders):
        name = f"r{rnd + 1}-s{seed}-{key}"
        load = os.getloadavg()[0]
        c = contender(key)
        rec = launch(c, roots[c.rev], opts.results_dir / "raw" / name, opts,
                     opts.results_dir / "logs" / f"{name}.log", seed)
        rec.update(round=rnd, seed=seed, loadavg_before=load)
        records.append(rec)
        status = (f"{rec['samples_per_s']:.2f} samples/s, eval {rec['eval_s']:.1f} s, "
                  f"acc {rec['accuracy']:.4f}" if rec["ok"] else
                  f"FAILED (rc {rec['rc']}), see {rec['log']}")
        print(f"round {rnd + 1}/{opts.rounds} seed {seed} ({key}) {status}  "
              f"[wall {rec['wall_s']:.0f} s, load {load:.2f}]", flush=True)
        (opts.results_dir / "records.json").write_text(
            json.dumps({"meta": meta, "records": records}, indent=1, default=str))
    text, summary = summarize(records, meta)
    (opts.results_dir / "table.md").write_text(text + "\n")
    (opts.results_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    print("\n" + text)
    print(f"\nresults: {opts.results_dir}")
    return 0 if all(r["ok"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
