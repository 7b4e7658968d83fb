"""TensorBoard logging (`train --tensorboard`): loss, lr, gradient norm (when clipping) and
throughput every `log_every` steps, and each evaluation's metrics, written to an event folder on
rank 0. The loss is metrics.jsonl's: the mean over the steps since the previous point (carried
across a checkpoint), not the logged step's alone.

TensorBoard is optional: this module imports it only when training starts, and without the
package the run goes on with a warning saying how to install it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nlptrain.events import Callback

from .grad_clip import logged_grad_norm
from .step_sums import StepSum
from .training_rate import TrainingRate

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger("nlptrain")


class TensorBoardLogger(Callback):
    main_process_only = True

    def __init__(self, log_dir: str | Path) -> None:
        self.log_dir = Path(log_dir)
        self.writer: Any = None
        self.rate = TrainingRate()  # of the steps since the previous logged one
        self.loss_sum = StepSum()  # of those steps, on the device until a point is logged
        self.steps = 0

    def on_train_start(self, trainer: Trainer) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.warning("--tensorboard: the tensorboard package is not installed, so nothing is "
                        "logged for it (pip install tensorboard); metrics.jsonl has every value")
            return
        # On resume, events past the checkpoint's step are dropped, not drawn twice; its own step
        # was logged before the checkpoint was written, and is not logged again: it stays. A
        # resume from step 0 where events are already (of an attempt that died before its first
        # checkpoint) drops them all; a new run beside an earlier one's events keeps them.
        earlier = trainer.global_step or \
            (trainer.resume_asked and any(self.log_dir.glob("events.out.tfevents.*")))
        self.writer = SummaryWriter(str(self.log_dir),
                                    purge_step=trainer.global_step + 1 if earlier else None)
        self.rate.restart()

    def on_epoch_start(self, trainer: Trainer) -> None:
        self.rate.restart()

    def on_batch_end(self, trainer: Trainer) -> None:
        step = trainer.global_step
        if self.writer is None or not trainer.is_update_step:
            return
        self.rate.add(trainer.step_rows)
        self.loss_sum.add(trainer.step_loss)
        self.steps += 1
        if step % trainer.config.log_every:
            return
        now = time.perf_counter()
        self.writer.add_scalar("train/loss", float(self.loss_sum) / self.steps, step)
        self.loss_sum, self.steps = StepSum(), 0
        self.writer.add_scalar("train/lr", trainer.step_lr, step)
        grad_norm = logged_grad_norm(trainer)
        if grad_norm is not None:
            self.writer.add_scalar("train/grad_norm", grad_norm, step)
        self.writer.add_scalar("train/samples_per_s", self.rate.per_second(now), step)
        self.rate.restart(now)

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        state["tensorboard_loss"] = {"loss_sum": float(self.loss_sum), "steps": self.steps}

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        saved = state.get("tensorboard_loss")
        if saved is not None:
            self.loss_sum, self.steps = StepSum(float(saved["loss_sum"])), int(saved["steps"])

    def on_valid_start(self, trainer: Trainer) -> None:
        self.rate.evaluation_begins()

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        self.rate.evaluation_ends()
        if self.writer is None:
            return
        for key, value in metrics.items():  # every scalar metric of the task's kind
            if isinstance(value, (int, float)) and key not in ("step", "epoch", "rows", "correct"):
                self.writer.add_scalar(f"eval/{key}", value, trainer.global_step)
        self.writer.flush()

    def on_train_end(self, trainer: Trainer) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
