"""Gradient clipping by global norm, once per optimizer step."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class GradClip(Callback):
    def __init__(self, max_norm: float = 1.0) -> None:
        self.max_norm = max_norm
        self.last_norm = float("nan")  # before clipping; logged by MetricLogger

    def on_backward_end(self, trainer: Trainer) -> None:
        if not trainer.is_update_step:  # gradients are complete on the update step only
            return
        trainer.scaler.unscale_(trainer.optimizer)  # fp16: clip the true gradients
        norm = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), self.max_norm)
        self.last_norm = float(norm)
