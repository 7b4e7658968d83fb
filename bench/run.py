"""Run the contenders side by side, interleaved (a b c d e a b c d e ...), and print one table.

    python bench/run.py --quick              # 1,024 training rows, median of 3 rounds (minutes)
    python bench/run.py                      # the full epoch (9,595 rows), once per contender
    python bench/run.py --smoke              # 64 rows, 1 round: checks that everything runs
    python bench/run.py --report DIR         # print the table of an earlier run again

Each contender is launched as `torchrun --standalone --nproc_per_node N bench/<script>.py` with
OMP_NUM_THREADS = cores // N per rank, and writes one JSON per rank; see bench/README.md.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402
from contenders import CONTENDERS, DEFAULT_CONTENDERS, Contender, checkout_at, contender  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0],
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
                   f"in this order each round (default {DEFAULT_CONTENDERS}; also: b0, e0, f, g, h, i, j; "
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


# -- the table ------------------------------------------------------------------------------------

def median(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def ratio(records: list[dict], key: str, base: str, field: str) -> float | None:
    """Median over rounds of (key's field / base's field) in the same round and seed: machine
    noise that hits a whole round cancels."""
    by_round: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if r["ok"]:
            by_round.setdefault((r["round"], r.get("seed")), {})[r["key"]] = r
    found = [runs[key][field] / runs[base][field] for runs in by_round.values()
             if key in runs and base in runs and runs[base][field]]
    return median(found)


def phase_medians(runs: list[dict]) -> dict[str, float]:
    names = [n for n in (runs[0] if runs else {})]
    return {n: median([r[n] for r in runs if n in r]) for n in names}


def mean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def fmt(value: Any, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def summarize(records: list[dict], meta: dict) -> tuple[str, dict]:
    keys = [k for k in meta["contenders"] if any(r["key"] == k for r in records)]
    rows, summary = [], {}
    base = "a" if any(r["key"] == "a" and r["ok"] for r in records) else None
    acc_a = mean([r["accuracy"] for r in records if r["key"] == "a" and r["ok"]])
    ok_runs = {k: [r for r in records if r["key"] == k and r["ok"]] for k in keys}
    for k in keys:
        runs = [r for r in records if r["key"] == k]
        ok = ok_runs[k]
        s = {"label": contender(k).label, "runs": len(runs), "ok": len(ok),
             "samples_per_s": median([r["samples_per_s"] for r in ok]),
             "eval_s": median([r["eval_s"] for r in ok]),
             "accuracy": mean([r["accuracy"] for r in ok]),
             "accuracies": sorted({round(r["accuracy"], 4) for r in ok}),
             "correct_rows": sorted({f"{r['correct']}/{r['rows']}" for r in ok}),
             "rss_mb": [max(r["rss_mb"][i] for r in ok) for i in range(len(ok[0]["rss_mb"]))]
             if ok else [],
             "loop_s": median([r["loop_s"] for r in ok]),
             "wall_s": median([r["wall_s"] for r in ok]),
             "x_a": ratio(records, k, base, "samples_per_s") if base else None,
             "eval_x_a": ratio(records, k, base, "eval_s") if base else None,
             "all_samples_per_s": [round(r["samples_per_s"], 2) for r in ok],
             "exit_hangs": sum(r["exit_hang"] for r in runs),
             "failed": [r.get("error", "")[-400:] for r in runs if not r["ok"]],
             "settings": ok[0].get("settings") if ok else None,
             "precision": ok[0].get("precision") if ok else None,
             "precision_chosen": ok[0].get("precision_chosen") if ok else None,
             "compute_dtype": sorted({r.get("compute_dtype") or "?" for r in ok}),
             "phases_ms": phase_medians([r.get("phases_ms") or {} for r in ok])}
        if s["accuracy"] is not None and acc_a is not None:
            s["d_acc_pt"] = 100 * (s["accuracy"] - acc_a)
        summary[k] = s
        rss = " / ".join(f"{v:.0f}" for v in s["rss_mb"]) or "-"
        rows.append([f"({k})", s["label"], fmt(s["samples_per_s"]), fmt(s["x_a"], ".2f"),
                     fmt(s["eval_s"], ".1f"), fmt(s["eval_x_a"], ".2f"),
                     fmt(s["accuracy"], ".4f") + (
                         f" ({min(s['accuracies']):.4f}-{max(s['accuracies']):.4f})"
                         if len(s["accuracies"]) > 1 else ""),
                     ",".join(s["correct_rows"]) if len(ok_runs[k]) == 1 else
                     f"{len(ok_runs[k])} runs",
                     fmt(s.get("d_acc_pt"), "+.2f"), rss, fmt(s["loop_s"], ".1f"),
                     fmt(s["wall_s"], ".0f") + (f" ({s['ok']}/{s['runs']} ok)"
                                                if s["ok"] < s["runs"] else "")])
    head = ["", "contender", "train samples/s", "x(a)", "eval s", "x(a)", "accuracy",
            "correct/rows", "dacc pt", "peak RSS MB r0/r1..", "loop s", "wall s"]
    widths = [max(len(str(x)) for x in col) for col in zip(head, *rows, strict=True)]

    def line(cells: list) -> str:
        return "| " + " | ".join(str(c).ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    out = [meta_text(meta), "", line(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [line(r) for r in rows]
    out += ["", "samples/s = training rows of the epoch / loop seconds on rank 0 (first step start "
            "to last step end); x(a) = median over rounds of the same-round ratio to (a); "
            "accuracy = mean over runs (range over seeds in brackets)."]
    if meta["rounds"] > 1:
        out += ["per-round samples/s: " + "; ".join(
            f"({k}) {summary[k]['all_samples_per_s']}" for k in keys)]
    out += ["median ms per step, rank 0 (approximate): " + "; ".join(
        f"({k}) " + ", ".join(f"{n} {v:g}" for n, v in summary[k]["phases_ms"].items())
        for k in keys if summary[k].get("phases_ms"))]
    if any(summary[k]["compute_dtype"] != ["?"] for k in keys):  # older results lack it
        out += ["matmuls computed in (first Linear's output in training): " + "; ".join(
            f"({k}) {'/'.join(summary[k]['compute_dtype'])}" for k in keys)]
    out += ["", targets_text(summary, records, meta)]
    for k in keys:
        if summary[k]["failed"] or summary[k]["exit_hangs"]:
            out += [f"({k}): {len(summary[k]['failed'])} failed launch(es), "
                    f"{summary[k]['exit_hangs']} exit hang(s); logs under {meta['results_dir']}/logs"]
    return "\n".join(out), summary


def meta_text(meta: dict) -> str:
    rows = meta["train_rows"] or "all (9,595)"
    return (f"nlptrain bench: rt-polarity, {rows} training rows, test 1,067 rows, 1 epoch, "
            f"batch 16/rank, lr 2e-5, max length 128 | {meta['nproc']} rank(s) x "
            f"{meta['threads']} thread(s) | {meta['rounds']} round(s) x seed(s) "
            f"{meta.get('seeds', [common.JOB['seed']])}, order "
            f"{' '.join(meta['contenders'])} | {meta['cpu']} | torch {meta['torch']}, "
            f"transformers {meta['transformers']} | load avg at start {meta['loadavg']}")


def targets_text(s: dict, records: list[dict], meta: dict) -> str:
    full = not meta["train_rows"]
    lines = ["targets (issue 6):"]

    def check(name: str, value: float | None, goal: str, ok: bool | None, note: str = "") -> None:
        verdict = "n/a " if value is None or ok is None else ("PASS" if ok else "FAIL")
        lines.append(f"  [{verdict}] {name}: {fmt(value, '.3f')} (target {goal}){note}")

    def get(key: str, field: str) -> Any:
        return s.get(key, {}).get(field)

    acc_note = "" if full else (f"  (accuracy after {meta['train_rows']} training rows only "
                                "indicates; judge it on a full run)")
    for k, goal in (("c", 0.97), ("d", 2.5)):
        v = get(k, "x_a")
        check(f"({k})/(a) train samples/s", v, f">= {goal}", None if v is None else v >= goal)
    v = ratio(records, "d", "b", "samples_per_s")
    check("(d)/(b) train samples/s", v, ">= 1.3", None if v is None else v >= 1.3)
    v = get("d", "d_acc_pt")
    check("(d) accuracy - (a) accuracy, points", v, ">= -0.5", None if v is None else v >= -0.5,
          acc_note)
    v = ratio(records, "e", "d", "samples_per_s")
    check("bf16 (e) / fp32 (d) train samples/s", v, ">= 1.6", None if v is None else v >= 1.6)
    acc_e, acc_d = get("e", "accuracy"), get("d", "accuracy")
    v = None if acc_e is None or acc_d is None else 100 * (acc_e - acc_d)
    check("bf16 (e) accuracy - fp32 (d), points", v, "within 0.5",
          None if v is None else abs(v) <= 0.5, acc_note)
    lines.append("targets (issue 12):")
    forced, chosen = meta.get("precision"), get("g", "precision_chosen")
    if forced:  # every contender in one precision: the loops alone are compared
        want = {"bf16": "bfloat16", "fp32": "float32"}[forced]
        for k in ("b", "d"):
            seen = get(k, "compute_dtype")
            if seen not in (None, ["?"], [want]):  # "?": a result from before it was recorded
                lines.append(f"  [FAIL] ({k}) asked for {forced} computed in {'/'.join(seen)}: "
                             "not the same precision")
        v = ratio(records, "d", "b", "samples_per_s")
        check(f"every contender {forced}: (d) / (b) train samples/s", v, ">= 1.1",
              None if v is None else v >= 1.1)
    else:
        v = ratio(records, "g", "b", "samples_per_s")
        check(f"defaults, auto chose {chosen or '?'}: (g) / Trainer (b) train samples/s", v,
              ">= 1.7 where auto picks bf16", None if v is None or chosen != "bf16" else v >= 1.7)
        v = ratio(records, "g", "f", "samples_per_s")
        check("auto (g) / fp32 (f) train samples/s", v, ">= 0.97: never slower than fp32",
              None if v is None else v >= 0.97)
    for before in ["e0", *(k for k in s if k.startswith("e@"))]:  # (e) as it was
        v = ratio(records, "e", before, "samples_per_s")
        check(f"bf16 (e) / ({before}) train samples/s", v, ">= 1.3", None if v is None else v >= 1.3)
    lines.append("  eval 2 ranks / 1 process: python bench/eval_scaling.py; launch to first step "
                 "warm/cold cache: python bench/startup.py")
    return "\n".join(lines)


def machine_meta(opts: argparse.Namespace, contenders: list[str]) -> dict:
    import torch
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
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
        meta = {**saved[0]["meta"], "seeds": sorted({r.get("seed", common.JOB["seed"])
                                                     for run in saved for r in run["records"]})}
        print(summarize([r for run in saved for r in run["records"]], meta)[0])
        return 0
    mode = "quick" if opts.quick else "smoke" if opts.smoke else "full"
    if opts.train_rows is None:
        opts.train_rows = {"quick": common.QUICK_ROWS, "smoke": 64, "full": 0}[mode]
    opts.rounds = opts.rounds or (3 if mode == "quick" else 1)
    opts.threads = opts.threads or max(1, opts.cores // opts.nproc)
    opts.data_dir = opts.data_dir.resolve()
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
