"""The exported model is a plain `transformers` model: pipeline() loads it, names the labels, and
scores the test rows exactly as nlptrain's own evaluation did."""

from __future__ import annotations

import json

import pytest
import torch
from kinds_data import write_kind_task

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


def test_an_export_from_the_python_api_keeps_how_its_rows_were_read(tmp_path, tiny_model_dir,
                                                                   capsys):
    """A pair model trained through the Python API at max_length 24: its export says so, and
    `predict` asks for pairs and truncates at 24 (it read single texts at 512 before)."""
    from transformers import AutoTokenizer

    from nlptrain import TrainConfig, Trainer
    from nlptrain.data import TokenizedDataset
    from nlptrain.models import load_model

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    firsts, seconds = [f"row {i} was good" for i in range(16)], [f"it felt {i}" for i in range(16)]
    train = TokenizedDataset.from_texts(firsts, [i % 2 for i in range(16)], tokenizer, 24,
                                        pairs=seconds)
    assert train.select([0, 1]).max_length == 24 and train.select([0, 1]).pairs
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, tokenizer=tokenizer,
                      config=TrainConfig(epochs=1, batch_size=8))
    trainer.fit()
    trainer.strategy.export(trainer.model, tokenizer, tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert (saved["nlptrain_max_length"], saved["nlptrain_text_pair"]) == (24, True)
    assert saved["nlptrain_precision"] == trainer.precision.precision  # predict scores in it
    # pipeline(..., truncation=True) truncates at 24 too; the caller's tokenizer is left as it was
    assert AutoTokenizer.from_pretrained(str(tmp_path / "model")).model_max_length == 24
    assert tokenizer.model_max_length != 24
    (tmp_path / "in.tsv").write_text("text\ttext_pair\na good film\tit felt fine\n")
    assert main(["predict", "--model", str(tmp_path / "model"), "--input", str(tmp_path / "in.tsv"),
                 "--log-level", "info"]) == 0
    out, err = capsys.readouterr()
    assert "max length 24" in err and len(out.splitlines()) == 2, err
    assert main(["predict", "--model", str(tmp_path / "model"), "--input", str(tmp_path / "in.tsv"),
                 "--text-pair-column", ""]) == 1
    assert "was trained on text pairs" in capsys.readouterr().err


@pytest.mark.parametrize("how", ["streaming", "per-rank files"])
def test_an_export_from_rows_read_per_rank_keeps_how_they_were_read(tmp_path, tiny_model_dir, how):
    """A pair task read as a stream or from per-rank files (no rank holds the train set) records
    its max_length and pairs too, and the exported tokenizer truncates at the task's 32."""
    from transformers import AutoTokenizer

    task = write_kind_task(tmp_path, tiny_model_dir, "pair", epochs=1)
    extra = ["--streaming"]
    if how == "per-rank files":
        assert main(["split", "--task", str(task), "--world-size", "1",
                     "--out", str(tmp_path / "parts")]) == 0
        extra = ["--train-shards", str(tmp_path / "parts")]
    assert main(["train", "--task", str(task), "--output-dir", str(tmp_path / "run"), *extra]) == 0
    model = tmp_path / "run" / "model"
    saved = json.loads((model / "config.json").read_text())
    assert (saved["nlptrain_max_length"], saved["nlptrain_text_pair"]) == (32, True)
    assert AutoTokenizer.from_pretrained(str(model)).model_max_length == 32


def test_label_names_given_to_the_trainer_are_the_exports(tmp_path, tiny_model_dir):
    """The ids of the data mean the names given to the Trainer, not those the model came with:
    its export names them so (it kept the model's, and predict said every label the other way)."""
    from transformers import AutoTokenizer

    from nlptrain import Trainer
    from nlptrain.data import TokenizedDataset
    from nlptrain.models import load_model

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    train = TokenizedDataset.from_texts(["a", "b"], [0, 1], tokenizer, 16)
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, tokenizer=tokenizer,
                      label_names=["pos", "neg"])
    trainer.strategy.export(trainer.model, tokenizer, tmp_path / "model")
    saved = json.loads((tmp_path / "model" / "config.json").read_text())
    assert saved["id2label"] == {"0": "pos", "1": "neg"}
    assert saved["label2id"] == {"pos": 0, "neg": 1}
    # the head trained for neg, pos: its rows follow the names given (review 123)
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    rows = model.classifier.weight.detach().clone()
    Trainer(model, train, tokenizer=tokenizer, label_names=["pos", "neg"])
    assert torch.equal(model.classifier.weight, rows[[1, 0]])
