"""PNG plots of a run, drawn from its files alone: at the end of training and by
`python -m nlptrain plot RUN_DIR` (e.g. for a run that crashed, or while one is running).

- `training.png`: training loss (and validation loss) and the learning rate per optimizer step;
- `evaluation.png`: accuracy and macro-F1 at each evaluation, the best one marked;
- `confusion_matrix.png`: true against predicted labels, by name, on the test set (else the last
  evaluation).

Figures are made with `matplotlib.figure.Figure`, never pyplot's GUI state, so they draw with the
Agg renderer on a headless server and leave a notebook's backend alone.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from nlptrain.errors import ConfigError

log = logging.getLogger("nlptrain")

PLOTS_DIR = "plots"
DPI = 100
WIDE = (9.0, 6.0)    # inches: training and evaluation plots, 900 x 600 pixels
SQUARE = (7.0, 6.0)  # confusion matrix, 700 x 600 pixels (grows with many classes)


def read_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, evaluation rows) of `metrics.jsonl`; a torn last line is skipped."""
    path = run_dir / "metrics.jsonl"
    train, evals = [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves half a line
        (evals if row.get("kind") == "eval" else train).append(row)
    return train, evals


def _epoch_marks(ax: Any, rows: list[dict[str, Any]], label_at: str = "top") -> None:
    """A dotted line at the last step of each epoch, so step numbers read as epochs too. The
    evaluation at an epoch's end carries its exact last step; training rows come close."""
    import matplotlib.transforms as transforms

    ends: dict[int, int] = {}
    for row in rows:
        ends[row["epoch"]] = max(ends.get(row["epoch"], 0), row["step"])
    along = transforms.blended_transform_factory(ax.transData, ax.transAxes)
    for epoch, step in sorted(ends.items()):
        ax.axvline(step, color="0.6", linestyle=":", linewidth=1)
        top = label_at == "top"
        ax.text(step, 0.97 if top else 0.03, f" end of epoch {epoch} ", transform=along,
                rotation=90, ha="right", va="top" if top else "bottom", fontsize=8, color="0.4")


def plot_training(train: list[dict[str, Any]], evals: list[dict[str, Any]], path: Path,
                  eval_name: str = "validation") -> Path:
    from matplotlib.figure import Figure

    fig = Figure(figsize=WIDE, dpi=DPI, layout="constrained")
    loss_ax, lr_ax = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    steps = [r["step"] for r in train]
    loss_ax.plot(steps, [r["loss"] for r in train], color="tab:blue", linewidth=1.2,
                 label="training loss (mean since the previous point)")
    if evals:
        loss_ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o--",
                     color="tab:orange", label=f"{eval_name} loss")
    loss_ax.set_ylabel("cross-entropy loss")
    loss_ax.set_title("Loss per optimizer step")
    loss_ax.legend(loc="best", fontsize=9)
    loss_ax.grid(alpha=0.3)
    lr_ax.plot(steps, [r["lr"] for r in train], color="tab:green", linewidth=1.2)
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_xlabel("optimizer step")
    lr_ax.set_title("Learning rate (schedule)")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    lr_ax.grid(alpha=0.3)
    for ax in (loss_ax, lr_ax):
        _epoch_marks(ax, train + evals)
    fig.savefig(path)
    return path


