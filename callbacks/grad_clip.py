"""Gradient clipping by global norm, once per optimizer step."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class GradClip(Callback):
    def __init__(self, max_norm: float = 1.0) -> None:
        self.max_norm = max_norm
        self._norm: Any = None  # on the device: read only when asked (a host sync)

    @property
    def last_norm(self) -> float:
        """The latest step's global gradient norm, before clipping."""
        return float("nan") if self._norm is None else float(self._norm)

    def on_backward_end(self, trainer: Trainer) -> None:
        if not trainer.is_update_step:  # gradients are complete on the update step only
            return
        trainer.scaler.unscale_(trainer.optimizer)  # fp16: clip the true gradients
        # The global norm, equal on every rank (under FSDP2 a collective over the shards).
        self._norm = trainer.strategy.clip_grad_norm(trainer.model, self.max_norm)


def logged_grad_norm(trainer: Trainer) -> float | None:
    """What the loggers write as `grad_norm`: the latest optimizer step's global gradient norm
    before clipping, read to the host (a device sync: call it on logged steps only); None when the
    run does not clip (`max_grad_norm = 0`) or the norm is not finite (an fp16 step whose
    overflow the loss scaler skips; JSON has no infinity)."""
    clips = trainer.callbacks.find(GradClip)
    norm = clips[0].last_norm if clips else math.nan
    return norm if math.isfinite(norm) else None
