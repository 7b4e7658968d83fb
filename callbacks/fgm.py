"""Adversarial training on the word embeddings (FGM, Miyato et al. 2017), one all-reduce a step.

For each micro-batch: a clean forward/backward, then the word embeddings are moved by
`r = epsilon * g / ||g||` along that pass's own gradient `g` of the embedding matrix, the loop's
forward/backward runs on the perturbed embeddings (its gradient adds to the clean one), and the
embeddings are restored exactly. The optimizer steps on clean + adversarial gradients.

How it holds under DDP and accumulation: the clean pass runs here, at on_batch_start, under
`no_sync` on every micro-batch, so it never all-reduces; the loop's pass is the one that
all-reduces on the update step, and it then carries both gradients: one all-reduce per optimizer
step, as without FGM. `g` is caught by a hook on the embedding weight during the clean backward,
so it is this micro-batch's gradient, not the sum accumulated so far (a common slip). Clipping
(on_backward_end) sees the complete gradient.

`trainer.last_loss` (and the logs) are the loss on the perturbed embeddings; `clean_loss` holds
this rank's clean loss of the latest micro-batch, a 0-d tensor on the device. Nothing here reads a
value back to the host, so FGM keeps the step free of stalls (tests/test_host_syncs.py).
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

import torch

from nlptrain.errors import ConfigError
from nlptrain.events import Callback
from nlptrain.precision import autocast

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger("nlptrain")


def word_embeddings(model: torch.nn.Module) -> torch.nn.Parameter:
    embeddings = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if embeddings is None:
        raise ConfigError(f"{type(model).__name__} has no get_input_embeddings(): FGM perturbs the "
                          "word embeddings")
    return embeddings.weight


class FGM(Callback):
    def __init__(self, epsilon: float = 1.0) -> None:
        if not epsilon > 0:  # a negative one moves the embeddings to a lower loss, not a higher
            raise ConfigError(f"FGM(epsilon={epsilon}): the step along the gradient must be > 0")
        self.epsilon = epsilon
        self._said_frozen = False
        self.clean_loss = torch.tensor(math.nan)  # this rank's clean loss, on the device
        self._restore: tuple[torch.Tensor, torch.Tensor] | None = None  # (rows, their values)

    def on_train_start(self, trainer: Trainer) -> None:
        # FSDP2 computes with gathered copies of the sharded embedding matrix: a hook on the
        # sharded parameter never fires, so FGM would silently add the clean gradient twice.
        if trainer.strategy.shards_parameters:
            raise ConfigError("FGM moves rows of the whole word-embedding matrix, which FSDP2 "
                              "shards across the ranks: train with strategy = \"ddp\"")
        if len(trainer.callbacks.find(FGM)) > 1:  # each restores its rows: the later one's move
            # stayed in the weights (restored in the order they were listed, not the reverse)
            raise ConfigError(f"{len(trainer.callbacks.find(FGM))} FGM callbacks: give one")

    def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
        weight = word_embeddings(trainer.unwrapped_model)
        if not weight.requires_grad:  # frozen (Freeze): no gradient to follow, a plain step
            if trainer.is_main and not self._said_frozen:
                log.warning("FGM: the word embeddings are frozen (a Freeze, say), so there is no "
                            "adversarial pass until they train (a gradual Freeze unfreezes them "
                            "last); step %d", trainer.global_step + 1)
            self._said_frozen = True
            return
        caught: list[torch.Tensor] = []
        hook = weight.register_hook(lambda grad: caught.append(grad.detach()))
        try:
            with trainer.strategy.no_sync(trainer.model, skip_sync=True):  # never all-reduces
                with autocast(trainer.device, trainer.config.precision):
                    loss = trainer.loss_fn(trainer.forward(batch), batch["labels"])
                trainer.backward(loss)
        finally:
            hook.remove()
        self.clean_loss = loss.detach()
        if not caught:
            return
        grad = sum(caught[1:], caught[0])
        norm = grad.float().norm()
        # No direction (a zero gradient, or an fp16 overflow the scaler will skip): no move.
        # Decided on the device, as is everything here, so the step never waits for the host.
        usable = torch.isfinite(norm) & (norm > 0)
        # The batch's token rows, repeats and all (`unique()` would read its size back to the
        # host): the gradient is zero on every other row, and a repeat writes the same value.
        rows = batch["input_ids"].flatten().to(weight.device)
        with torch.no_grad():
            self._restore = (rows, weight[rows].clone())
            move = torch.where(usable, self.epsilon * grad[rows] / norm, 0.0)
            weight[rows] += move.to(weight.dtype)

    def on_backward_end(self, trainer: Trainer) -> None:
        if self._restore is not None:
            rows, values = self._restore
            with torch.no_grad():
                word_embeddings(trainer.unwrapped_model)[rows] = values
            self._restore = None

    def on_exception(self, trainer: Trainer, error: BaseException) -> None:
        self.on_backward_end(trainer)  # never leave the embeddings perturbed
