"""PNG plots of a run, drawn from its files alone: at the end of training and by
`python -m nlptrain plot RUN_DIR` (e.g. for a run that crashed, or while one is running).

- `training.png`: training loss (and validation loss), the learning rate and the gradient norm
  before clipping (when logged) per optimizer step;
- `evaluation.png`: the task kind's scores (accuracy and macro-F1, micro-F1, Pearson and Spearman,
  ...) at each evaluation, the best one marked;
- `confusion_matrix.png` (single-label): true against predicted labels, by name, on the test set
  (else the last evaluation); `label_f1.png` (multi-label): F1 per label; `scatter.png`
  (regression): predicted against true score.

Figures are made with `matplotlib.figure.Figure`, never pyplot's GUI state, so they draw with the
Agg renderer on a headless server and leave a notebook's backend alone.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
from pathlib import Path
from typing import Any

from nlptrain.durable import open_durably
from nlptrain.errors import ConfigError
from nlptrain.kinds import LOWER_IS_BETTER, from_run_config
from nlptrain.logs import add_log_level

log = logging.getLogger("nlptrain")

PLOTS_DIR = "plots"
PREDICTIONS_FILE = "predictions.npz"  # the final set's outputs and targets (recipe.write_outputs)
DPI = 100
WIDE = (9.0, 6.0)    # inches: training and evaluation plots, 900 x 600 pixels
SQUARE = (7.0, 6.0)  # confusion matrix, 700 x 600 pixels (grows with many classes)


def read_metrics(run_dir: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(training rows, evaluation rows) of `metrics.jsonl`; a torn last line is skipped."""
    path = run_dir / "metrics.jsonl"
    train, evals = [], []
    # A damaged byte (a disk error, a hand edit) spoils its line alone, skipped as a torn one.
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue  # a run killed mid-write leaves half a line
        (evals if row.get("kind") == "eval" else train).append(row)
    return train, evals


def _score(value: Any) -> float:
    """A score as plotted: null (written for a non-finite one) or absent is NaN, a gap."""
    return math.nan if value is None else float(value)


def _shown(value: Any) -> str:
    return f"{_score(value):.3f}" if math.isfinite(_score(value)) else "n/a"


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


def training_figure(train: list[dict[str, Any]], evals: list[dict[str, Any]],
                    eval_name: str = "validation", max_grad_norm: float | None = None) -> Any:
    """Loss and learning rate per optimizer step; below them the gradient norm before clipping
    when the rows carry it, on a log scale with the clipping threshold drawn (the steps above the
    line are the clipped ones)."""
    from matplotlib.figure import Figure

    norms = [(r["step"], r["grad_norm"]) for r in train if "grad_norm" in r]  # (max_grad_norm 0: none)
    fig = Figure(figsize=WIDE if not norms else (WIDE[0], WIDE[1] * 1.4), dpi=DPI,
                 layout="constrained")
    axes = fig.subplots(3 if norms else 2, 1, sharex=True,
                        height_ratios=[2, 1, 1] if norms else [2, 1])
    loss_ax, lr_ax = axes[0], axes[1]
    steps = [r["step"] for r in train]
    dots = "o" if len(steps) < 30 else None  # a short run's few rows (one: no line at all) show
    loss_ax.plot(steps, [r["loss"] for r in train], color="tab:blue", linewidth=1.2, marker=dots,
                 markersize=3, label="training loss (mean since the previous point)")
    if evals:
        loss_ax.plot([r["step"] for r in evals], [r["loss"] for r in evals], "o--",
                     color="tab:orange", label=f"{eval_name} loss")
    loss_ax.set_ylabel("loss")
    loss_ax.set_title("Loss per optimizer step")
    loss_ax.legend(loc="best", fontsize=9)
    lr_ax.plot(steps, [r["lr"] for r in train], color="tab:green", linewidth=1.2, marker=dots,
               markersize=3)
    lr_ax.set_ylabel("learning rate")
    lr_ax.set_title("Learning rate (schedule)")
    lr_ax.ticklabel_format(axis="y", style="sci", scilimits=(-2, 3))
    if norms:
        norm_ax = axes[2]
        norm_ax.plot([step for step, _ in norms], [norm for _, norm in norms], color="tab:purple",
                     linewidth=1.2, marker=dots, markersize=3, label="global norm at the logged step")
        if max_grad_norm:
            norm_ax.axhline(max_grad_norm, color="tab:red", linestyle="--", linewidth=1,
                            label=f"max_grad_norm = {max_grad_norm:g} (clipped above)")
        norm_ax.set_yscale("log")
        norm_ax.set_ylabel("gradient norm")
        norm_ax.set_title("Gradient norm before clipping")
        norm_ax.legend(loc="best", fontsize=9)
    axes[-1].set_xlabel("optimizer step")
    for ax in axes:
        ax.grid(alpha=0.3)
        _epoch_marks(ax, train + evals)
    return fig


