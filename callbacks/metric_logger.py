"""Writes `metrics.jsonl` in the run directory: training rows every `log_every` steps and at the
run's end (loss, the lr the row's step used, throughput and, when clipping, the step's gradient
norm before clipping) and one row per evaluation. One JSON object a line, so a crashed run
keeps every line written so far; a resume first drops the rows past its checkpoint's step (the
crashed run wrote them, the resumed run writes them again) and goes on with the checkpoint's
loss window, so the file ends as that of the run never stopped."""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nlptrain.durable import write_text
from nlptrain.events import Callback
from nlptrain.scores import strict_json

from .grad_clip import logged_grad_norm
from .step_sums import StepSum
from .training_rate import TrainingRate

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger("nlptrain")


class MetricLogger(Callback):
    main_process_only = True

    def __init__(self, path: str | Path, log_every: int = 10, marks_best: bool = True) -> None:
        self.path = Path(path)
        self.log_every = log_every
        self.marks_best = marks_best  # False: the evaluations score a test set, which picks nothing
        self.handle: Any = None
        self.step_epoch = 1  # the epoch (from 1) of the last step counted
        self.closing_row: dict | None = None  # a resumed run's, given back if no step runs
        self.stepped = False  # a step ran in this fit (else the window is the checkpoint's)
        self.rate = TrainingRate()
        self.unwritten = 0  # rows a full disk kept out
        self._reset(time.perf_counter())

    def _reset(self, now: float) -> None:
        # Device tensors once summing, read only at a logged step. The rows are the steps' own:
        # the trainer's samples_in_epoch counts a step only once its flags are read, one step
        # late where the optimizer skips on the device, which left a resumed run's first window
        # at 0 samples/s.
        self.loss_sum = StepSum()
        self.rate.restart(now)
        self.batches = 0

    def _write(self, row: dict) -> None:
        try:
            if self.handle is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                torn = _ends_mid_line(self.path)  # a row a full disk cut short: ended, not joined
                self.handle = open(self.path, "a", encoding="utf-8")  # append: resume continues it
                if torn:
                    self.handle.write("\n")
            self.handle.write(json.dumps(strict_json(row)) + "\n")
            self.handle.flush()
        except OSError as err:  # a full disk: said once, not a traceback at every row
            if err.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            if self.handle is not None:  # the row left in its buffer goes (close would write it)
                with contextlib.suppress(OSError):
                    self.handle.close()
                self.handle = None
            if not self.unwritten:
                log.warning("%s: a row cannot be written (%s); rows are left out until one can",
                            self.path, err.strerror or err)
            self.unwritten += 1

    def on_epoch_start(self, trainer: Trainer) -> None:
        # The loss window goes on across epochs (the steps after an epoch's last row are in the
        # next row); the throughput's starts again, past the epoch end's evaluation.
        self.rate.restart()

    def on_valid_start(self, trainer: Trainer) -> None:
        self.rate.evaluation_begins()

    def on_batch_end(self, trainer: Trainer) -> None:
        if not trainer.is_update_step:
            return
        self.stepped = True  # this run's end writes its own closing row
        self.loss_sum.add(trainer.step_loss)  # its micro-batches, all ranks
        self.rate.add(trainer.step_rows)
        self.batches += 1
        self.step_epoch = trainer.epoch + 1  # (at the run's end, trainer.epoch is past the last)
        if trainer.global_step % self.log_every == 0:
            self._log_window(trainer)

    def _log_window(self, trainer: Trainer, closing: bool = False) -> None:
        """One training row: the mean loss and the throughput of the steps since the last row.
        `closing`: the row of a run's end between two log steps, marked so that a resume from
        a checkpoint of that step drops it (the resumed run goes on with its window)."""
        now = time.perf_counter()
        row = {"kind": "train", "step": trainer.global_step, "epoch": self.step_epoch,
               "loss": float(self.loss_sum) / self.batches,
               "lr": trainer.step_lr,
               "samples_per_s": self.rate.per_second(now),
               "time": time.time()}
        grad_norm = logged_grad_norm(trainer)
        if grad_norm is not None:
            row["grad_norm"] = grad_norm
        if closing:
            row["closing"] = True
        self._write(row)
        log.debug("step %d loss %.4f lr %.2e", row["step"], row["loss"], row["lr"])
        self._reset(now)

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        self.rate.evaluation_ends()
        # Every metric of the task's kind (and the user's own); not the loop's own step/epoch.
        found = {k: v for k, v in metrics.items() if k not in ("step", "epoch")}
        best = {"is_best": is_best} if self.marks_best else {}
        self._write({"kind": "eval", "step": trainer.global_step, "epoch": trainer.epoch + 1,
                     **best, "time": time.time(), **found})

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        state["metric_logger"] = {"loss_sum": float(self.loss_sum), "batches": self.batches}

    def on_train_start(self, trainer: Trainer) -> None:
        self.stepped = False
        # A resume of an attempt that died before its first checkpoint starts from step 0 and
        # writes every step again: the dead attempt's rows go. (Not a new trainer's, writing
        # after another's: the earlier run's rows are kept.)
        if trainer.global_step == 0 and trainer.resume_asked and self._drop_rows_past(0):
            log.info("%s: dropped the rows of an earlier attempt, which stopped before its first "
                     "checkpoint: this run starts at step 0", self.path)

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        saved = state.get("metric_logger")
        if saved is not None:
            self.loss_sum, self.batches = StepSum(float(saved["loss_sum"])), int(saved["batches"])
        # The closing row of the run that stopped at this step goes (the resumed run's window
        # goes on), but comes back as it was if no step runs (a finished run resumed).
        self.closing_row = _closing_row_at(self.path, trainer.global_step)
        self._drop_rows_past(trainer.global_step)  # rows up to it were written before it

    def _drop_rows_past(self, step: int) -> bool:
        """Rewrite the file without the rows a resumed run at `step` writes again; whether any went."""
        if not self.path.is_file():
            return False
        lines = _lines(self.path)
        kept = [line for line in lines if _kept_on_resume(line, step)]
        if len(kept) < len(lines):
            write_text(self.path, "".join(f"{line}\n" for line in kept))
        return len(kept) < len(lines)

    def on_train_end(self, trainer: Trainer) -> None:
        if not self.stepped:  # resumed, and no step ran: the closing row as it was, if any (a
            if self.closing_row is not None:  # row of the checkpoint's window alone would
                self._write(self.closing_row)  # have this run's lr and epoch, which it has not)
        elif self.batches:  # the last steps, fewer than log_every: the run's end is logged too
            self._log_window(trainer, closing=True)
        if self.handle is not None:
            self.handle.close()
            self.handle = None


