"""Periodic checkpoints (every N steps and at epoch ends), and one more on SIGTERM/SIGINT."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nlptrain.checkpoint import checkpoint_name, save_checkpoint
from nlptrain.errors import Interrupted
from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class Checkpointer(Callback):
    # Every rank runs it: the RNG states of all ranks are gathered, rank 0 writes.
    # A step's checkpoint is written once the step is over: after its evaluation (eval_every, or
    # the epoch's end, for the epoch's last step) and after what every callback made of it
    # (runs_last: best_metric, early stopping's count, the best model's metrics). Written
    # sooner, it would miss them, and a resume from it would never run that evaluation again.
    runs_last = True

    def __init__(self, folder: str | Path, every: int = 0, keep: int = 2) -> None:
        self.folder = Path(folder)
        self.every = every
        self.keep = keep
        self.last_saved_step = -1

    def save(self, trainer: Trainer) -> None:
        if trainer.global_step != self.last_saved_step:
            save_checkpoint(trainer, self.folder / checkpoint_name(trainer.global_step), self.keep)
            self.last_saved_step = trainer.global_step

    def on_batch_end(self, trainer: Trainer) -> None:
        due = trainer.is_update_step and self.every and trainer.global_step % self.every == 0
        if due and not trainer.progress.ended_epoch():  # an epoch's last step: at on_epoch_end
            self.save(trainer)

    def on_epoch_end(self, trainer: Trainer) -> None:
        self.save(trainer)

    def on_exception(self, trainer: Trainer, error: BaseException) -> None:
        if isinstance(error, Interrupted):  # all ranks stopped at the same step: safe to save
            self.save(trainer)
