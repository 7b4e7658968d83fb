"""Progress on rank 0: a tqdm bar on a terminal; in a log file (CI, nohup, SLURM), one plain line
every `log_every_s` seconds instead of a bar redrawn with carriage returns."""

from __future__ import annotations

import math
import os
import sys
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from tqdm.auto import tqdm

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class ProgressBar(Callback):
    main_process_only = True

    def __init__(self, refresh_every: int | None = None, log_every_s: float = 30.0,
                 plain: bool | None = None, stream: IO[str] | None = None,
                 clock: Callable[[], float] = time.monotonic, eval_name: str = "eval",
                 marks_best: bool = True) -> None:
        # Optimizer steps between reads of the loss for the bar and the plain lines (None: the
        # trainer's log_every): a read is a device sync, so it comes where the loop logs anyway.
        self.refresh_every = refresh_every
        self.loss = math.nan  # the latest loss read
        self.eval_name = eval_name  # the set the evaluations score: "validation", "test"
        self.marks_best = marks_best  # False where no best model is kept (scoring the test set)
        self.log_every_s = log_every_s
        self.plain = plain  # None: plain lines when the stream is not a terminal
        self.stream = stream
        self.clock = clock
        self.bar: Any = None
        self._epoch_start: float | None = None
        self._first_batch = 0  # where this process took the epoch up (a resume: mid-epoch)
        self._last_line = 0.0

    def _out(self) -> IO[str]:
        return self.stream or sys.stderr  # read late: the stream may be redirected meanwhile

    def _is_plain(self) -> bool:
        if self.plain is None:  # a terminal of no width (some CI and container shells): tqdm
            isatty = getattr(self._out(), "isatty", None)  # draws nothing there
            self.plain = not (isatty and isatty() and _columns(self._out()) > 0)
        return self.plain

    def on_epoch_start(self, trainer: Trainer) -> None:
        self._close()
        self._epoch_start = None

    def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
        if self._is_plain():
            if self._epoch_start is None:
                self._epoch_start = self._last_line = self.clock()
                self._first_batch = trainer.batch_in_epoch
        elif self.bar is None:  # the batch count is known only now (data may have been swapped)
            self.bar = tqdm(total=_batches_this_epoch(trainer), initial=trainer.batch_in_epoch,
                            desc=f"epoch {trainer.epoch + 1}/{trainer.config.epochs}",
                            unit="batch", dynamic_ncols=True, leave=True, file=self._out())

    def on_batch_end(self, trainer: Trainer) -> None:
        lr = trainer.step_lr  # the step's, as metrics.jsonl's (the optimizer's is the next one's)
        every = self.refresh_every or trainer.config.log_every
        if trainer.is_update_step and trainer.global_step % every == 0:
            self.loss = trainer.last_loss  # a device sync: only where the loop logs it anyway
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{self.loss:.4f}", lr=f"{lr:.2e}", refresh=False)
        if self.bar is not None:
            self.bar.update(1)
            return
        now = self.clock()
        if self._epoch_start is not None and now - self._last_line >= self.log_every_s:
            self._last_line = now
            done, total = trainer.batch_in_epoch, _batches_this_epoch(trainer)
            rate = (done - self._first_batch) / max(now - self._epoch_start, 1e-9)
            left = (total - done) / rate if rate > 0 else 0.0
            loss = "" if math.isnan(self.loss) else f"loss {self.loss:.4f}, "  # none read yet
            self._line(f"epoch {trainer.epoch + 1}/{trainer.config.epochs}: batch {done}/{total}"
                       f" ({100 * done / max(total, 1):.0f}%), {loss}lr {lr:.2e}, "
                       f"{rate:.2f} batch/s, {_duration(left)} left in the epoch")

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        summary = trainer.kind.summary(metrics, trainer.metric_for_best)
        best = "  (best so far)" if is_best and self.marks_best else ""
        self._line(f"{self.eval_name} at step {trainer.global_step}: {summary}{best}")

    def on_epoch_end(self, trainer: Trainer) -> None:
        if self.bar is not None:  # the loop's count: a window begun after a stop was undone
            self.bar.n = trainer.batch_in_epoch
            self.bar.refresh()
        if self._is_plain() and self._epoch_start is not None:
            resumed = f" (resumed after batch {self._first_batch})" if self._first_batch else ""
            done, total = trainer.batch_in_epoch, trainer.batches_per_epoch
            ended = "done" if done >= total else f"stopped after batch {done} of {total}"
            self._line(f"epoch {trainer.epoch + 1}/{trainer.config.epochs} {ended}: "
                       f"{trainer.batch_in_epoch - self._first_batch} batches in "
                       f"{_duration(self.clock() - self._epoch_start)}{resumed}, "
                       f"step {trainer.global_step}")

    def on_train_end(self, trainer: Trainer) -> None:
        self._close()

    def _line(self, text: str) -> None:
        if self.bar is not None:
            self.bar.write(text, file=self._out())
        else:
            print(text, file=self._out(), flush=True)

    def _close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes} min {seconds:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


def _columns(stream: IO[str]) -> int:
    try:
        return os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):  # not a file, or no size to read
        return 0


def _batches_this_epoch(trainer: Trainer) -> int:
    """The epoch's micro-batches, or fewer where max_steps ends the run inside it."""
    cfg, total = trainer.config, trainer.batches_per_epoch
    if cfg.max_steps:  # from the open window's start (its micro-batches are counted already)
        window_start = trainer.batch_in_epoch - trainer.window.micro_batches
        total = min(total, window_start + max(cfg.max_steps - trainer.global_step, 0) * cfg.grad_accum)
    return total
