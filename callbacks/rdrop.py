"""R-Drop (Liang et al. 2021): two dropout passes over each batch, their outputs pulled together.

Through the loss seam: this callback replaces `trainer.loss_fn` by one that runs a second
forward on the same batch (`trainer.forward`, another dropout mask) and returns

    (task_loss(first) + task_loss(second)) / 2 + alpha * consistency(first, second)

where `task_loss` is the loss it replaced (class weights, label smoothing included), and
`consistency` is the symmetric KL divergence between the two outputs of the kind:
`(KL(p||q) + KL(q||p)) / 2` over the softmax (single-label, summed over classes) or over each
label's Bernoulli (multi-label, summed over labels), averaged over rows; and the mean squared
difference for regression. Under DDP the two forwards precede one backward: one all-reduce.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from nlptrain.errors import ConfigError
from nlptrain.events import Callback
from nlptrain.kinds import MultiLabel, Regression, TaskKind

if TYPE_CHECKING:
    from nlptrain.trainer import LossFn, Trainer


def symmetric_kl(kind: TaskKind, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """The consistency term between two passes' logits, for this kind of output."""
    first, second = first.float(), second.float()
    if isinstance(kind, Regression):
        return F.mse_loss(first, second)
    if isinstance(kind, MultiLabel):  # each label a Bernoulli: log p and log (1 - p)
        first = torch.stack([F.logsigmoid(first), F.logsigmoid(-first)], dim=-1)
        second = torch.stack([F.logsigmoid(second), F.logsigmoid(-second)], dim=-1)
    else:
        first, second = first.log_softmax(dim=-1), second.log_softmax(dim=-1)
    p_q = F.kl_div(second, first, log_target=True, reduction="none").sum(dim=-1)  # KL(p || q)
    q_p = F.kl_div(first, second, log_target=True, reduction="none").sum(dim=-1)  # KL(q || p)
    rows = (p_q + q_p) / 2
    return rows.reshape(rows.shape[0], -1).sum(dim=-1).mean()


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
        return task + self.alpha * symmetric_kl(self._trainer.kind, logits, second)

    def on_train_start(self, trainer: Trainer) -> None:
        self._trainer, self.task_loss = trainer, trainer.loss_fn
        trainer.loss_fn = self.loss

    def on_train_end(self, trainer: Trainer) -> None:
        if self.task_loss is not None:
            trainer.loss_fn = self.task_loss
        self._trainer = None
