"""Periodic checkpoints (every N steps and at epoch ends), and one more on SIGTERM/SIGINT."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nlptrain.checkpoint import checkpoint_name, save_checkpoint
from nlptrain.errors import Interrupted
from nlptrain.events import Callback

if TYPE_CHECKING:
    import torch

    from nlptrain.trainer import Trainer


class Checkpointer(Callback):
    # Every rank runs it: the RNG states of all ranks are gathered, rank 0 writes.
    # A step's checkpoint is written once the step is over: after its evaluation (eval_every, or
    # the epoch's end) and what every callback made of it (best_metric, early stopping's count,
    # the best model's metrics). Written at on_step_end, it would miss them, and a resume from it
    # would never run that evaluation again.

    def __init__(self, folder: str | Path, every: int = 0, keep: int = 2) -> None:
        self.folder = Path(folder)
        self.every = every
        self.keep = keep
        self.last_saved_step = -1
        self.due = False  # a periodic checkpoint of the step just ended, not yet written

    def save(self, trainer: Trainer) -> None:
        self.due = False
        if trainer.global_step != self.last_saved_step:
            save_checkpoint(trainer, self.folder / checkpoint_name(trainer.global_step), self.keep)
            self.last_saved_step = trainer.global_step

    def on_step_end(self, trainer: Trainer) -> None:
        if self.every and trainer.global_step % self.every == 0:
            self.due = True

    def on_batch_start(self, trainer: Trainer, batch: dict[str, torch.Tensor]) -> None:
        if self.due:  # the previous step, its evaluation included, is over
            self.save(trainer)

    def on_epoch_end(self, trainer: Trainer) -> None:
        self.save(trainer)

    def on_exception(self, trainer: Trainer, error: BaseException) -> None:
        if isinstance(error, Interrupted):  # all ranks stopped at the same step: safe to save
            self.save(trainer)