def plot_evaluation(evals: list[dict[str, Any]], path: Path, eval_name: str = "validation",
                    metric_for_best: str | None = "accuracy") -> Path:
    """`metric_for_best=None`: no model was chosen on these evaluations (the test set)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=WIDE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    steps = [r["step"] for r in evals]
    best = [r for r in evals if r.get("is_best")] if metric_for_best else []
    # Numbers on every point while they fit; with many points, on the best and the last only.
    shown = set(range(len(evals))) if len(evals) <= 8 else \
        {len(evals) - 1, *(i for i, r in enumerate(evals) if best and r is best[-1])}
    for key, name, color, below in (("accuracy", "accuracy", "tab:blue", False),
                                    ("macro_f1", "macro-F1", "tab:purple", True)):
        values = [r[key] for r in evals]
        ax.plot(steps, values, "o-", color=color, label=name)
        for i in sorted(shown):
            ax.annotate(f"{values[i]:.3f}", (steps[i], values[i]), xytext=(0, -14 if below else 8),
                        textcoords="offset points", ha="center", fontsize=8, color=color)
    if best and metric_for_best:
        last_best = best[-1]
        ax.plot([last_best["step"]], [last_best[metric_for_best]], marker="*", markersize=16,
                color="gold", markeredgecolor="black", linestyle="none",
                label=f"best model (by {metric_for_best.replace('_', '-')})")
    # Zoomed on the scores (not 0..1), so a one-point change between evaluations shows.
    scores = [r[key] for r in evals for key in ("accuracy", "macro_f1")] or [0.0, 1.0]
    ax.set_ylim(max(0.0, min(scores) - 0.05), min(1.02, max(scores) + 0.05))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("score")
    rows = evals[-1].get("rows") if evals else None
    ax.set_title(f"Accuracy and macro-F1 on the {eval_name} set"
                 + (f" ({rows} rows)" if rows else "") + ", at each evaluation")
    if len(steps) == 1:  # one point: keep it off the frame's edge
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
    ax.legend(loc="upper left")  # scores mostly rise: the early top-left stays empty
    ax.grid(alpha=0.3)
    _epoch_marks(ax, evals, label_at="bottom")  # the scores' numbers sit near the top
    fig.savefig(path)
    return path


def plot_confusion(matrix: list[list[int]], names: list[str], path: Path, title: str) -> Path:
    """Counts per (true, predicted) pair, with label names; rows are true labels."""
    import numpy as np
    from matplotlib.figure import Figure
    from sklearn.metrics import ConfusionMatrixDisplay

    grow = max(0.0, 0.5 * (len(names) - 8))  # room for the names of many classes
    fig = Figure(figsize=(SQUARE[0] + grow, SQUARE[1] + grow), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    display = ConfusionMatrixDisplay(np.asarray(matrix), display_labels=names)
    display.plot(ax=ax, cmap="Blues", colorbar=True, values_format="d",
                 xticks_rotation=30 if max(map(len, names)) > 6 else "horizontal")
    for label in ax.get_xticklabels():  # slanted names end under their column
        if label.get_rotation():
            label.set(ha="right", rotation_mode="anchor")
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    ax.set_title(title)
    fig.savefig(path)
    return path


def _final_metrics(run_dir: Path, evals: list[dict[str, Any]]) -> tuple[dict | None, str]:
    """The metrics whose confusion matrix to draw, and a title saying where they come from."""
    results_path = run_dir / "results.json"
    results = json.loads(results_path.read_text()) if results_path.is_file() else {}
    if results.get("test"):
        return results["test"], "test set"
    if results.get("valid"):
        return results["valid"], "validation set"
    if evals:
        return evals[-1], f"last evaluation, at step {evals[-1]['step']}"
    return None, ""


def _label_names(metrics: dict[str, Any]) -> list[str]:
    if metrics.get("per_class"):
        return list(metrics["per_class"])
    return [str(i) for i in range(len(metrics["confusion_matrix"]))]


def eval_set_name(run_dir: Path) -> str:
    """Which set the evaluations during training scored: validation, else test."""
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        return "validation"
    data = json.loads(config_path.read_text())["task"]["data"]
    return "validation" if data.get("valid") or data.get("valid_size", 0) > 0 else "test"


def plot_run(run_dir: str | Path) -> list[Path]:
    """Draw every plot the run's files allow into RUN_DIR/plots; returns the files written."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").is_file():
        raise ConfigError(f"{run_dir}: no metrics.jsonl here; give a run directory made by "
                          "`nlptrain train` (it is written from the first logged step on)")
    train, evals = read_metrics(run_dir)
    out = run_dir / PLOTS_DIR
    out.mkdir(exist_ok=True)
    name = eval_set_name(run_dir)
    config_path = run_dir / "config.json"
    best_key = json.loads(config_path.read_text())["task"]["train"].get(
        "metric_for_best", "accuracy") if config_path.is_file() else "accuracy"
    if name == "test":
        best_key = None  # without a validation set, no model is picked on the test set
    written = []
    if train:
        written.append(plot_training(train, evals, out / "training.png", name))
    if evals:
        written.append(plot_evaluation(evals, out / "evaluation.png", name, best_key))
    final, where = _final_metrics(run_dir, evals)
    if final is not None and final.get("confusion_matrix"):
        written.append(plot_confusion(final["confusion_matrix"], _label_names(final),
                                      out / "confusion_matrix.png", f"Confusion matrix: {where} "
                                      f"({final['rows']} rows, accuracy {final['accuracy']:.3f})"))
    if not written:
        log.warning("%s: nothing to plot yet (metrics.jsonl holds no rows)", run_dir)
    return written


def cmd_plot(args: argparse.Namespace) -> int:
    from nlptrain.logs import setup_logging

    setup_logging(0, args.log_level)
    for path in plot_run(args.run_dir):
        print(path)
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("plot", help="draw a run's plots as PNG files",
                                 description="Draw the plots of a run directory into "
                                 "RUN_DIR/plots/: loss and learning rate per step, accuracy and "
                                 "macro-F1 per evaluation, and the confusion matrix.")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<task>-<time>)")
    parser.add_argument("--log-level", default="info", help="debug | info | warning | error")
    parser.set_defaults(handler=cmd_plot)
