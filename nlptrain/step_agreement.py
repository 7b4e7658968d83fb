"""What every rank agrees on, and when: each optimizer step's one collective and the stops
asked outside the steps.

The micro-batches of a step add their losses on the device (`StepWindow`); at the step's end one
all-reduce sums [loss x rows, rows, stop, save] over the ranks (`AgreedStep`), and the host reads
it (`StepAgreement.settle`) one step late where the optimizer can skip a non-finite step on the
device, so a GPU's queue never waits on the host. A non-finite loss anywhere stops every rank
before the weights change; a stop or save asked on any rank is every rank's at the same step.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from nlptrain import optim
from nlptrain.checkpoint import StepTotals
from nlptrain.distributed import Backend
from nlptrain.errors import Interrupted, TrainingError
from nlptrain.random_state import rng_state, set_rng_state
from nlptrain.signals import stopped_message

if TYPE_CHECKING:
    from nlptrain.progress import Progress


class StepAgreement:
    """The Trainer's part that agrees each optimizer step across the ranks (`_agree_on_step`,
    `settle`) and a stop asked anywhere (`_agree_on_stop`); the loop calls them at points every
    rank reaches alike. Callbacks set `should_stop` / `should_save`; they read `stopping` and
    `save_asked_at`."""

    dist: Backend
    progress: Progress
    callbacks: Any  # the trainer's CallbackList (events.py, which imports the trainer)
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    window: StepWindow
    latest_step: AgreedStep | StepTotals | None
    step_lr: float
    should_stop: bool  # any rank's requests: agreed in the flags
    should_save: bool
    interrupted: bool  # a signal's stop (raises `Interrupted` once agreed)
    save_asked_at: int | None  # read by every rank: a save asked after that step
    _pending: AgreedStep | None  # the latest step's agreed flags, not yet read
    _stop_agreed: bool  # every rank has read a stop: the run ends after this step

    @property
    def stopping(self) -> bool:
        """Every rank has agreed that the run ends after this step (max_steps, a stop read in
        the flags, early stopping): the epoch's end (its evaluation, on_epoch_end) comes next."""
        return self._stop_agreed

    def _agree_on_stop(self, interrupt: bool = True) -> bool:
        """A stop asked on any rank (also in an evaluation) is every rank's; a signal's raises."""
        stop, interrupted = self.dist.all_sum([self.should_stop, self.interrupted])
        self.should_stop = bool(stop)
        if interrupted and interrupt:
            saved = any(getattr(c, "saves_on_stop", False) for c in self.callbacks.callbacks)
            raise Interrupted(stopped_message(self.progress.global_step, saved), self.progress.global_step)
        return self.should_stop

    def _agree_on_step(self) -> bool:
        """The optimizer step's one collective: every rank's loss x rows (not finite where a loss
        was not), rows, stop and save requests, summed on the device (`AgreedStep`). Where the
        optimizer can skip a step on the device (fused AdamW, no fp16 scaler) they are read one
        step late: a non-finite step is skipped there, and the next read raises before any later
        step; else they are read now. A stop asked anywhere ends the run after the step whose flags carry
        it; a window begun after it is undone on every rank (not counted, random state back)."""
        first, last = self.window.first_batch + 1, self.progress.batch_in_epoch
        where = (f"epoch {self.progress.epoch + 1}, batch {first if first == last else f'{first}-{last}'} "
                 f"(optimizer step {self.progress.global_step + 1})")
        agreed = self.window.agree(self.dist, self.should_stop, self.should_save, where,
                                   self.progress.global_step)
        self.should_save = False  # sent: every rank's once read (`save_asked_at`)
        self.settle()  # the previous step's flags
        if self._stop_agreed:
            self.progress.batch_in_epoch = self.window.undo()
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self._pending = self.latest_step = agreed
        if not self._skips_on_device():
            self.settle()  # this step's update must not apply a non-finite loss
        self.window.close()
        return True

    def settle(self) -> None:
        """Read the latest step's agreed flags, if still unread: raise on a non-finite loss, note
        a stop, count the rows. Every rank calls it at the same points (each optimizer step,
        checkpoints, evaluations, epoch ends), so every rank decides the same; on a non-finite
        step every rank then joins one more collective (how many ranks' losses were not finite),
        so a callback of the main rank alone must not call it."""
        agreed, self._pending = self._pending, None
        if agreed is None:
            return
        finite, rows, stop, save = agreed.read()
        if not finite and self.progress.global_step > agreed.steps_done:  # read a step late, it
            self.progress.samples_in_epoch += int(rows)  # was counted (skipped on the device): so
        if not finite:  # are its rows, and a later fit() goes on after it
            raise TrainingError(
                f"the loss is not finite at {agreed.where} on {agreed.ranks_not_finite(self.dist)} "
                "rank(s); the weights were"
                " not updated. Resume from the last checkpoint at a lower lr (--resume --lr) or in fp32")
        self.progress.samples_in_epoch += int(rows)
        if stop:
            self.should_stop = self._stop_agreed = True
        self.save_asked_at = agreed.steps_done if save else self.save_asked_at

    def _skips_on_device(self) -> bool:
        return optim.skips_on_device(self.optimizer, self.scaler)

    def _optimizer_step(self) -> None:
        """With the flags unread, the optimizer is told on the device to skip a non-finite step."""
        self.step_lr = optim.logged_lr(self.optimizer)
        optim.step(self.optimizer, self.scaler, None if self._pending is None else self._pending.skip)

    def _request_stop(self) -> None:  # SIGTERM/SIGINT: finish the step, every rank stops
        self.interrupted = self.should_stop = True


