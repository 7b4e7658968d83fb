"""The exported model is a plain `transformers` model: pipeline() loads it, names the labels, and
scores the test rows exactly as nlptrain's own evaluation did."""

from __future__ import annotations

import json

from nlptrain.cli import main


def test_pipeline_loads_the_export_and_matches_nlptrain_accuracy(toy_task, tmp_path):
    from transformers import pipeline

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "3"]) == 0
    ours = json.loads((run / "results.json").read_text())["test"]

    rows = [line.split("\t") for line in (toy_task.parent / "test.tsv").read_text().splitlines()[1:]]
    classify = pipeline("text-classification", model=str(run / "model"), device="cpu")
    assert classify.tokenizer.model_max_length == 32  # the task's max_length, not the model's
    found = classify([text for text, _ in rows], truncation=True, batch_size=16)
    assert {f["label"] for f in found} <= {"neg", "pos"}  # label names, not LABEL_0
    correct = sum(f["label"] == label for f, (_, label) in zip(found, rows, strict=True))
    assert correct == ours["correct"] and len(rows) == ours["rows"]
