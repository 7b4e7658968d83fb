"""Rows trained a second over a window of steps, the time spent evaluating left out: an
evaluation inside the window (eval_every) made a logged rate of 250 samples/s read 21."""

from __future__ import annotations

import time
from typing import Any

from .step_sums import StepSum


class TrainingRate:
    def __init__(self) -> None:
        self.restart()

    def restart(self, now: float | None = None) -> None:
        self.rows = StepSum()  # on the device: read only when the rate is
        self.start = time.perf_counter() if now is None else now
        self.evaluating_s = 0.0
        self._evaluation_began: float | None = None

    def add(self, rows: Any) -> None:
        self.rows.add(rows)

    def evaluation_begins(self) -> None:
        self._evaluation_began = time.perf_counter()

    def evaluation_ends(self) -> None:
        if self._evaluation_began is not None:
            self.evaluating_s += time.perf_counter() - self._evaluation_began
            self._evaluation_began = None

    def per_second(self, now: float) -> float:
        return float(self.rows) / max(now - self.start - self.evaluating_s, 1e-9)
