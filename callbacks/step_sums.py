"""A value a step (a loss, a row count) summed for a logged row, on the device until read.

Each step's value is kept, not added at once: on a launch-bound GPU an add a step is a kernel a
step, as costly there as one of the model's. When the row is written the values come to the
host in one copy and are added there one after another from the window's start: the float64
additions, in the order, of adding each step's at once, so a window resumed from a checkpoint's
sum ends on the same bits as the run never stopped. Every `FOLD` steps the kept values are
joined into one tensor (one op), so a long `log_every` keeps little."""

from __future__ import annotations

from typing import Any

import torch


class StepSum:
    FOLD = 256

    def __init__(self, start: float = 0.0) -> None:
        self.start = float(start)  # a resumed window's sum so far (a checkpoint's)
        self._parts: list[torch.Tensor] = []  # each step's value, in step order

    def add(self, value: Any) -> None:
        self._parts.append(value if isinstance(value, torch.Tensor)
                           else torch.tensor(float(value), dtype=torch.float64))
        if len(self._parts) >= self.FOLD:
            self._parts = [self._joined()]

    def _joined(self) -> torch.Tensor:
        device = self._parts[0].device
        return torch.cat([p.reshape(-1).to(device, torch.float64) for p in self._parts])

    def __float__(self) -> float:
        """The sum, read to the host (a device sync: at a logged row only)."""
        total = self.start
        for value in self._joined().tolist() if self._parts else ():
            total += value
        return total
