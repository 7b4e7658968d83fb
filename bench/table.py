"""bench/run.py's table: medians over rounds, same-round ratios between contenders, the targets
each ratio is checked against, and the machine it ran on."""

from __future__ import annotations

import statistics
from typing import Any

import common
from contenders import contender


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
             "phases_ms": phase_medians([r.get("phases_ms") or {} for r in ok]),
             "first_step": {key: median([r[key] for r in ok if r.get(key) is not None])
                            for key in ("first_step_s", "first_step_sys_s", "first_step_faults")}}
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
    firsts = [f"({k}) {fmt(first['first_step_s'])} s" + (
        f", {first['first_step_sys_s']:.2f} s of it in the kernel, "
        f"{first['first_step_faults']:,.0f} page faults" if first["first_step_faults"] is not None
        else "") for k in keys if (first := summary[k]["first_step"])["first_step_s"] is not None]
    if firsts:  # in loop s; the kernel zeroing the pages the step touches first (bench/README.md)
        out += ["first step, rank 0, median: " + "; ".join(firsts)]
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
