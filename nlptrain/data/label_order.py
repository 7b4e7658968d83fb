"""Does a file's row order come grouped by label (all of class A, then all of class B)?

A per-rank file read in file order (split without --shuffle, trained without --shard-shuffle)
trains in the order of its rows: rows grouped by label (a `lines` task, one file per label; a
TSV sorted by label) make every rank's epoch class by class, and the model learns the last
class it saw. `LabelOrder` counts how often neighbouring rows change label and compares it
with what a random order of the same labels has on average: grouped rows change label far
less often. It takes one label at a time (memory: one count per distinct label), so `split`
can follow a file of any size as it streams it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any

MIN_ROWS = 100        # fewer rows than this: too few to tell (and to matter); never grouped
GROUPED_BELOW = 0.25  # grouped: fewer label changes than this share of a random order's
MAX_KEYS = 100_000    # more distinct labels (multi-label sets) than this: stop, never grouped

_START = object()


class LabelOrder:
    """Label changes between neighbouring rows, against those of a random order."""

    def __init__(self) -> None:
        self.rows = 0
        self.changes = 0                     # neighbours whose labels differ
        self.counts: Counter[Hashable] | None = Counter()  # rows of each label (None: too many)
        self._last: Any = _START

    @classmethod
    def of(cls, labels: Iterable[Hashable]) -> LabelOrder:
        order = cls()
        for label in labels:
            order.add(label)
        return order

    @classmethod
    def of_targets(cls, targets: Any) -> LabelOrder:
        """The same of encoded targets (a numpy array, one row each): class ids, or multi-hot
        rows (a row's label set); vectorized, for a file of millions of rows."""
        import numpy as np

        order = cls()
        order.rows = len(targets)
        if order.rows:
            differ = targets[1:] != targets[:-1]
            order.changes = int(np.count_nonzero(differ if differ.ndim == 1 else differ.any(axis=1)))
            counts = np.unique(targets, axis=0, return_counts=True)[1]
            order.counts = Counter(dict(enumerate(counts.tolist())))
        return order

    def add(self, label: Hashable) -> None:
        """One more row: its label (a string, a class id, a tuple of a multi-label row's set)."""
        self.rows += 1
        self.changes += self._last is not _START and label != self._last
        self._last = label
        if self.counts is not None:
            self.counts[label] += 1
            if len(self.counts) > MAX_KEYS:
                self.counts = None  # memory would grow with the file: no verdict

    @property
    def expected(self) -> float:
        """Label changes a uniformly random order of these rows has on average: each pair of
        neighbours differs with probability 1 - sum c(c-1) / (n(n-1)) over the labels' counts."""
        n = self.rows
        if n < 2 or self.counts is None:
            return 0.0
        return (n - 1) - sum(c * (c - 1) for c in self.counts.values()) / n

    @property
    def grouped(self) -> bool:
        """The rows come in long runs of one label: far fewer changes than a random order's."""
        return self.rows >= MIN_ROWS and self.changes < GROUPED_BELOW * self.expected

    def __str__(self) -> str:
        return (f"{self.changes} label change{'' if self.changes == 1 else 's'} in {self.rows} "
                f"rows; a shuffled order has ~{self.expected:.0f}")


def label_key(cell: str | list[str], kind: Any) -> tuple[str, ...]:
    """A row's label as written, as one value: the set of label values it names, sorted (one
    for a single-label row; none for a regression score, whose order is not checked)."""
    return tuple(sorted(set(kind.label_values(cell))))
