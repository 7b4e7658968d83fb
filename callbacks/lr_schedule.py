"""Learning-rate schedule from `transformers.get_scheduler` (linear warmup then decay, ...)."""

from __future__ import annotations

from typing import Any

from transformers import get_scheduler

from nlptrain.events import Callback


class LRSchedule(Callback):
    """Makes `trainer.scheduler` at the first batch, when the steps per epoch are known (a
    callback may have swapped the data in on_train_start/on_epoch_start), and steps it after
    every optimizer step."""

    def __init__(self, name: str = "linear", warmup_ratio: float = 0.1) -> None:
        self.name = name
        self.warmup_ratio = warmup_ratio
        self._saved: dict | None = None

    def on_batch_start(self, trainer: Any, batch: dict) -> None:
        if trainer.scheduler is not None:
            return
        total = max(trainer.steps_per_epoch * trainer.config.epochs, 1)
        trainer.scheduler = get_scheduler(self.name, trainer.optimizer,
                                          num_warmup_steps=int(self.warmup_ratio * total),
                                          num_training_steps=total)
        if self._saved is not None:
            restore(trainer.scheduler, self._saved)

    def on_step_end(self, trainer: Any) -> None:
        trainer.scheduler.step()

    def on_save_checkpoint(self, trainer: Any, state: dict) -> None:
        if trainer.scheduler is not None:
            state["lr_scheduler"] = trainer.scheduler.state_dict()

    def on_load_checkpoint(self, trainer: Any, state: dict) -> None:
        self._saved = state.get("lr_scheduler")
        if self._saved is not None and trainer.scheduler is not None:
            restore(trainer.scheduler, self._saved)


def restore(scheduler: Any, state: dict) -> None:
    """Load a scheduler's state and put its lr back into the optimizer: a new scheduler has just
    set the lr of step 0 (0 in warmup), and load_state_dict alone does not undo that."""
    scheduler.load_state_dict(state)
    for group, lr in zip(scheduler.optimizer.param_groups, scheduler.get_last_lr(), strict=True):
        group["lr"] = lr
