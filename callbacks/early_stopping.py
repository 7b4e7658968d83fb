"""Stop when the validation metric has not improved for `patience` evaluations."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from nlptrain import scores
from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)


class EarlyStopping(Callback):
    # Runs on every rank: metrics are gathered, so every rank counts the same and stops together.

    def __init__(self, patience: int = 2) -> None:
        self.patience = patience
        self.waited = 0
        self.warned = False

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        self.waited = 0 if is_best else self.waited + 1
        if self.waited >= self.patience:
            name, best = trainer.metric_for_best, trainer.best_metric
            score = scores.best_score(metrics, name)
            best_text = "none yet" if best is None else f"{best:.4f}"
            times = f"{self.waited} evaluation{'' if self.waited == 1 else 's'}"
            log.info(f"early stop at step {trainer.global_step}: {name} {score:.4f}, not better "
                     f"than the best ({best_text}) for {times} (patience {self.patience})")
            trainer.should_stop = True

    def on_epoch_end(self, trainer: Trainer) -> None:
        # Checked here, not at on_train_start: a later callback may set eval_data there.
        if trainer.eval_data is None and not self.warned and trainer.is_main:  # said once
            log.warning("early stopping has nothing to watch: the trainer has no eval_data, so "
                        "training runs all its epochs")
            self.warned = True

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        state["early_stopping_waited"] = self.waited

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        self.waited = int(state.get("early_stopping_waited", 0))
        # The stop was decided before this checkpoint was written: a resume (a restart after a
        # crash in the final test or export) must not train past it.
        if self.waited >= self.patience:
            trainer.should_stop = True
            log.info(f"early stopping had stopped this run at step {trainer.global_step} "
                     f"({self.waited} evaluations without a better {trainer.metric_for_best}, "
                     f"patience {self.patience}): nothing more is trained. To train on, resume "
                     "with a larger --early-stopping, or --early-stopping 0")
