"""Periodic checkpoints (every N steps, every M minutes and at epoch ends), and one more on
SIGTERM/SIGINT."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from nlptrain.checkpoint import PREFIX, checkpoint_name, save_checkpoint, step_folders
from nlptrain.errors import Interrupted
from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger("nlptrain")


class Checkpointer(Callback):
    # Every rank runs it: the RNG states of all ranks are gathered, rank 0 writes.
    # A step's checkpoint is written once the step is over: after its evaluation (eval_every, or
    # the epoch's end, for the epoch's last step and the run's) and after what every callback made of it
    # (runs_last: best_metric, early stopping's count, the best model's metrics). Written
    # sooner, it would miss them, and a resume from it would never run that evaluation again.
    # (A callback's stop rides the step's flags, which fused AdamW reads a step late: read first.)
    runs_last = True
    saves_on_stop = True  # (on_exception of Interrupted): a signal's stop says how to resume

    def __init__(self, folder: str | Path, every: int = 0, keep: int = 2, every_minutes: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = Path(folder)
        self.every = every
        self.keep = keep
        self.every_minutes = every_minutes  # a hard crash (SIGKILL, a lost machine) loses no more
        self.clock = clock
        self.last_saved_step = -1
        self._since = clock()  # the latest save (or the start), on this rank's clock
        self._asked = False    # this rank has asked for a save since the latest one

    def save(self, trainer: Trainer) -> None:
        trainer.save_asked_at = None  # what any rank asked for is served by this save
        if trainer.global_step != self.last_saved_step:
            save_checkpoint(trainer, self.folder / checkpoint_name(trainer.global_step), self.keep)
            self.last_saved_step = trainer.global_step
        self._since, self._asked = self.clock(), False

    def on_train_start(self, trainer: Trainer) -> None:
        self._since = self.clock()
        trainer.dist.on_main(lambda: self.set_aside_later_steps(trainer.global_step))

    def set_aside_later_steps(self, start: int) -> None:
        """Checkpoints in the folder past the step this run starts from are another run's (the
        one this resume branches off at an earlier step, or an older run): numbered higher,
        they would outlive this run's own in pruning and be what the next restart resumes from.
        They are renamed `step-N-set-aside-TIME`, names nlptrain neither lists nor prunes."""
        later = [p for p in step_folders(self.folder) if int(p.name[len(PREFIX):]) > start]
        stamp = time.strftime("%Y%m%d-%H%M%S")
        for folder in later:
            folder.rename(folder.with_name(f"{folder.name}-set-aside-{stamp}"))
        if later:
            log.warning("%s: %s past step %d, where this run starts, set aside as *-set-aside-%s "
                        "(kept; another run's, which a restart must not resume)", self.folder,
                        ", ".join(p.name for p in later), start, stamp)

    def on_step_end(self, trainer: Trainer) -> None:
        # One clock decides (the main rank's: the ranks' differ, and two asking a step apart
        # would save twice); its request rides the step's agreed flags, and every rank saves
        # at the step where they read it (`trainer.save_asked_at`).
        overdue = self.every_minutes and self.clock() - self._since >= 60 * self.every_minutes
        if overdue and trainer.is_main and not self._asked:
            trainer.should_save, self._asked = True, True

    def on_batch_end(self, trainer: Trainer) -> None:
        asked = trainer.save_asked_at
        if asked is not None and asked <= self.last_saved_step:  # a save since has served it
            trainer.save_asked_at = asked = None
        every = self.every and trainer.global_step % self.every == 0
        due = trainer.is_update_step and (every or asked is not None)
        if due:  # (due on every rank alike) the step's flags: a stop they carry is known now
            trainer.settle()
        # An epoch's last step, or the run's (its evaluation is still to come): at on_epoch_end.
        if due and not trainer.progress.ended_epoch() and not trainer.stopping:
            by_clock = self._asked  # the main rank's own request (the one that logs)
            self.save(trainer)
            if not every:  # asked for, by the clock or a callback: rare enough to say
                log.info("checkpoint at step %d (%s)", trainer.global_step,
                         f"{self.every_minutes:g} min since the last" if by_clock
                         else "asked for by a callback's should_save")

    def on_epoch_end(self, trainer: Trainer) -> None:
        self.save(trainer)

    def on_exception(self, trainer: Trainer, error: BaseException) -> None:
        if isinstance(error, Interrupted):  # all ranks stopped at the same step: safe to save
            self.save(trainer)
