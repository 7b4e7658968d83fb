"""`[train] max_steps`: the run ends after that many optimizer steps in all, also inside an epoch.

The stop is asked at the first micro-batch of the last step, so it travels with that step's
flags and every rank ends after exactly that step (a stop asked after a step ends the run one
step later: trainer.py, `_agree_on_step`). The epoch's end follows as after any stop: its
evaluation, `on_epoch_end` (and its checkpoint). The lr schedule plans over at most max_steps
(`LRSchedule.planned_total`), so it ends where the run does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)


class StepBudget(Callback):
    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.global_step >= self.max_steps:  # resumed at (or past) the budget
            if trainer.is_main:
                log.info("max_steps %d: the run has done %d steps; nothing left to train",
                         self.max_steps, trainer.global_step)
            trainer.should_stop = True

    def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
        if trainer.global_step + 1 >= self.max_steps:  # this micro-batch is of the last step
            if not trainer.should_stop and trainer.is_main:
                log.info("max_steps %d: step %d is the run's last", self.max_steps, self.max_steps)
            trainer.should_stop = True
