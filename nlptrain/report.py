"""Human-readable summaries of metrics: `metrics_text` for the terminal, `write_report` for the
run directory's report.md (built from the run's own files, so it can be rebuilt any time)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from nlptrain.durable import write_text

REPORT_FILE = "report.md"
# The settings a reader needs to compare runs; every other key is in config.json.
SETTINGS = ("epochs", "max_steps", "batch_size", "grad_accum", "lr", "scale_lr", "scheduler", "warmup_ratio",
            "weight_decay", "max_grad_norm", "precision", "seed", "eval_every", "metric_for_best",
            "early_stopping")
PLOT_CAPTIONS = {"training.png": "Loss and learning rate per optimizer step",
                 "evaluation.png": "The task's scores at each evaluation",
                 "confusion_matrix.png": "Confusion matrix",
                 "label_f1.png": "F1 per label",
                 "scatter.png": "Predicted against true score"}


def processes(config: dict[str, Any]) -> tuple[int, str]:
    """The processes the run ends with, and as said: "2", or "1, then 2 (resumed)" where a
    resume ran with another count."""
    counts = [config.get("world_size", 1), *(r.get("world_size", 1) for r in config.get("resumes", []))]
    told = [n for i, n in enumerate(counts) if i == 0 or n != counts[i - 1]]
    return counts[-1], str(told[0]) if len(told) == 1 else f"{', then '.join(map(str, told))} (resumed)"


def train_settings(config: dict[str, Any]) -> dict[str, Any]:
    """config.json's [train] settings as they acted: the precision "auto" chose (recorded once
    the run started), the metric that picked the best model when left to the kind, max_steps
    only where it cut the run short."""
    from nlptrain.kinds import from_run_config

    train = dict(config.get("task", {}).get("train", {}))
    chosen = config.get("precision", {}).get("chosen")
    if chosen and train.get("precision") == "auto":
        train["precision"] = f"{chosen} (auto)"
    if "metric_for_best" in train and not train["metric_for_best"]:
        train["metric_for_best"] = f"{from_run_config(config).default_metric} (the kind's)"
    if not train.get("max_steps"):
        train.pop("max_steps", None)
    return train


def metrics_text(metrics: dict[str, Any]) -> str:
    """Every scalar metric, then (classification) per-class precision/recall/F1 and the
    confusion matrix, as text tables."""
    from nlptrain.scores import metric_label, scalar_metrics, shown_score

    scalars = "  ".join(f"{metric_label(k)} {shown_score(v)}"
                        for k, v in scalar_metrics(metrics).items())
    at = f"  (at threshold {metrics['threshold']:g})" if "threshold" in metrics else ""
    lines = [f"rows {metrics['rows']}  {scalars}{at}"]
    if not metrics.get("per_class"):
        return lines[0]
    names = list(metrics["per_class"])
    width = max(12, *(len(n) + 2 for n in names))
    lines += ["", f"{'class':<{width}}{'precision':>10}{'recall':>10}{'f1':>10}{'support':>10}"]
    for name, row in metrics["per_class"].items():
        lines.append(f"{name:<{width}}{row['precision']:>10.4f}{row['recall']:>10.4f}"
                     f"{row['f1']:>10.4f}{row['support']:>10d}")
    if metrics.get("confusion_matrix"):
        # Columns as wide as the longest name: cut names (entailmen, not_entai) read as others.
        column = max(10, *(len(n) + 2 for n in names))
        lines += ["", "confusion matrix (rows: true label, columns: predicted)",
                  " " * width + "".join(f"{n:>{column}}" for n in names)]
        for name, row in zip(names, metrics["confusion_matrix"], strict=True):
            lines.append(f"{name:<{width}}" + "".join(f"{v:>{column}d}" for v in row))
    return "\n".join(lines)


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(value: Any) -> str:
        text = f"{value:.4f}" if isinstance(value, float) else str(value)
        return text.replace("|", "\\|")

    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|",
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)]


def _setting(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)  # 5e-05, not 0.0001


def _read_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _results_section(results: dict[str, Any], evals: list[dict[str, Any]], eval_name: str,
                     kind: Any) -> tuple[list[str], dict[str, Any] | None, str]:
    """The best / last / test rows, and the metrics to detail per class (test, else valid)."""
    # Without a validation set the evaluations score the test set: no model is chosen on it.
    best = next((r for r in reversed(evals) if r.get("is_best")), None) \
        if eval_name != "test" else None
    rows: list[tuple[str, dict[str, Any]]] = []
    if best is not None:
        rows.append((f"best on {eval_name} (model in best/)", best))
    if evals:
        rows.append((f"last on {eval_name}", evals[-1]))
    if results.get("test"):
        which = results.get("model") or ("the best model" if best is not None else "the last model")
        rows.append((f"test, {which} (model/)", results["test"]))
    from nlptrain.scores import metric_label, shown_score

    shown = [k for k in (*kind.metric_names, "loss") if any(k in m for _, m in rows)]
    table = _table(["", "step", "epoch", "rows", *map(metric_label, shown)],
                   [[label, m.get("step", "-"), m.get("epoch", "-"), m["rows"],
                     *(shown_score(m[k]) if k in m else "-" for k in shown)] for label, m in rows])
    detail, where = (results["test"], "test") if results.get("test") else \
        (best or (evals[-1] if evals else None), eval_name)
    return table, detail, where


def report_markdown(run_dir: Path) -> str:
    """report.md for `run_dir`, from config.json, metrics.jsonl and results.json."""
    from nlptrain.kinds import from_run_config
    from nlptrain.plots import PLOTS_DIR, eval_set_name, read_metrics

    config = _read_json(run_dir / "config.json")
    results = _read_json(run_dir / "results.json")
    task = config.get("task", {})
    train_cfg, model_cfg = train_settings(config), task.get("model", {})
    train, evals = read_metrics(run_dir) if (run_dir / "metrics.jsonl").is_file() else ([], [])
    eval_name = eval_set_name(run_dir)
    world, said = processes(config)
    if train_cfg.get("max_tokens"):  # rows per step vary: the budget is what was asked
        batch = f"batches of up to {train_cfg['max_tokens']} tokens per process"
    else:
        batch = (f"global batch {train_cfg.get('batch_size', 0) * world * train_cfg.get('grad_accum', 1)}"
                 " per optimizer step")

    out = [f"# Run report: {task.get('name', run_dir.name)}", ""]
    if task.get("description"):
        out += [task["description"], ""]
    versions = ", ".join(f"{k} {v}" for k, v in config.get("versions", {}).items())
    out += [f"- run directory: `{run_dir.name}`, started {config.get('started', '?')}",
            f"- model: `{model_cfg.get('name', '?')}`, max length {model_cfg.get('max_length')} "
            "tokens" + (f", first {model_cfg['num_hidden_layers']} layers"
                        if model_cfg.get("num_hidden_layers") else ""),
            f"- processes: {said} ({batch})",
            f"- versions: {versions or '?'}; git commit {config.get('git_commit') or 'none'}"]
    if train:
        speed = statistics.median(r["samples_per_s"] for r in train)
        steps = max(r["step"] for r in train + evals)  # an epoch-end evaluation has the last
        out.append(f"- training: {steps} optimizer steps in {train[-1]['epoch']} "
                   f"epoch(s), median {speed:.1f} samples/s (all processes together)")
    out.append("")

    data = results.get("data", {})
    if data:
        out += ["## Data", "", f"Folder `{task.get('data_dir', '')}`.", ""]
        out += _table(["set", "rows", "from"], [[name, info["rows"], info["source"]]
                                                for name, info in data.items()]) + [""]
    out += ["## Settings", ""]
    out += _table(["setting", "value"], [[k, _setting(train_cfg[k])] for k in SETTINGS
                                         if k in train_cfg])
    out += ["", "Every setting is in `config.json`.", ""]

    kind = from_run_config(config)
    table, detail, where = _results_section(results, evals, eval_name, kind)
    out += ["## Results", ""]
    out += table if len(table) > 2 else ["No evaluation was recorded."]
    if kind.decision_rule:
        out += ["", kind.decision_rule[0].upper() + kind.decision_rule[1:] + "."]
    if detail is not None and detail.get("per_class"):
        names = list(detail["per_class"])
        out += ["", f"### Per class ({where})", ""]
        out += _table(["class", "precision", "recall", "F1", "support"],
                      [[n, r["precision"], r["recall"], r["f1"], r["support"]]
                       for n, r in detail["per_class"].items()])
    if detail is not None and detail.get("confusion_matrix"):
        out += ["", f"### Confusion matrix ({where}; rows: true label, columns: predicted)", ""]
        out += _table(["true \\ predicted", *names],
                      [[n, *row] for n, row in zip(names, detail["confusion_matrix"], strict=True)])
    plots = [p for p in PLOT_CAPTIONS if (run_dir / PLOTS_DIR / p).is_file()]
    if plots:
        out += ["", "## Plots", ""]
        for name in plots:
            out += [f"![{PLOT_CAPTIONS[name]}]({PLOTS_DIR}/{name})", ""]
    out += ["", "## Files", "",
            "- `config.json`: the resolved task, world size, versions, git commit",
            "- `metrics.jsonl`: one JSON row per logged step (`kind: train`) and evaluation "
            "(`kind: eval`)",
            "- `results.json`: final metrics; `checkpoints/`: resumable state (`--resume`)",
            "- `model/`: the model to use, a `save_pretrained` folder for "
            "`AutoModelForSequenceClassification.from_pretrained`: "
            + (results.get("model") or ("the best on validation, as in `best/`"
                                        if (run_dir / "best").is_dir()
                                        else "the last one (no validation set chose a best)")),
            f"- `{PLOTS_DIR}/`: PNG plots (`python -m nlptrain plot {run_dir}` redraws them)"]
    if (run_dir / "tensorboard").is_dir():
        out.append(f"- `tensorboard/`: event files (`tensorboard --logdir {run_dir / 'tensorboard'}`)")
    return "\n".join(out).replace("\n\n\n", "\n\n") + "\n"


def write_report(run_dir: str | Path) -> Path:
    run_dir = Path(run_dir)
    path = run_dir / REPORT_FILE
    write_text(path, report_markdown(run_dir))
    return path
