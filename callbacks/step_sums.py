"""A value a step (a loss, a row count) summed for a logged row, on the device until read.

Each step's value is kept, not added at once: on a launch-bound GPU an add a step is a kernel a
step, as costly there as one of the model's. They are summed when the row is written (two
kernels), or every `FOLD` steps, so that a long `log_every` keeps little."""

from __future__ import annotations

from typing import Any

import torch


class StepSum:
    FOLD = 256

    def __init__(self, start: float = 0.0) -> None:
        self._parts: list[Any] = [start] if start else []

    def add(self, value: Any) -> None:
        self._parts.append(value)
        if len(self._parts) >= self.FOLD:
            self._parts = [self._sum()]

    def _sum(self) -> Any:
        tensors = [p for p in self._parts if isinstance(p, torch.Tensor)]
        numbers = sum(float(p) for p in self._parts if not isinstance(p, torch.Tensor))
        if not tensors:
            return numbers
        return torch.stack([t.reshape(()) for t in tensors]).sum() + numbers

    def __float__(self) -> float:
        """The sum, read to the host (a device sync: at a logged row only)."""
        return float(self._sum())
