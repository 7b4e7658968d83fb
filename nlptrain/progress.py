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

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the fields found in `state` (a checkpoint older than a field lacks it)."""
        for f in dataclasses.fields(self):
            if f.name in state:
                value = state[f.name]
                setattr(self, f.name, value if f.name == "best_metric" else int(value))

    def ended_epoch(self) -> bool:
        """Saved at an epoch's end: every batch of it was done."""
        return 0 < self.batches_per_epoch <= self.batch_in_epoch

    def next_epoch(self) -> None:
        self.epoch += 1
        self.batch_in_epoch = self.samples_in_epoch = 0
