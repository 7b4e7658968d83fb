"""A classifier saved for the same number of labels: its head fits the labels trained now (it was
kept row for row, so a model fine-tuned again on labels read in another order said each the other
way round; review 119)."""

from __future__ import annotations

import pytest
import torch

from nlptrain.models import load_model


@pytest.fixture(scope="module")
def saved_classifier(tiny_model_dir, tmp_path_factory):
    """A tiny classifier of labels neg, pos, saved with a head whose rows differ."""
    folder = tmp_path_factory.mktemp("classifier")
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with torch.no_grad():
        model.classifier.weight.copy_(torch.arange(model.classifier.weight.numel(),
                                                   dtype=torch.float32).view_as(model.classifier.weight))
        model.classifier.bias.copy_(torch.tensor([1.0, 2.0]))
    model.save_pretrained(folder)
    return folder, model.classifier.weight.detach().clone(), model.classifier.bias.detach().clone()


def test_the_same_labels_in_another_order_reorder_the_heads_rows(saved_classifier, caplog):
    folder, weight, bias = saved_classifier
    with caplog.at_level("INFO", logger="nlptrain"):
        model = load_model(str(folder), ["pos", "neg"])
    assert torch.equal(model.classifier.weight, weight[[1, 0]])
    assert torch.equal(model.classifier.bias, bias[[1, 0]])
    assert model.config.id2label == {0: "pos", 1: "neg"}
    assert "trained for labels ['neg', 'pos'], is reordered to ['pos', 'neg']" in caplog.text
    same = load_model(str(folder), ["neg", "pos"])
    assert torch.equal(same.classifier.weight, weight) and torch.equal(same.classifier.bias, bias)


def test_other_labels_get_a_new_head_and_are_said(saved_classifier, caplog):
    folder, weight, bias = saved_classifier
    with caplog.at_level("WARNING", logger="nlptrain"):
        model = load_model(str(folder), ["x", "y"])
    assert not torch.equal(model.classifier.weight, weight)
    assert torch.equal(model.classifier.bias, torch.zeros(2))  # as transformers starts a head
    assert "head was trained for labels ['neg', 'pos'], not ['x', 'y']: a new head" in caplog.text
    encoder = load_model(str(folder), ["neg", "pos"]).bert.encoder.state_dict()
    assert all(torch.equal(v, encoder[k]) for k, v in model.bert.encoder.state_dict().items())


def test_transformers_default_label_names_keep_the_head(saved_classifier, tmp_path):
    """LABEL_0, LABEL_1: a config given no names says nothing of what the rows mean."""
    folder, weight, _ = saved_classifier
    from transformers import AutoModelForSequenceClassification

    unnamed = AutoModelForSequenceClassification.from_pretrained(str(folder),
                                                                 id2label={0: "LABEL_0", 1: "LABEL_1"})
    unnamed.save_pretrained(tmp_path / "unnamed")
    model = load_model(str(tmp_path / "unnamed"), ["pos", "neg"])
    assert torch.equal(model.classifier.weight, weight)


def test_an_encoder_saved_alone_with_its_classifiers_names_gets_a_new_head_unsaid(
        saved_classifier, tmp_path, caplog):
    """`clf.bert.save_pretrained`: the config keeps the classifier's label names, the weights
    hold no head. transformers starts one; nothing is reordered, nor said to be (review 123)."""
    folder, _, _ = saved_classifier
    load_model(str(folder), ["neg", "pos"]).bert.save_pretrained(tmp_path / "encoder")
    with caplog.at_level("INFO", logger="nlptrain"):
        model = load_model(str(tmp_path / "encoder"), ["pos", "neg"])
    assert "classifier head" not in caplog.text
    assert torch.equal(model.classifier.bias, torch.zeros(2))  # as transformers starts a head
    assert model.config.id2label == {0: "pos", 1: "neg"}


def test_a_head_saved_in_part_has_its_saved_rows_reordered(saved_classifier, tmp_path):
    """Only the bias missing from the file: the weight's rows are still the saved labels' (review
    126: the whole head was left in the saved order, each label predicted as the other)."""
    from safetensors.torch import load_file, save_file

    folder, weight, _ = saved_classifier
    (tmp_path / "part").mkdir()
    for path in folder.iterdir():
        if path.name != "model.safetensors":
            (tmp_path / "part" / path.name).write_bytes(path.read_bytes())
    tensors = load_file(folder / "model.safetensors")
    save_file({k: v for k, v in tensors.items() if k != "classifier.bias"},
              tmp_path / "part" / "model.safetensors", metadata={"format": "pt"})
    model = load_model(str(tmp_path / "part"), ["pos", "neg"])
    assert torch.equal(model.classifier.weight, weight[[1, 0]])
