"""Stop when the validation metric has not improved for `patience` evaluations."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)


class EarlyStopping(Callback):
    # Runs on every rank: metrics are gathered, so every rank counts the same and stops together.

    def __init__(self, patience: int = 2) -> None:
        self.patience = patience
        self.waited = 0

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        self.waited = 0 if is_best else self.waited + 1
        if self.waited >= self.patience:
            log.info("early stop: %s did not improve for %d evaluations",
                     trainer.metric_for_best, self.waited)
            trainer.should_stop = True

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        state["early_stopping_waited"] = self.waited

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        self.waited = int(state.get("early_stopping_waited", 0))
        # The stop was decided before this checkpoint was written: a resume (a restart after a
        # crash in the final test or export) must not train past it.
        if self.waited >= self.patience:
            trainer.should_stop = True
