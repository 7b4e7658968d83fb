"""The task-kind seam: a kind defined outside nlptrain (tests/kind_helpers.py's `Ordinal`) and
registered in `KINDS` trains, evaluates, exports and predicts through the Python API and a task
file, with no change to nlptrain: everything kind-specific is asked of the kind."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from kind_helpers import LEVELS, Ordinal, rating_rows, write_ordinal_task

from nlptrain import TrainConfig, Trainer
from nlptrain import kinds as kinds_module
from nlptrain.errors import ConfigError
from nlptrain.kinds import KINDS, from_model_config, from_run_config


@pytest.fixture
def ordinal(monkeypatch):
    """The kind registered for this test alone, as a package of the user's would register it."""
    monkeypatch.setitem(KINDS, Ordinal.name, Ordinal)
    return Ordinal


def tiny_bert(tokenizer, outputs: int):
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=128,
                        num_labels=outputs)
    torch.manual_seed(0)
    return BertForSequenceClassification(config)


def rating_set(tokenizer, rows: int, seed: int):
    from nlptrain.data import TokenizedDataset

    texts, levels = zip(*rating_rows(rows, seed), strict=True)
    return TokenizedDataset.from_texts(list(texts), np.array([LEVELS.index(v) for v in levels]),
                                       tokenizer, 32)


def test_a_kind_of_the_users_fits_and_evaluates_through_the_python_api(ordinal, tiny_model_dir):
    from nlptrain.callbacks import RDrop
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = tiny_bert(tokenizer, len(LEVELS))
    train, test = rating_set(tokenizer, 120, 1), rating_set(tokenizer, 30, 2)
    config = TrainConfig(epochs=4, batch_size=8, lr=1e-3, metric_for_best="mae")
    trainer = Trainer(model, train, test, config=config, kind="ordinal", label_names=LEVELS,
                      callbacks=[RDrop(alpha=0.5)], progress=False)  # by name: KINDS is read live
    assert isinstance(trainer.kind, Ordinal)
    before = trainer.evaluate(test)
    trainer.fit()
    after = trainer.evaluate(test)
    assert {"rows", "accuracy", "mae", "loss", "per_class"} <= set(after) and after["rows"] == 30
    assert after["loss"] < before["loss"] and after["mae"] < before["mae"], (before, after)
    # The metrics are the kind's, of the gathered outputs (one sigmoid an output, a row each).
    outputs, truth = trainer.predictions.outputs, trainer.predictions.labels
    assert outputs.shape == (30, len(LEVELS)) and ((outputs > 0) & (outputs < 1)).all()
    assert after["accuracy"] == pytest.approx(float((trainer.kind.level(outputs) == truth).mean()))
    assert set(after["per_class"]) == set(LEVELS)
    # The model's config says what it was trained for, though its problem_type is multi-label's.
    assert model.config.nlptrain_kind == "ordinal"
    assert model.config.problem_type == "multi_label_classification"
    assert isinstance(from_model_config(model.config), Ordinal)


def test_the_fine_tuning_keys_it_does_not_take_are_refused_as_for_any_kind(ordinal, tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model, train = tiny_bert(tokenizer, len(LEVELS)), rating_set(tokenizer, 8, 1)
    for key, value, said in (("class_weights", [1.0, 1.0, 1.0],
                              "class_weights is for single_label or multi_label tasks, not ordinal"),
                             ("label_smoothing", 0.1, "label_smoothing is for single_label tasks, "
                                                      "not ordinal")):
        with pytest.raises(ConfigError, match=said):
            Trainer(model, train, config=TrainConfig(**{key: value}), kind=Ordinal(),
                    label_names=LEVELS)


def test_its_settings_and_name_are_a_task_files_choices(ordinal):
    from nlptrain.task_files import task_from_dict

    task = task_from_dict({"data": {"kind": "ordinal", "threshold": 0.4}}, "t.toml")
    assert kinds_module.from_task(task).threshold == 0.4
    saved = {"task": {"data": {"kind": "ordinal", "threshold": 0.4}}}
    assert isinstance(from_run_config(saved), Ordinal) and from_run_config(saved).threshold == 0.4
    with pytest.raises(ConfigError, match=r"\[data\] threshold is for multi_label or ordinal tasks; "
                                          r"this one is single_label"):
        task_from_dict({"data": {"threshold": 0.4}}, "t.toml")
    with pytest.raises(ConfigError, match="is not a metric of ordinal tasks"):
        task_from_dict({"data": {"kind": "ordinal"}, "train": {"metric_for_best": "pearson"}},
                       "t.toml")


def test_a_kind_of_the_users_runs_from_a_task_file(ordinal, tmp_path, tiny_model_dir, capsys):
    from nlptrain.cli import main

    task = write_ordinal_task(tmp_path, tiny_model_dir)
    run = tmp_path / "run"
    assert main(["train", "--task", str(task), "--output-dir", str(run)]) == 0
    results = json.loads((run / "results.json").read_text())
    assert {"accuracy", "mae"} <= set(results["test"]) and {"accuracy", "mae"} <= set(results["valid"])
    exported = json.loads((run / "model" / "config.json").read_text())
    assert exported["nlptrain_kind"] == "ordinal"
    assert exported["id2label"] == {str(i): level for i, level in enumerate(LEVELS)}
    card = (run / "model" / "README.md").read_text()  # its usage lines are the kind's
    assert "ordinal model" in card and "how many of the first 2 scores are >= 0.5" in card
    # eval reads the kind back from the export, and scores as the run did
    capsys.readouterr()
    assert main(["eval", "--model", str(run / "model"), "--task", str(task), "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)
    assert scored["accuracy"] == pytest.approx(results["test"]["accuracy"])
    assert scored["mae"] == pytest.approx(results["test"]["mae"])
    (tmp_path / "in.txt").write_text("row 1 was so superb\nrow 2 was awful\n")
    assert main(["predict", "--model", str(run / "model"), "--input", str(tmp_path / "in.txt"),
                 "--format", "jsonl"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(rows) == 2 and all(row["label"] in LEVELS and "score" in row for row in rows)


def test_a_model_of_a_kind_not_registered_here_is_refused_not_read_as_another():
    """Its problem_type is another kind's (transformers has three): read as that one, predict
    would have put a softmax on a head trained for another rule."""
    from transformers import BertConfig

    config = BertConfig(problem_type="multi_label_classification", nlptrain_kind="ordinal")
    with pytest.raises(ConfigError, match="trained as a task of kind 'ordinal'.*not registered"):
        from_model_config(config)


def test_a_run_record_whose_kind_is_not_a_name_is_the_task_files_error(tmp_path):
    from nlptrain.run_record import recorded_task

    record = {"task": {"data": {"kind": ["regression"]}}, "world_size": 1}
    (tmp_path / "config.json").write_text(json.dumps(record))
    with pytest.raises(ConfigError, match=r"'kind' must be str, got list"):
        recorded_task(tmp_path)
