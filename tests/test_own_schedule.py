"""A schedule of the user's: a shape given to the LRSchedule callback is followed; a torch
scheduler set on the trainer, which nothing would step, is refused in one line (it failed in
LRSchedule with an AttributeError; review 122)."""

from __future__ import annotations

import pytest
from nlptrain.callbacks import LRSchedule
from toy_trainer import make_trainer

from nlptrain import Callback
from nlptrain.errors import ConfigError


class Halving(LRSchedule):
    def make_shape(self, warmup: float):
        return lambda progress: 0.5 ** (progress * 4)


class LrAtEachStep(Callback):
    def __init__(self) -> None:
        self.lrs: list[float] = []

    def on_step_end(self, trainer) -> None:
        self.lrs.append(trainer.optimizer.param_groups[0]["lr"])


def test_a_shape_of_your_own_sets_the_lr_of_each_step(tmp_path, tiny_model_dir):
    lrs = LrAtEachStep()
    trainer = make_trainer(tmp_path, tiny_model_dir, [Halving(), lrs], batch_size=8, epochs=2,
                           lr=1e-3)
    trainer.fit()
    steps = trainer.global_step
    # after step k the next step's lr: progress k / steps of the run
    assert lrs.lrs == pytest.approx([1e-3 * 0.5 ** (4 * k / steps) for k in range(1, steps + 1)])


def test_a_torch_scheduler_set_on_the_trainer_is_refused_in_one_line(tmp_path, tiny_model_dir):
    import torch

    trainer = make_trainer(tmp_path, tiny_model_dir, [], batch_size=8)
    trainer.scheduler = torch.optim.lr_scheduler.StepLR(trainer.optimizer, 2, 0.5)
    with pytest.raises(ConfigError, match=r"^trainer.scheduler is a StepLR of yours, which nothing "
                                          r"steps: .* subclass LRSchedule, override make_shape"):
        trainer.fit()