def _ends_mid_line(path: Path) -> bool:
    try:
        with open(path, "rb") as handle:
            handle.seek(-1, 2)
            return handle.read(1) != b"\n"
    except OSError:  # none yet, or empty
        return False


def _closing_row_at(path: Path, step: int) -> dict | None:
    """The closing row of the run that stopped at `step`, if the file ends with one."""
    if not path.is_file():
        return None
    rows = [_row(line) for line in _lines(path)]
    closing = [row for row in rows if row and row.get("closing") and row.get("step") == step]
    return closing[-1] if closing else None


def _lines(path: Path) -> list[str]:
    """The file's lines; a damaged byte (a disk error, a hand edit) spoils its line alone."""
    return path.read_bytes().decode("utf-8", errors="replace").splitlines()


def _row(line: str) -> dict | None:
    try:
        row = json.loads(line)
    except ValueError:  # a torn line (a crash mid-write)
        return None
    return row if isinstance(row, dict) else None


def _kept_on_resume(line: str, step: int) -> bool:
    """Rows up to the checkpoint's step are kept; not a torn line (a crash mid-write), and not
    the closing row of the run that stopped there (the resumed run's window goes on)."""
    try:
        row = json.loads(line)
        return int(row["step"]) <= step and not row.get("closing")
    except (ValueError, KeyError, TypeError, AttributeError):
        return False
