"""Learning-rate schedule that follows the steps actually planned, shaped by `transformers`'
schedules (linear warmup then decay, cosine, constant, ...).

The schedule is a function of training progress p in [0, 1] (warmup over the first
`warmup_ratio` of it, or over `warmup_steps` out of the steps first planned). The planned total is
read at every batch: the steps done, the rest of this epoch, and the later epochs at this epoch's
length (at most `max_steps`). When it changes (a callback swapped in a
larger or smaller set), the remaining progress is spread over the new remaining steps from where
the lr is now: no jump, and the lr still reaches the schedule's end on the last step. One
exception: a finished run resumed with more epochs had reached its schedule's end (lr 0 under a
decay), where every added step would train at that lr; its schedule is planned again over the
new total, as if so planned from the start (the lr rises to that schedule's value, said).
A resume given another lr, scheduler or warmup_ratio goes on with them from the progress reached.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import get_scheduler

from nlptrain.errors import ConfigError
from nlptrain.events import Callback
from nlptrain.optim import logged_lr

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)
RESOLUTION = 1_000_000  # the transformers schedule is sampled on this many virtual steps


@dataclass
class Plan:
    """Progress runs linearly from `start_progress` at step `start_step` to 1 at `end_step`."""

    start_step: int = 0
    start_progress: float = 0.0
    end_step: int = 1

    def progress(self, step: int) -> float:
        if step >= self.end_step:
            return 1.0
        done = (step - self.start_step) / (self.end_step - self.start_step)
        return self.start_progress + (1.0 - self.start_progress) * done


def schedule_shape(name: str, warmup_ratio: float) -> Any:
    """The lr factor of a transformers schedule as a function of progress in [0, 1]."""
    probe = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=1.0)
    scheduler = get_scheduler(name, probe, num_warmup_steps=int(warmup_ratio * RESOLUTION),
                              num_training_steps=RESOLUTION)
    factor = scheduler.lr_lambdas[0]
    return lambda progress: factor(progress * RESOLUTION)


class LRSchedule(Callback):
    """Makes `trainer.scheduler` at the first batch, when the steps are known (a callback may
    have swapped the data in on_train_start/on_epoch_start), re-plans it whenever the planned
    total changes, and steps it after every optimizer step."""

    def __init__(self, name: str = "linear", warmup_ratio: float = 0.1, warmup_steps: int = 0) -> None:
        self.name = name
        self.warmup_ratio = warmup_ratio
        self.warmup_steps = warmup_steps  # when > 0: the warmup's length, not warmup_ratio
        self.warmup = warmup_ratio  # the fraction of the planned steps that warms up
        self._kept_warmup: float | None = None  # a resumed run's, when its settings are unchanged
        self.shape = self.make_shape(warmup_ratio)
        self.plan: Plan | None = None
        self._saved: dict | None = None
        self.scaled = 1.0  # every `multiply` so far, multiplied: checkpoints keep it

    def multiply(self, trainer: Trainer, factor: float) -> None:
        """The lr times `factor` from the next step on, the schedule going on from the new base
        (a plateau rule's, from `on_valid_end`); a resume goes on with it. Call it on every rank
        alike (a decision on the gathered metrics is). `multiply_lr(trainer, factor)` finds this."""
        self.scaled *= factor
        if trainer.scheduler is not None:  # else `_make` applies `scaled`
            _times(trainer.scheduler, factor)

    def planned_total(self, trainer: Trainer) -> int:
        cfg = trainer.config
        done_in_epoch = trainer.batch_in_epoch // cfg.grad_accum
        later_epochs = max(cfg.epochs - trainer.epoch - 1, 0)
        planned = (trainer.global_step + trainer.steps_per_epoch - done_in_epoch
                   + trainer.steps_per_epoch * later_epochs)
        if cfg.max_steps:  # the run ends there (StepBudget)
            planned = min(planned, cfg.max_steps)
        return max(planned, trainer.global_step + 1)

    def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
        total = self.planned_total(trainer)
        if trainer.scheduler is not None and self.plan is None:  # set by the user before fit()
            raise ConfigError(
                f"trainer.scheduler is a {type(trainer.scheduler).__name__} of yours, which "
                "nothing steps: the LRSchedule callback makes and steps the run's schedule "
                "([train] scheduler, warmup_ratio, warmup_steps); for a shape of your own, "
                "subclass LRSchedule, override make_shape(warmup) to return a function of the "
                "run's progress (0 to 1) to the lr's factor, and give it in the callbacks")
        if trainer.scheduler is None:
            self._make(trainer, total)
        elif self.plan.end_step != total:  # continue from the progress reached, not a jump
            step = trainer.global_step
            if self.plan.progress(step) >= 1.0:  # fit() again with more epochs: lr 0 all along
                self._plan_again_from_the_start(trainer, total)
            else:
                self.plan = Plan(step, self.plan.progress(step), total)

    def _make(self, trainer: Trainer, total: int) -> None:
        saved = self._saved
        self.plan = Plan(**saved["plan"]) if saved and "plan" in saved else Plan(0, 0.0, total)
        self._set_warmup(self._kept_warmup, self.plan.end_step)
        trainer.scheduler = LambdaLR(trainer.optimizer,
                                     lambda step: self.shape(self.plan.progress(step)))
        if saved is not None:
            restore(trainer.scheduler, saved.get("scheduler", saved))
        if self.scaled != 1.0:
            _times(trainer.scheduler, self.scaled)
        if self.plan.end_step != total:
            step = trainer.global_step
            if saved is not None and self.plan.progress(step) >= 1.0:  # ended: more epochs given
                self._plan_again_from_the_start(trainer, total)
            else:
                self.plan = Plan(step, self.plan.progress(step), total)

    def _plan_again_from_the_start(self, trainer: Trainer, total: int) -> None:
        """The schedule had ended and more steps come (more epochs on resume, or a second
        fit()): planned again over `total` as if from the start, warmup included."""
        step = trainer.global_step
        self.plan = Plan(0, 0.0, total)
        self._set_warmup(None, total)
        ended = max(trainer.scheduler.get_last_lr())
        for group, base in zip(trainer.optimizer.param_groups, trainer.scheduler.base_lrs,
                               strict=True):
            group["lr"] = base * self.shape(self.plan.progress(step))
        if trainer.is_main:
            log.info("lr schedule: it had ended at step %d (lr %.3g); planned again over %d "
                     "steps as if from the start: lr %.3g from step %d", step, ended, total,
                     logged_lr(trainer.optimizer), step + 1)

    def on_step_end(self, trainer: Trainer) -> None:
        trainer.scheduler.step()

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        if trainer.scheduler is not None:
            state["lr_scheduler"] = {"plan": asdict(self.plan), "scaled": self.scaled,
                                     "shape": {**self._shape_settings(), "warmup": self.warmup},
                                     "scheduler": trainer.scheduler.state_dict()}

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        self._saved, self._kept_warmup = state.get("lr_scheduler"), None
        self.scaled = (self._saved or {}).get("scaled", 1.0)
        if self._saved is not None and trainer.scheduler is not None:
            trainer.scheduler = None  # made again from the saved plan at the next batch
        shape = (self._saved or {}).get("shape")  # older checkpoints: not recorded
        if shape is None:
            return
        was = {key: shape.get(key, 0) for key in self._shape_settings()}  # 0: before warmup_steps
        if was == self._shape_settings():  # the run's own fraction (warmup_steps of its first plan)
            self._kept_warmup = shape.get("warmup")
        elif trainer.is_main:
            progress = Plan(**self._saved["plan"]).progress(trainer.global_step)
            log.warning("lr schedule: the run's was %s; it goes on as %s, as asked, from the "
                        "progress reached (%.0f%%)", _described(was),
                        _described(self._shape_settings()), 100 * progress)

    def _shape_settings(self) -> dict[str, Any]:
        return {"name": self.name, "warmup_ratio": self.warmup_ratio,
                "warmup_steps": self.warmup_steps}

    def _set_warmup(self, fraction: float | None, total: int) -> None:
        """The schedule's shape, warming up over `fraction` of the plan: by default warmup_ratio,
        or warmup_steps out of the `total` steps planned."""
        if fraction is None:
            fraction = min(self.warmup_steps / total, 1.0) if self.warmup_steps else self.warmup_ratio
        self.warmup, self.shape = fraction, self.make_shape(fraction)

    def make_shape(self, warmup: float) -> Callable[[float], float]:
        """The lr's factor as a function of the run's progress (0 to 1), warming up over the
        first `warmup` of it: transformers' schedule `name`. A subclass may return its own."""
        return schedule_shape(self.name, warmup)


def multiply_lr(trainer: Trainer, factor: float) -> None:
    """Multiply the run's lr by `factor` from the next step on, kept across resumes: e.g.
    `multiply_lr(trainer, 0.1)` in `on_valid_end` when the metric stopped improving."""
    schedules = trainer.callbacks.find(LRSchedule)
    if not schedules:
        raise ValueError("multiply_lr needs the trainer's LRSchedule callback (the [train] scheduler)")
    schedules[0].multiply(trainer, factor)


def _times(scheduler: Any, factor: float) -> None:
    """The schedule's base lrs and the lr the next step uses, times `factor`."""
    scheduler.base_lrs = [base * factor for base in scheduler.base_lrs]
    for group in scheduler.optimizer.param_groups:
        group["lr"] *= factor


def _described(shape: dict[str, Any]) -> str:
    if shape.get("warmup_steps"):
        return f"{shape['name']} with warmup_steps {shape['warmup_steps']}"
    return f"{shape['name']} with warmup_ratio {shape['warmup_ratio']:g}"


def restore(scheduler: Any, state: dict) -> None:
    """Load a scheduler's state, on the optimizer's base lrs (this run's config: a resume may
    change the lr), and put each group's lr at its point of the schedule: a new scheduler has
    just set the lr of step 0 (0 in warmup), and load_state_dict alone does not undo that."""
    scheduler.load_state_dict(state)
    groups = scheduler.optimizer.param_groups
    scheduler.base_lrs = [group["initial_lr"] for group in groups]
    for group, base, factor in zip(groups, scheduler.base_lrs, scheduler.lr_lambdas, strict=True):
        group["lr"] = base * factor(scheduler.last_epoch)
