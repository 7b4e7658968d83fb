"""The training loop's counters in one object, saved and restored whole by checkpoints.

A new counter is a new field here, and `state_dict()` carries it into every checkpoint without
anyone remembering to (as torchtnt's `Progress` and fastNLP's `TrainerState`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nlptrain.checkpoint import StepTotals
from nlptrain.distributed import Backend
from nlptrain.random_state import rng_state, set_rng_state


@dataclass
class Progress:
    epoch: int = 0               # current epoch, from 0
    global_step: int = 0         # optimizer steps so far
    batch_in_epoch: int = 0      # micro-batches done in this epoch (this rank)
    samples_in_epoch: int = 0    # samples done in this epoch, all ranks together
    batches_per_epoch: int = 0   # micro-batches this epoch, agreed by all ranks
    steps_per_epoch: int = 0     # optimizer steps this epoch
    best_metric: float | None = None  # best validation score so far

    def state_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> int:
        """Restore the fields found in `state` (a checkpoint older than a field lacks it), at the
        next epoch's start if saved at an epoch's end; returns this epoch's samples already done
        (the sampler starts after them)."""
        for f in dataclasses.fields(self):
            if f.name in state:
                value = state[f.name]
                setattr(self, f.name, value if f.name == "best_metric" else int(value))
        if self.ended_epoch():
            self.next_epoch()
        return self.samples_in_epoch

    def ended_epoch(self) -> bool:
        """Saved at an epoch's end: every batch of it was done."""
        return 0 < self.batches_per_epoch <= self.batch_in_epoch

    def next_epoch(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = self.samples_in_epoch = 0


def _read_only(name: str) -> property:
    return property(lambda self: getattr(self.progress, name),
                    doc=f"`trainer.progress.{name}` (read-only here)")


class ProgressCounters:
    """The loop's counters under their own names (`trainer.epoch`, `trainer.global_step`, ...),
    read-only: they live in `self.progress`, which the loop alone writes."""

    progress: Progress
    epoch = _read_only("epoch")
    global_step = _read_only("global_step")
    batch_in_epoch = _read_only("batch_in_epoch")
    samples_in_epoch = _read_only("samples_in_epoch")
    batches_per_epoch = _read_only("batches_per_epoch")
    steps_per_epoch = _read_only("steps_per_epoch")
    best_metric = _read_only("best_metric")


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
