"""Each task kind end to end through the command line: train, the run's files, `eval` on 1 and
2 processes, `predict`, and the export reloaded by `transformers.pipeline`."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import run_cli
from kinds_data import write_kind_task
from log_capture import nlptrain_messages

from nlptrain.cli import main
from nlptrain.config import file_spec
from nlptrain.data.readers import read_examples
from nlptrain.distributed import SingleProcess
from nlptrain.recipe import log_sizes
from nlptrain.report import metrics_text
from nlptrain.task_files import load_task

KINDS = ("pair", "multi_label", "regression")
METRICS = {"pair": {"accuracy", "macro_f1", "mcc", "f1"},
           "multi_label": {"micro_f1", "macro_f1", "subset_accuracy"},
           "regression": {"pearson", "spearman", "mse", "mae"}}
PLOT = {"pair": "confusion_matrix.png", "multi_label": "label_f1.png", "regression": "scatter.png"}


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_model_dir) -> dict[str, Path]:
    """One finished run per kind (the tiny BERT, 2 epochs on toy files), trained in this process:
    the command line's own start-up is tested elsewhere, and each launch costs seconds."""
    runs = {}
    for kind in KINDS:
        folder = tmp_path_factory.mktemp(kind)
        task = write_kind_task(folder, tiny_model_dir, kind)
        assert main(["train", "--task", str(task), "--output-dir", str(folder / "run")]) == 0
        runs[kind] = folder
    return runs


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_of_each_kind_reports_its_own_metrics(trained, kind):
    run = trained[kind] / "run"
    results = json.loads((run / "results.json").read_text())
    assert METRICS[kind] <= set(results["test"]) and METRICS[kind] <= set(results["valid"])
    evals = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()
             if '"eval"' in line]
    assert len(evals) == 2 and all(METRICS[kind] <= set(e) for e in evals)
    assert (run / "plots" / PLOT[kind]).is_file() and (run / "plots" / "evaluation.png").is_file()
    report = (run / "report.md").read_text()
    for name in {"pair": ("MCC", "F1"), "multi_label": ("micro-F1", "subset accuracy"),
                 "regression": ("Pearson", "Spearman")}[kind]:
        assert f" {name} |" in report
    config = json.loads((run / "model" / "config.json").read_text())
    assert config["problem_type"] == {"pair": "single_label_classification",
                                      "multi_label": "multi_label_classification",
                                      "regression": "regression"}[kind]
    if kind == "regression":
        assert config["id2label"] == {"0": "score"} and "confusion_matrix" not in results["test"]
    if kind == "pair":  # how `predict` reads its input by default: as the run read its train file
        assert config["nlptrain_columns"] == {"text": "premise", "text_pair": "hypothesis",
                                              "header": True, "quoted": False, "format": "tsv"}
    # Multi-label: the threshold is a setting the scores were computed at, said as such, never a
    # metric (the model card's table and the terminal's line list scores only).
    card = (run / "model" / "README.md").read_text()
    rule = "a label is predicted where its probability is at least 0.5 (`[data] threshold`)"
    for text in (report, card):
        assert (rule.capitalize() in text) == (kind == "multi_label")
        assert "| threshold |" not in text
    if kind == "multi_label":
        assert results["test"]["threshold"] == 0.5 and "score >= 0.5" in card
        assert metrics_text(results["test"]).splitlines()[0].endswith("(at threshold 0.5)")


@pytest.mark.parametrize("kind", KINDS)
def test_the_export_scores_in_a_pipeline_as_nlptrain_did(trained, kind):
    from transformers import pipeline

    folder = trained[kind]
    task = load_task(folder / f"{kind}.toml")
    test = read_examples(file_spec(task, "test"), folder, [])
    saved = np.load(folder / "run" / "predictions.npz")
    classify = pipeline("text-classification", model=str(folder / "run" / "model"), device="cpu")
    inputs = [{"text": t, "text_pair": p} for t, p in zip(test.texts, test.pairs, strict=True)] \
        if test.pairs else test.texts
    apply = {"pair": "softmax", "multi_label": "sigmoid", "regression": "none"}[kind]
    scored = classify(inputs, top_k=None, function_to_apply=apply, truncation=True, max_length=32)
    names = classify.model.config.id2label
    outputs = np.array([[{r["label"]: r["score"] for r in row}[names[i]] for i in range(len(names))]
                        for row in scored])
    np.testing.assert_allclose(outputs, saved["outputs"], atol=1e-4)


