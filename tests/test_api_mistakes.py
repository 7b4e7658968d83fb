"""The Python API's plain mistakes are one error naming the cure when the Trainer is built, not
a torch error inside the first step (or, for an empty set, a run that trains nothing)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from nlptrain import TrainConfig, Trainer
from nlptrain.data import TokenizedDataset
from nlptrain.errors import ConfigError, DataError
from nlptrain.models import load_model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def rows(tokenizer, labels) -> TokenizedDataset:
    return TokenizedDataset.from_texts([f"text {i}" for i in range(len(labels))], labels,
                                       tokenizer, 16)


@pytest.mark.parametrize("make_train, error, message", [
    (lambda tok: rows(tok, []), DataError, r"^the train set holds no rows$"),
    (lambda tok: ["good film", "bad film"], DataError,
     r"^train data is a list of texts: tokenize it first, with TokenizedDataset\.from_texts\("),
    (lambda tok: rows(tok, [0, 1, 5, 1]), DataError,
     r"^train data: row index 2 has class id 5, but the model has 2 labels \(neg, pos\): ids 0 "
     r"to 1$"),
    (lambda tok: rows(tok, [[1.0, 0.0, 1.0]] * 2), DataError,
     r"^train data: its rows have 3 label columns, the model 2 labels \(neg, pos\)$"),
])
def test_bad_train_data_is_refused_when_the_trainer_is_built(tiny_model_dir, tokenizer, make_train,
                                                            error, message):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(error, match=message):
        Trainer(model, make_train(tokenizer), config=TrainConfig(epochs=1))


@pytest.mark.parametrize("config, message", [
    (TrainConfig(lr="3e-5"), r"^Trainer\(config=\.\.\.\): 'lr' must be float, got str '3e-5'$"),
    ({"epochs": 1, "learning_rate": 1e-4}, r"^Trainer\(config=\.\.\.\): unknown key "
                                           r"'learning_rate'\. Valid keys: epochs, "),
    ("epochs=1", r"^Trainer\(config=\.\.\.\): give a TrainConfig, or a dict of its keys, not str$"),
])
def test_a_config_of_the_wrong_keys_or_types_is_refused_naming_the_key(tiny_model_dir, tokenizer,
                                                                      config, message):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    with pytest.raises(ConfigError, match=message):
        Trainer(model, rows(tokenizer, [0, 1]), config=config)


def test_a_config_given_as_a_dict_of_its_keys_is_taken(tiny_model_dir, tokenizer):
    model = load_model(str(tiny_model_dir), ["neg", "pos"])
    trainer = Trainer(model, rows(tokenizer, [0, 1] * 4), config={"epochs": 2, "batch_size": 4})
    trainer.fit()
    assert (trainer.config.epochs, trainer.global_step) == (2, 4)