def plot_training(train: list[dict[str, Any]], evals: list[dict[str, Any]], path: Path,
                  eval_name: str = "validation", max_grad_norm: float | None = None) -> Path:
    _save(training_figure(train, evals, eval_name, max_grad_norm), path)
    return path


def plot_evaluation(evals: list[dict[str, Any]], path: Path, eval_name: str = "validation",
                    metric_for_best: str | None = "accuracy",
                    keys: tuple[str, ...] = ("accuracy", "macro_f1")) -> Path:
    """The `keys` metrics (the task kind's headline scores) at each evaluation.
    `metric_for_best=None`: no model was chosen on these evaluations (the test set)."""
    from matplotlib.figure import Figure

    from nlptrain.scores import metric_label

    fig = Figure(figsize=WIDE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    steps = [r["step"] for r in evals]
    best = [r for r in evals if r.get("is_best")] if metric_for_best else []
    # Numbers on every point while they fit; with many points, on the best and the last only.
    shown = set(range(len(evals))) if len(evals) <= 8 else \
        {len(evals) - 1, *(i for i, r in enumerate(evals) if best and r is best[-1])}
    colors = ("tab:blue", "tab:purple", "tab:green", "tab:brown")
    for n, key in enumerate(k for k in keys if k in evals[0]):
        name, color, below = metric_label(key), colors[n % len(colors)], n % 2 == 1
        values = [_score(r.get(key)) for r in evals]  # null (a non-finite score): a gap
        ax.plot(steps, values, "o-", color=color, label=name)
        for i in sorted(i for i in shown if math.isfinite(values[i])):
            ax.annotate(f"{values[i]:.3f}", (steps[i], values[i]), xytext=(0, -14 if below else 8),
                        textcoords="offset points", ha="center", fontsize=8, color=color)
    if best and metric_for_best and math.isfinite(_score(best[-1].get(metric_for_best))):
        last_best, by = best[-1], metric_for_best.replace("_", "-")
        if metric_for_best in keys:
            ax.plot([last_best["step"]], [last_best[metric_for_best]], marker="*", markersize=16,
                    color="gold", markeredgecolor="black", linestyle="none",
                    label=f"best model (by {by})")
        else:  # picked by a score not drawn here (loss, MSE: lower is better): its step
            ax.axvline(last_best["step"], color="goldenrod", linestyle="--", linewidth=1.5,
                       label=f"best model (by {by}, {_shown(last_best[metric_for_best])})")
    # Zoomed on the scores (not 0..1), so a one-point change between evaluations shows.
    scores = [v for r in evals for key in keys if math.isfinite(v := _score(r.get(key)))] or [0.0, 1.0]
    ax.set_ylim(max(-1.0, min(scores) - 0.05), min(1.02, max(scores) + 0.05))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("score")
    rows = evals[-1].get("rows") if evals else None
    named = [metric_label(k) for k in keys if k in evals[0]]
    what = f"{', '.join(named[:-1])} and {named[-1]}" if len(named) > 1 else named[0]
    ax.set_title(what[:1].upper() + what[1:] + f" on the {eval_name} set"
                 + (f" ({rows} rows)" if rows else "") + ", at each evaluation")
    if len(steps) == 1:  # one point: keep it off the frame's edge
        ax.set_xlim(steps[0] - 1, steps[0] + 1)
    ax.legend(loc="best")  # (upper left hid a best model found first, on a flat curve)
    ax.grid(alpha=0.3)
    _epoch_marks(ax, evals, label_at="bottom")  # the scores' numbers sit near the top
    _save(fig, path)
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
    _save(fig, path)
    return path


def plot_label_f1(per_class: dict[str, dict[str, float]], path: Path, title: str) -> Path:
    """Multi-label: one bar per label, its F1 (and its support in the set), rarest labels last."""
    from matplotlib.figure import Figure

    names = sorted(per_class, key=lambda n: -per_class[n]["support"])
    fig = Figure(figsize=(WIDE[0], max(WIDE[1], 0.25 * len(names) + 1)), dpi=DPI, layout="constrained")
    ax = fig.subplots()
    f1 = [per_class[n]["f1"] for n in names]
    ax.barh(range(len(names)), f1, color="tab:blue")
    ax.set_yticks(range(len(names)), [f"{n} ({per_class[n]['support']})" for n in names], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.set_xlabel("F1 at the threshold")
    ax.set_title(title)
    ax.grid(alpha=0.3, axis="x")
    _save(fig, path)
    return path


def plot_scatter(truth: Any, predicted: Any, path: Path, title: str) -> Path:
    """Regression: predicted against true score, with the diagonal a perfect model would draw."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=SQUARE, dpi=DPI, layout="constrained")
    ax = fig.subplots()
    ax.scatter(truth, predicted, s=8, alpha=0.4, color="tab:blue")
    low, high = float(min(truth.min(), predicted.min())), float(max(truth.max(), predicted.max()))
    ax.plot([low, high], [low, high], color="0.4", linestyle="--", linewidth=1, label="predicted = true")
    ax.set_xlabel("true score")
    ax.set_ylabel("predicted score")
    ax.set_title(title)
    ax.legend(loc="upper left")
    ax.grid(alpha=0.3)
    _save(fig, path)
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
    results = run_dir / "results.json"
    if results.is_file():  # a finished run lists the sets it had
        sets = json.loads(results.read_text()).get("data")
        if sets is not None:
            return "validation" if "valid" in sets else "test"
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        return "validation"
    data = json.loads(config_path.read_text())["task"]["data"]
    # Per-rank files and streams hold no rows out (the train rows are read later, per rank).
    held_out = data.get("valid_size", 0) > 0 and not (data.get("train_shards")
                                                       or data.get("streaming"))
    return "validation" if data.get("valid") or held_out else "test"


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
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    kind = from_run_config(config)
    best_key = config.get("task", {}).get("train", {}).get("metric_for_best") or kind.default_metric
    if name == "test":
        best_key = None  # without a validation set, no model is picked on the test set
    written = []
    if train:
        clip = config.get("task", {}).get("train", {}).get("max_grad_norm")
        written.append(plot_training(train, evals, out / "training.png", name, clip))
    if evals:
        keys = kind.plotted
        if best_key and best_key not in keys and best_key not in LOWER_IS_BETTER:
            keys = (*keys, best_key)  # CoLA's MCC, MRPC's F1: the score the best model is picked by
        written.append(plot_evaluation(evals, out / "evaluation.png", name, best_key, keys))
    final, where = _final_metrics(run_dir, evals)
    if final is not None and final.get("confusion_matrix"):  # single-label
        written.append(plot_confusion(final["confusion_matrix"], _label_names(final),
                                      out / "confusion_matrix.png", f"Confusion matrix: {where} "
                                      f"({final['rows']} rows, accuracy {_shown(final['accuracy'])})"))
    if final is not None and final.get("label_confusion"):  # multi-label
        written.append(plot_label_f1(final["per_class"], out / "label_f1.png",
                                     f"F1 per label: {where} ({final['rows']} rows, micro-F1 "
                                     f"{_shown(final['micro_f1'])}, macro-F1 {_shown(final['macro_f1'])})"))
    saved = run_dir / PREDICTIONS_FILE
    if not kind.has_classes and saved.is_file():  # a score a row (regression)
        import numpy as np

        from nlptrain.scores import metric_label

        with np.load(saved) as arrays:
            truth, predicted = arrays["targets"], arrays["outputs"].reshape(-1)
        score = kind.headline[0]  # (regression's: Pearson)
        written.append(plot_scatter(truth, predicted, out / "scatter.png",
                                    f"Predicted against true score: {where} ({len(truth)} rows, "
                                    f"{metric_label(score)} {_shown(final.get(score))})"
                                    if final else "Scores"))
    if not written:
        log.warning("%s: nothing to plot yet (metrics.jsonl holds no rows)", run_dir)
    return written


def _save(fig: Any, path: Path) -> None:
    """The PNG written whole or not at all (a crash mid-write leaves the previous one)."""
    with open_durably(path, "wb") as handle:
        fig.savefig(handle, format="png")


def cmd_plot(args: argparse.Namespace) -> int:
    from nlptrain.logs import setup_logging

    setup_logging(0, args.log_level)
    for path in plot_run(args.run_dir):
        print(path)
    return 0


def add_command(commands: Any) -> None:
    parser = commands.add_parser("plot", help="draw a run's plots as PNG files",
                                 description="Draw the plots of a run directory into "
                                 "RUN_DIR/plots/: loss, learning rate and gradient norm per "
                                 "step, the task kind's scores per evaluation, and the test "
                                 "set's confusion matrix (single-label), F1 per label "
                                 "(multi-label) or predicted against true scores (regression).")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (runs/<task>-<time>)")
    add_log_level(parser)
    parser.set_defaults(handler=cmd_plot)