class LatestStepReadings:
    """What callbacks read of the latest optimizer step (`trainer.latest_step`: its agreed flags,
    or a resume's totals), all ranks together."""

    latest_step: AgreedStep | StepTotals | None

    @property
    def step_loss(self) -> torch.Tensor | None:
        """The latest step's mean loss by row, all ranks, on the device (made when first read:
        on a launch-bound GPU a kernel a step that no callback reads is a cost)."""
        return None if self.latest_step is None else self.latest_step.loss

    @property
    def step_rows(self) -> torch.Tensor | None:
        """The latest step's rows, all ranks, on the device."""
        return None if self.latest_step is None else self.latest_step.rows

    @property
    def last_loss(self) -> float:
        """The latest step's loss (all ranks), read to the host: a GPU sync (`step_loss` is not)."""
        return math.nan if self.step_loss is None else float(self.step_loss)


class StepWindow:
    """The micro-batches of the optimizer step under way: their losses summed on the device (no
    host sync before the step's one collective), what weighs each in the step, and what undoing
    them needs (where the window began, the random state then).

    Each micro-batch's mean loss is weighted by its share of the step's rows, all ranks together,
    so that the step's gradient is the mean over its rows, as one process taking the whole step
    at once would have it (fairseq's division by the step's rows): a short batch (the epoch's
    last; a token budget's few long rows) weighs as its rows do. The rows come from the epoch's
    batch plan (`plan_rows`), known ahead on every rank for the loaders nlptrain makes, so
    weighing needs no collective, and the weights of a step add up to 1 whatever a collate or
    callback does to a batch's rows. A loader of a user's has no plan: its micro-batches weigh
    alike."""

    def __init__(self) -> None:
        self.micro_batches = 0
        self.first_batch = 0  # batch_in_epoch when the window opened
        self._loss: Any = None  # the window's loss x rows, summed on the device
        self._rows = 0  # the window's rows on this rank (the host knows them)
        self._random: dict[str, Any] | None = None
        self._plan: np.ndarray | None = None  # [batch, rank]: the rows of each batch left this epoch
        self._plan_from, self._rank = 0, 0  # the batch_in_epoch of the plan's first batch; ours
        self._size = 1  # micro-batches in this window
        self._weights: np.ndarray | None = None  # this rank's micro-batches' shares of the step
        self.taking = False  # a micro-batch's backward passes may run (its start to on_backward_end)

    def plan_rows(self, plan: np.ndarray | None, first_batch: int, rank: int) -> None:
        """The epoch's plan: for each batch from `first_batch` on, each rank's rows in its batch of
        that number (None: not known before the batches are read)."""
        self._plan, self._plan_from, self._rank = plan, first_batch, rank

    def open(self, batch_in_epoch: int, size: int) -> None:
        """At each micro-batch's start, before its events: its backward passes may run until
        `add` (at a window's first, the window opens; `size`: its micro-batches)."""
        self.taking = True
        if self.micro_batches == 0:
            self.first_batch, self._random, self._size = batch_in_epoch, rng_state(), size
            begin = batch_in_epoch - self._plan_from
            planned = None if self._plan is None else self._plan[begin:begin + size]
            whole = planned is not None and len(planned) == size and planned.sum() > 0
            self._weights = planned[:, self._rank] / planned.sum() if whole else None

    def loss_divisor(self, world_size: int) -> float:
        """What the window's next micro-batch divides its mean loss by before its backward: the
        step's rows over its own times the world size (DDP then averages over the ranks), or the
        window's micro-batch count where no plan tells the rows (each weighs alike)."""
        if self._weights is None:
            return float(self._size)
        return 1.0 / (float(self._weights[self.micro_batches]) * world_size)

    def add(self, loss: Any, rows: int) -> None:
        """Two device ops a micro-batch (three past a window's first): on a launch-bound GPU each
        small kernel costs as much as one of the model's. A non-finite loss is not set apart here:
        it makes the sum non-finite, which is what `AgreedStep` reads."""
        self.taking = False  # this micro-batch's backward passes are done
        weighted = loss.detach().double() * rows  # the logged loss: a mean by row
        self._loss = weighted if self._loss is None else self._loss + weighted
        self._rows += rows
        self.micro_batches += 1

    def agree(self, dist: Backend, stop: bool, save: bool, where: str, steps_done: int) -> AgreedStep:
        """[loss x rows sum, rows, stop, save] summed over the ranks: the step's one collective,
        launched on the device; nothing is read back here. `steps_done`: the optimizer steps
        before this one (the requests sent now were made after the last)."""
        device = self._loss.device  # (pinned for a GPU: its copy does not wait on the host)
        host = torch.tensor([self._rows, float(stop), float(save)], dtype=torch.float64,
                            pin_memory=device.type == "cuda")
        flags = torch.cat([self._loss.view(1), host.to(device, non_blocking=True)])
        return AgreedStep(dist.all_sum_tensor(flags), self._loss, where, steps_done)

    def undo(self) -> int:
        """Put the random state back as it was when the window opened; returns where it began."""
        set_rng_state(self._random)
        first = self.first_batch
        self.close()
        return first

    def close(self) -> None:
        self.micro_batches, self._loss, self._rows, self._random = 0, None, 0, None

    @property
    def begun(self) -> bool:
        """A micro-batch of a step began, and the step is neither taken nor undone (an error)."""
        return self._random is not None


