"""Writes `metrics.jsonl` in the run directory: training rows every `log_every` steps and one
row per evaluation. One JSON object a line, so a crashed run keeps every line written so far."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger("nlptrain")


class MetricLogger(Callback):
    main_process_only = True

    def __init__(self, path: str | Path, log_every: int = 10) -> None:
        self.path = Path(path)
        self.log_every = log_every
        self.handle: Any = None
        self._reset(time.perf_counter(), 0)

    def _reset(self, now: float, samples: int) -> None:
        self.loss_sum: Any = 0.0  # a device tensor once summing: read only at a logged step
        self.batches, self.window_start, self.window_samples = 0, now, samples

    def _write(self, row: dict) -> None:
        if self.handle is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.handle = open(self.path, "a", encoding="utf-8")  # append: resume continues it
        self.handle.write(json.dumps(row) + "\n")
        self.handle.flush()

    def on_epoch_start(self, trainer: Trainer) -> None:
        self._reset(time.perf_counter(), trainer.samples_in_epoch)

    def on_batch_end(self, trainer: Trainer) -> None:
        if not trainer.is_update_step:
            return
        self.loss_sum = self.loss_sum + trainer.step_loss  # its micro-batches, all ranks
        self.batches += 1
        if trainer.global_step % self.log_every:
            return
        now = time.perf_counter()
        samples = trainer.samples_in_epoch - self.window_samples
        row = {"kind": "train", "step": trainer.global_step, "epoch": trainer.epoch + 1,
               "loss": float(self.loss_sum) / self.batches,
               "lr": trainer.optimizer.param_groups[0]["lr"],
               "samples_per_s": samples / max(now - self.window_start, 1e-9),
               "time": time.time()}
        self._write(row)
        log.debug("step %d loss %.4f lr %.2e", row["step"], row["loss"], row["lr"])
        self._reset(now, trainer.samples_in_epoch)

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        # Every metric of the task's kind (and the user's own); not the loop's own step/epoch.
        found = {k: v for k, v in metrics.items() if k not in ("step", "epoch")}
        self._write({"kind": "eval", "step": trainer.global_step, "epoch": trainer.epoch + 1,
                     "is_best": is_best, "time": time.time(), **found})

    def on_train_end(self, trainer: Trainer) -> None:
        if self.handle is not None:
            self.handle.close()
            self.handle = None
