"""`[train] max_steps`: the run ends after that many optimizer steps in all, also inside an epoch.

The loop itself ends the run after step max_steps (`Trainer._train_batch`): every rank knows
the step count, so no flag is agreed and no micro-batch is begun past it (a `should_stop` asked
in a step event is read with the next step's flags: step_agreement.py, `_agree_on_step`). This callback
stops a run resumed at or past its budget, and says where the run ends. The epoch's end follows
as after any stop: its evaluation, `on_epoch_end` (and its checkpoint). The lr schedule plans
over at most max_steps (`LRSchedule.planned_total`), so it ends where the run does. A
StepBudget of the user's (which replaces the config's) sets the trainer's `max_steps` to its own:
the loop and the schedule read it there.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)


class StepBudget(Callback):
    def __init__(self, max_steps: int) -> None:
        self.max_steps = max_steps

    def on_train_start(self, trainer: Trainer) -> None:
        if trainer.config.max_steps != self.max_steps:  # it logged its budget, trained them all
            trainer.config = replace(trainer.config, max_steps=self.max_steps)
        if trainer.global_step >= self.max_steps:  # resumed at (or past) the budget
            if trainer.is_main:
                log.info("max_steps %d: the run has done %d steps; nothing left to train",
                         self.max_steps, trainer.global_step)
            trainer.should_stop = True

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.global_step == self.max_steps and trainer.is_main:
            log.info("max_steps %d: the run ends at this step", self.max_steps)

    def on_train_end(self, trainer: Trainer) -> None:
        # Unlike transformers' max_steps, it does not lengthen the run past its epochs: said.
        if trainer.epoch >= trainer.config.epochs and trainer.global_step < self.max_steps \
                and not trainer.should_stop and trainer.is_main:  # (not a callback's stop)
            log.warning("max_steps %d: the run's %d epoch(s) ended it first, at step %d (max_steps "
                        "stops a run, it does not lengthen one: raise epochs for more steps)",
                        self.max_steps, trainer.config.epochs, trainer.global_step)
