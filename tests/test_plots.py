"""Plots of a run directory: drawn from its files alone, as PNGs of a known size."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nlptrain.cli import main
from nlptrain.errors import ConfigError
from nlptrain.plots import eval_set_name, plot_run, read_metrics, training_figure


def fake_run(folder: Path, labels: list[str], results: bool = True) -> Path:
    """A run directory as `train` leaves it: 2 epochs of 10 steps, an evaluation per epoch."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"kind": "train", "step": s, "epoch": 1 + (s - 1) // 10, "loss": 1.0 / s,
             "lr": 1e-4 * (1 - s / 20), "samples_per_s": 100.0, "time": 0.0} for s in range(2, 21, 2)]
    n = len(labels)
    matrix = (np.eye(n, dtype=int) * 5 + 1).tolist()
    per_class = {name: {"precision": 0.8, "recall": 0.7, "f1": 0.75, "support": 5 + n}
                 for name in labels}
    for step, acc, best in ((10, 0.6, True), (20, 0.55, False)):
        rows.insert(step // 2, {"kind": "eval", "step": step, "epoch": step // 10, "is_best": best,
                                "rows": n * (5 + n), "accuracy": acc, "macro_f1": acc - 0.1,
                                "loss": 0.7, "per_class": per_class, "confusion_matrix": matrix})
    lines = [json.dumps(r) for r in rows]
    (folder / "metrics.jsonl").write_text("\n".join(lines) + '\n{"kind": "tra')  # torn last line
    (folder / "config.json").write_text(json.dumps({"task": {
        "name": "fake", "data": {"valid": "dev.tsv", "valid_size": 0.0},
        "train": {"metric_for_best": "accuracy"}}, "world_size": 2}))
    if results:
        test = {"rows": 40, "accuracy": 0.7, "macro_f1": 0.6, "loss": 0.5,
                "per_class": per_class, "confusion_matrix": matrix}
        (folder / "results.json").write_text(json.dumps({"valid": None, "test": test}))
    return folder


def png(path: Path) -> tuple[tuple[int, int], float]:
    """(size, spread of pixel values): a blank image has no spread."""
    with Image.open(path) as image:
        image.verify()
    with Image.open(path) as image:
        assert image.format == "PNG"
        return image.size, float(np.asarray(image.convert("L")).std())