class AgreedStep:
    """One optimizer step's agreed flags, on the device, and their copy to the host.

    On a GPU the copy is started at once (pinned memory, non-blocking) and an event marks its end,
    so that `read()` one step later finds it done: the host never waits for the device queue to
    drain. `skip` and `loss` stay on the device, made only when asked for (an optimizer that
    skips a step there; a logger)."""

    def __init__(self, sums: torch.Tensor, own_loss: torch.Tensor, where: str, steps_done: int) -> None:
        self.where = where  # the step's batches, for the error message
        self.steps_done = steps_done  # requests in these flags were made after this many steps
        self.rows = sums[1]  # the step's rows, all ranks (for a logger's throughput)
        self._sums, self._own_loss = sums, own_loss
        self._host, self._done = sums, None
        if sums.is_cuda:
            self._host = torch.empty(sums.shape, dtype=sums.dtype, pin_memory=True)
            self._host.copy_(sums, non_blocking=True)
            self._done = torch.cuda.Event()
            self._done.record()

    @functools.cached_property
    def skip(self) -> torch.Tensor:
        """Fused AdamW's found_inf: 1 (the sum is inf or NaN) leaves weights and moments as they are."""
        return (self._sums[0] * 0).isnan().float()

    @functools.cached_property
    def loss(self) -> torch.Tensor:
        """The step's mean loss by row, all ranks; not finite where any rank's was not."""
        return self._sums[0] / self._sums[1].clamp(min=1)

    def read(self) -> tuple[bool, float, float, float]:
        """(finite, rows, stop, save) on the host: the step's one host read."""
        if self._done is not None:
            self._done.synchronize()
        loss, rows, stop, save = self._host.tolist()
        return math.isfinite(loss), rows, stop, save

    def ranks_not_finite(self, dist: Backend) -> int:
        """How many ranks' losses were not finite: a collective, which every rank makes when the
        read sum is not finite (the failing step only: no flag a step for it)."""
        return int(dist.all_sum([0.0 if math.isfinite(float(self._own_loss)) else 1.0])[0])
