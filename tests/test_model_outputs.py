"""A user's own module's output, in each form it may take: logits as a tensor, a tuple, a dict,
an object or a NamedTuple with `logits`, read; a wrong size or shape, or no logits, named."""

from __future__ import annotations

import types
import typing

import pytest
import torch
from own_model import MeanPoolClassifier

from nlptrain import TrainConfig, Trainer


def test_an_own_model_of_the_wrong_output_size_is_named_not_a_tensor_error(tmp_path, tiny_model_dir):
    """Two outputs for a regression: torch's mse_loss said only 'The size of tensor a (32) must
    match the size of tensor b (16)'."""
    from toy_trainer import toy_datasets

    from nlptrain.errors import ConfigError
    from nlptrain.kinds import Regression

    train, test = toy_datasets(tmp_path, tiny_model_dir)
    train.labels = train.labels.astype("float32")  # scores
    trainer = Trainer(MeanPoolClassifier(tiny_model_dir, 2), train, test, kind=Regression(),
                      label_names=["score"], config=TrainConfig(epochs=1, batch_size=8))
    with pytest.raises(ConfigError, match=r"the model gives 2 output\(s\) a row, but this "
                                          r"regression task needs 1 \(one score a row\)"):
        trainer.fit()
    trainer.close()


class Squeezed(MeanPoolClassifier):
    def forward(self, *args, **kwargs):  # (rows,) for a regression: "gives 8 output(s) a row"
        return super().forward(*args, **kwargs).squeeze(-1)


class AsTuple(MeanPoolClassifier):
    def forward(self, *args, **kwargs):  # (logits,): "tuple indices must be integers"
        return (super().forward(*args, **kwargs),)


class LossAndLogits(typing.NamedTuple):
    loss: torch.Tensor
    logits: torch.Tensor


class AsObject(MeanPoolClassifier):
    def forward(self, *args, **kwargs):  # an object with logits, as the README allows
        return types.SimpleNamespace(logits=super().forward(*args, **kwargs))


class AsNamedTuple(MeanPoolClassifier):
    def forward(self, *args, **kwargs):  # (loss, logits): the loss was read as the logits
        return LossAndLogits(torch.tensor(0.0), super().forward(*args, **kwargs))


class AsText(MeanPoolClassifier):
    def forward(self, *args, **kwargs):
        return "logits"


@pytest.mark.parametrize(("model", "error", "message"), [
    (Squeezed, "ConfigError", r"the model gives logits of shape \(8,\), not \(rows, outputs\), "
                              r"but this regression task needs 1"),
    (AsTuple, None, ""),
    (AsObject, None, ""),  # was refused: "the model returned a SimpleNamespace"
    (AsNamedTuple, None, ""),
    (AsText, "TrainingError", r"the model returned a str: return the logits"),
])
def test_an_own_models_output_of_another_form_is_read_or_named(tmp_path, tiny_model_dir, model,
                                                               error, message):
    from toy_trainer import toy_datasets

    from nlptrain import errors
    from nlptrain.kinds import Regression

    train, test = toy_datasets(tmp_path, tiny_model_dir)
    train.labels = train.labels.astype("float32")
    test.labels = test.labels.astype("float32")
    trainer = Trainer(model(tiny_model_dir, 1), train, test, kind=Regression(),  # no label_names:
                      config=TrainConfig(epochs=1, batch_size=8), progress=False)  # one score
    if error is None:
        assert "pearson" in trainer.fit()
    else:
        with pytest.raises(getattr(errors, error), match=message):
            trainer.fit()
    trainer.close()