def test_plot_run_writes_three_pngs_of_the_expected_size(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", ["neg", "pos"])
    written = plot_run(run)
    assert [p.name for p in written] == ["training.png", "evaluation.png", "confusion_matrix.png"]
    sizes = {p.name: png(p) for p in written}
    assert sizes["training.png"][0] == (900, 600)
    assert sizes["evaluation.png"][0] == (900, 600)
    assert sizes["confusion_matrix.png"][0] == (700, 600)
    assert all(spread > 10 for _, spread in sizes.values())  # something is drawn


def test_a_logged_gradient_norm_gets_its_own_panel_with_the_clipping_line(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", ["neg", "pos"])
    train, evals = read_metrics(run)
    assert len(training_figure(train, evals).axes) == 2  # no norm logged (max_grad_norm = 0)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()[:-1]]
    for row in rows:
        if row["kind"] == "train":
            row["grad_norm"] = 4.0 / row["step"]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    config = json.loads((run / "config.json").read_text())
    config["task"]["train"]["max_grad_norm"] = 0.5
    (run / "config.json").write_text(json.dumps(config))

    train, evals = read_metrics(run)
    norm_ax = training_figure(train, evals, max_grad_norm=0.5).axes[2]
    curve, threshold = norm_ax.get_lines()[:2]
    assert list(curve.get_ydata()) == [4.0 / s for s in range(2, 21, 2)]
    assert list(threshold.get_ydata()) == [0.5, 0.5] and norm_ax.get_yscale() == "log"
    (path,) = [p for p in plot_run(run) if p.name == "training.png"]
    assert png(path)[0] == (900, 840)  # taller by the third panel


def test_torn_last_line_is_skipped(tmp_path: Path) -> None:
    train, evals = read_metrics(fake_run(tmp_path / "run", ["a", "b"]))
    assert len(train) == 10 and [r["step"] for r in evals] == [10, 20]


def test_a_damaged_line_or_a_null_score_is_a_gap_not_a_traceback(tmp_path: Path) -> None:
    """A non-finite score is written as null (strict JSON): plot_run, which ends every run
    before its report and model card, raised a TypeError on it; a non-UTF-8 byte, a
    UnicodeDecodeError."""
    run = fake_run(tmp_path / "run", ["neg", "pos"])
    rows = (run / "metrics.jsonl").read_bytes().split(b"\n")
    evaluated = [i for i, row in enumerate(rows) if b'"kind": "eval"' in row]
    rows[evaluated[0]] = rows[evaluated[0]].replace(b'"accuracy": 0.6', b'"accuracy": null')
    rows.insert(1, b'{"kind": "train", "step": 3, "loss": \xff}')
    (run / "metrics.jsonl").write_bytes(b"\n".join(rows))
    results = json.loads((run / "results.json").read_text())
    results["test"]["accuracy"] = None
    (run / "results.json").write_text(json.dumps(results))
    train, evals = read_metrics(run)
    assert len(train) == 10 and evals[0]["accuracy"] is None
    assert [p.name for p in plot_run(run)] == ["training.png", "evaluation.png", "confusion_matrix.png"]


def test_many_classes_get_a_larger_confusion_matrix(tmp_path: Path) -> None:
    names = [f"class number {i}" for i in range(12)]
    run = fake_run(tmp_path / "run", names, results=False)  # matrix from the last evaluation
    (path,) = [p for p in plot_run(run) if p.name == "confusion_matrix.png"]
    assert png(path)[0] == (900, 800)


def test_a_folder_without_metrics_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"no metrics.jsonl here; give a run directory"):
        plot_run(tmp_path)


def test_plot_command(tmp_path: Path, capsys) -> None:
    run = fake_run(tmp_path / "run", ["neg", "pos"])
    assert main(["plot", str(run)]) == 0
    assert capsys.readouterr().out.split() == [
        str(run / "plots" / n) for n in ("training.png", "evaluation.png", "confusion_matrix.png")]
    assert main(["plot", str(tmp_path / "nowhere")]) == 1
    assert "nowhere: no metrics.jsonl here" in capsys.readouterr().err


def test_without_a_validation_set_no_best_model_is_claimed(tmp_path: Path) -> None:
    """Evaluations then score the test set: report and plot must not pick a 'best' on it."""
    from nlptrain.report import write_report

    run = fake_run(tmp_path / "run", ["neg", "pos"])
    config = json.loads((run / "config.json").read_text())
    config["task"]["data"]["valid"] = ""
    (run / "config.json").write_text(json.dumps(config))
    plot_run(run)
    report = write_report(run).read_text()
    assert "| last on test | 20 | 2 |" in report
    assert "best on" not in report and "the last model" in report


def test_a_plot_that_fails_mid_write_leaves_the_previous_png_whole(tmp_path: Path,
                                                                    monkeypatch) -> None:
    from matplotlib.figure import Figure

    run = fake_run(tmp_path / "run", ["neg", "pos"])
    plot_run(run)
    before = (run / "plots" / "training.png").read_bytes()
    real = Figure.savefig

    def dies_halfway(self, target, **kwargs):  # a full disk, a kill: half the file is written
        real(self, target, **kwargs)
        if hasattr(target, "truncate"):
            target.truncate(target.tell() // 2)
        else:
            Path(target).write_bytes(Path(target).read_bytes()[:100])
        raise OSError("No space left on device")

    monkeypatch.setattr(Figure, "savefig", dies_halfway)
    with pytest.raises(OSError, match="No space left"):
        plot_run(run)
    assert (run / "plots" / "training.png").read_bytes() == before
    assert [p.name for p in (run / "plots").iterdir() if p.name.startswith(".")] == []


def test_a_run_without_a_validation_set_names_its_evaluations_test(tmp_path: Path) -> None:
    run = fake_run(tmp_path / "run", ["neg", "pos"], results=False)
    config = json.loads((run / "config.json").read_text())
    config["task"]["data"] = {"valid_size": 0.1, "train_shards": "shards/"}  # nothing held out
    (run / "config.json").write_text(json.dumps(config))
    assert eval_set_name(run) == "test"
    config["task"]["data"] = {"valid_size": 0.1}
    (run / "config.json").write_text(json.dumps(config))
    assert eval_set_name(run) == "validation"
    # A finished run says which sets it had: results.json's word is final.
    (run / "results.json").write_text(json.dumps({"valid": None, "test": None,
                                                  "data": {"train": {}, "test": {}}}))
    assert eval_set_name(run) == "test"


def test_the_metric_that_picks_the_best_model_is_drawn_with_its_star(tmp_path: Path,
                                                                      monkeypatch) -> None:
    """CoLA picks by MCC, MRPC by F1: evaluation.png draws that score beside the headline ones,
    and the star of the best model on it."""
    import nlptrain.plots as plots

    run = fake_run(tmp_path / "run", ["neg", "pos"])
    lines = (run / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines[:-1]]
    for row in rows:
        if row["kind"] == "eval":
            row["mcc"] = row["accuracy"] - 0.3
    (run / "metrics.jsonl").write_text("\n".join(map(json.dumps, rows)) + "\n")
    config = json.loads((run / "config.json").read_text())
    config["task"]["train"]["metric_for_best"] = "mcc"
    (run / "config.json").write_text(json.dumps(config))
    drawn = {}
    real = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: (drawn.setdefault(path.name, fig),
                                                            real(fig, path)))
    plot_run(run)
    legend = drawn["evaluation.png"].axes[0].get_legend_handles_labels()[1]
    assert legend == ["accuracy", "macro-F1", "MCC", "best model (by mcc)"]

    # Picked by the loss (lower is better; not drawn here): the best one's step is marked.
    config["task"]["train"]["metric_for_best"] = "loss"
    (run / "config.json").write_text(json.dumps(config))
    drawn.clear()
    plot_run(run)
    best = [r for r in rows if r.get("is_best")][-1]
    marked = [line for line in drawn["evaluation.png"].axes[0].lines
              if line.get_label().startswith("best model")]
    assert [line.get_label() for line in marked] == [f"best model (by loss, {best['loss']:.3f})"]
    assert list(marked[0].get_xdata()) == [best["step"]] * 2  # a vertical line at its step


def test_a_short_runs_single_training_row_is_drawn_as_a_point() -> None:
    """One logged row (10 steps at log_every 10): a line alone draws nothing; a marker does."""
    row = {"kind": "train", "step": 10, "epoch": 1, "loss": 0.7, "lr": 1e-5, "grad_norm": 2.0}
    fig = training_figure([row], [])
    assert [ax.lines[0].get_marker() for ax in fig.axes] == ["o", "o", "o"]
    many = [{**row, "step": step} for step in range(1, 101)]
    assert training_figure(many, []).axes[0].lines[0].get_marker() in (None, "None", "")
