"""The training loop's counters in one object, saved and restored whole by checkpoints.

A new counter is a new field here, and `state_dict()` carries it into every checkpoint without
anyone remembering to (as torchtnt's `Progress` and fastNLP's `TrainerState`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any


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