@pytest.mark.distributed
@pytest.mark.parametrize("kind", KINDS)
def test_eval_on_two_processes_equals_one(trained, kind, capsys):
    folder = trained[kind]
    args = ["eval", "--model", str(folder / "run" / "model"), "--task", str(folder / f"{kind}.toml"),
            "--split", "test", "--json"]
    two = run_cli(args, folder, nproc=2)
    assert two.returncode == 0, two.stderr[-3000:]
    capsys.readouterr()
    assert main(args) == 0
    first, second = json.loads(capsys.readouterr().out), json.loads(two.stdout)
    results = json.loads((folder / "run" / "results.json").read_text())["test"]
    for key in METRICS[kind]:
        # Each world size scores the same batches: every metric is one process's to the bit.
        assert first[key] == second[key], key
        # The run scored its test set with the model in memory, `eval` with the export reloaded,
        # whose outputs differ in the last float bits (6e-8 seen); the toy regression model's
        # outputs lie within 1e-4 of each other, which magnifies that in a correlation.
        close = {"rel": 1e-5, "abs": 1e-3 if key in ("pearson", "spearman") else 1e-6}
        assert first[key] == pytest.approx(results[key], **close), key


def test_eval_at_another_threshold_than_the_models_says_so(trained, capsys):
    """The task's threshold scores (it may be the point of the evaluation), but the model's run
    was tested at its own: a number that differs from results.json is explained."""
    folder = trained["multi_label"]
    args = ["eval", "--model", str(folder / "run" / "model"), "--task",
            str(folder / "multi_label.toml"), "--test-file", "test.jsonl", "--json"]
    assert main([*args, "--threshold", "0.3"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["threshold"] == 0.3
    assert "scoring at threshold 0.3; the model was trained and tested at 0.5 " \
           "(--threshold 0.5 scores as its run did)" in err
    assert main(args) == 0 and "scoring at threshold" not in capsys.readouterr().err


def test_predict_reads_pairs_and_writes_each_kind(trained, capsys):
    folder = trained["pair"]
    pairs = folder / "in.tsv"
    pairs.write_text("premise\thypothesis\nrow 1 was good\tit felt bad\nrow 2 was awful\tit felt poor\n")
    assert main(["predict", "--model", str(folder / "run" / "model"), "--input", str(pairs),
                 "--text-column", "premise", "--text-pair-column", "hypothesis",
                 "--output", str(folder / "out.jsonl")]) == 0
    rows = [json.loads(line) for line in (folder / "out.jsonl").read_text().splitlines()]
    assert [r["text_pair"] for r in rows] == ["it felt bad", "it felt poor"]
    assert all(r["label"] in ("differ", "same") and 0.5 <= r["probability"] <= 1 for r in rows)
    # Without column options: the columns the run trained on (its export says which).
    assert main(["predict", "--model", str(folder / "run" / "model"), "--input", str(pairs),
                 "--output", str(folder / "default.jsonl")]) == 0
    assert (folder / "default.jsonl").read_text() == (folder / "out.jsonl").read_text()
    # The other input would score without meaning: the export says what the model was trained on.
    capsys.readouterr()
    assert main(["predict", "--model", str(folder / "run" / "model"), "--input", str(pairs),
                 "--text-column", "premise", "--text-pair-column", ""]) == 1
    assert "was trained on text pairs: name the column (or JSON field) of each pair's second " \
        "text with --text-pair-column" in capsys.readouterr().err
    single = trained["multi_label"]  # posts: single texts
    assert main(["predict", "--model", str(single / "run" / "model"), "--input", str(pairs),
                 "--text-column", "premise", "--text-pair-column", "hypothesis"]) == 1
    assert "was trained on single texts, not pairs: drop --text-pair-column hypothesis" in \
        capsys.readouterr().err
    multi = trained["multi_label"]
    (multi / "in.txt").write_text("post about pizza and guitar\n")
    capsys.readouterr()
    assert main(["predict", "--model", str(multi / "run" / "model"), "--input", str(multi / "in.txt")]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header == "row\tline\tlabels\tlabel_probabilities\ttext"
    labels = [name for name in row.split("\t")[2].split(",") if name]
    probabilities = [float(p) for p in row.split("\t")[3].split(",") if p]
    assert labels and len(probabilities) == len(labels)
    assert all(p >= 0.5 for p in probabilities)  # every label over the threshold, no other
    assert main(["predict", "--model", str(trained["regression"] / "run" / "model"), "--input",
                 str(pairs), "--text-column", "premise", "--text-pair-column", "hypothesis",
                 "--format", "jsonl", "--all-probs"]) == 0
    out, err = capsys.readouterr()
    assert [set(json.loads(line)) for line in out.splitlines()] == \
        [{"row", "line", "score", "text", "text_pair"}] * 2
    assert "--all-probs: a regression model has no label probabilities" in err


@pytest.mark.parametrize("kind, said", [("regression", "train 10 rows; a score (regression)"),
                                        ("pair", "train 10 rows; labels ['neg', 'pos']")])
def test_a_run_says_its_labels_or_that_it_scores(tmp_path, tiny_model_dir, kind, said):
    """A regression has no labels (its one output is named "score"): the run says it scores."""
    task = load_task(write_kind_task(tmp_path, tiny_model_dir, kind))
    sets = SimpleNamespace(rows={"train": 10}.get, vocab=SimpleNamespace(names=["neg", "pos"]
                                                                         if kind == "pair" else ["score"]))
    with nlptrain_messages() as messages:
        log_sizes(task, sets, SingleProcess())
    assert any(said in message for message in messages), messages


def test_a_pair_model_reads_a_txt_of_columns_as_its_training_file_was(trained, tmp_path, capsys):
    """MRPC's test file is a TSV named .txt: predict read it as one text a line, and a model of
    pairs refused it ("pairs need columns"). Now such a file is read in the training file's
    format (its task's, or its suffix's), said; a single-text model still reads a .txt as lines."""
    model = trained["pair"] / "run" / "model"
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("premise\thypothesis\nrow 1 was good\tit felt bad\n")
    capsys.readouterr()
    assert main(["predict", "--model", str(model), "--input", str(pairs), "--format", "jsonl"]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["text_pair"] for line in out.splitlines()] == ["it felt bad"]
    assert "pairs.txt: read as tsv, as the model's training file was" in err


def test_predict_at_another_threshold_than_the_models(trained, capsys):
    """eval took --threshold, predict had none: a multi-label model predicted at its own alone."""
    multi = trained["multi_label"]
    (multi / "posts.txt").write_text("post about pizza and guitar\n")
    args = ["predict", "--model", str(multi / "run" / "model"), "--input", str(multi / "posts.txt"),
            "--format", "jsonl"]
    capsys.readouterr()
    assert main([*args, "--threshold", "0.001"]) == 0
    out, err = capsys.readouterr()
    assert sorted(json.loads(out)["labels"]) == ["food", "music", "sport"]  # every one reaches it
    assert "predicting at threshold 0.001; the model was trained and tested at 0.5" in err
    assert main([*args, "--threshold", "0.999"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"] == []
    # Refused from the model's config.json, before its input is read (or --nproc's workers start)
    assert main(["predict", "--model", str(trained["pair"] / "run" / "model"), "--input",
                 str(multi / "not-written-yet.tsv"), "--threshold", "0.3"]) == 1
    assert "is a single_label model, which predicts without a threshold" in capsys.readouterr().err
    with pytest.raises(SystemExit) as ended:
        main([*args, "--threshold", "1"])
    assert ended.value.code == 2 and "not a probability strictly between 0 and 1" in \
        capsys.readouterr().err


def test_the_threshold_check_reads_a_config_json_without_problem_type_as_transformers_does(
        tmp_path, capsys):
    """One output and no problem_type is a regression (transformers' rule); read without
    num_labels, the check took it for single-label and said so."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"id2label": {"0": "score"}}))
    (tmp_path / "in.txt").write_text("a text\n")
    assert main(["predict", "--model", str(model), "--input", str(tmp_path / "in.txt"),
                 "--threshold", "0.3"]) == 1
    assert "is a regression model, which predicts without a threshold" in capsys.readouterr().err


def test_a_model_of_a_kind_not_registered_here_is_one_error_before_nprocs_workers(tmp_path, capsys):
    """Said by every rank before (each loaded the model), then 'rank 1 of 2 failed'."""
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"id2label": {"0": "a", "1": "b"}, "nlptrain_kind":
                                                   "ordinal", "problem_type": "multi_label_classification"}))
    (tmp_path / "in.txt").write_text("a text\n")
    assert main(["predict", "--model", str(model), "--input", str(tmp_path / "in.txt"),
                 "--nproc", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("trained as a task of kind 'ordinal'") == 1 and "[rank" not in err, err
