"""A callback that gives nlptrain the tutorial loop's (a) optimizer and random-number use, to
replay (a)'s run exactly (see bench/README.md, "Replaying (a)"):

- `torch.optim.AdamW` with its defaults: weight decay 0.01 on every parameter, not fused;
- one draw from the global generator per epoch, as (a)'s DataLoader makes when its iterator
  starts (nlptrain's loader has a generator of its own), so dropout masks line up.
"""

from __future__ import annotations

from typing import Any

import torch

from nlptrain import Callback


class TutorialOptimizer(Callback):
    def on_train_start(self, trainer: Any) -> None:
        trainer.optimizer = torch.optim.AdamW(trainer.unwrapped_model.parameters(),
                                              lr=trainer.config.lr)

    def on_epoch_start(self, trainer: Any) -> None:
        torch.empty((), dtype=torch.int64).random_()
