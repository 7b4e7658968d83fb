"""R-Drop (Liang et al. 2021): two dropout passes over each batch, their outputs pulled together.

Through the loss seam: this callback replaces `trainer.loss_fn` by one that runs a second
forward on the same batch (`trainer.forward`, another dropout mask) and returns

    (task_loss(first) + task_loss(second)) / 2 + alpha * consistency(first, second)

where `task_loss` is the loss it replaced (class weights, label smoothing included), and
`consistency` is the kind's `consistency_loss` of the two outputs: the symmetric KL divergence
`(KL(p||q) + KL(q||p)) / 2` over the softmax (single-label, summed over classes) or over each
label's Bernoulli (multi-label, summed over labels), averaged over rows; the mean squared
difference for regression. Under DDP the two forwards precede one backward: one all-reduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nlptrain.errors import ConfigError
from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import LossFn, Trainer


class RDrop(Callback):
    def __init__(self, alpha: float = 1.0) -> None:
        if not alpha > 0:  # a negative weight rewards the two passes for disagreeing
            raise ConfigError(f"RDrop(alpha={alpha}): the consistency term's weight must be > 0")
        self.alpha = alpha
        self.task_loss: LossFn | None = None
        self._trainer: Trainer | None = None

    def loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        second = self._trainer.forward(self._trainer.batch)  # the micro-batch being trained
        task = (self.task_loss(logits, targets) + self.task_loss(second, targets)) / 2
        return task + self.alpha * self._trainer.kind.consistency_loss(logits, second)

    def on_train_start(self, trainer: Trainer) -> None:
        self._trainer, self.task_loss = trainer, trainer.loss_fn
        trainer.loss_fn = self.loss

    def on_train_end(self, trainer: Trainer) -> None:
        if self.task_loss is not None:
            trainer.loss_fn = self.task_loss
        self._trainer = None
