"""Rows of a header-less TSV/CSV file that differ in the cells past the last column read.

A text holding the separator (a tab in TSV, which has no quoting; an unquoted comma in CSV) is cut
there, and the rest of it becomes cells past the columns read: nothing else shows it. But columns
of their own that only some rows have read the same (the raw STS Benchmark test file: 284 of its
1,379 rows carry two source columns more), so it is said once a file, not refused. With a header,
a row longer than the header is refused instead (`readers`): there the count is known."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)
_SAID: set[str] = set()  # (a stream reads its file each epoch: said once)


class RaggedRows:
    def __init__(self) -> None:
        self.seen: dict[int, tuple[int, int]] = {}  # cells past the columns read -> (rows, first line)

    def add(self, row: list[str], last_read: int, line: int) -> None:
        past = len(row) - last_read - 1
        while past > 0 and not row[last_read + past].strip():  # empty trailing cells: none
            past -= 1
        rows, first = self.seen.get(past, (0, line))
        self.seen[past] = (rows + 1, first)

    def say(self, path: Path, last_read: int, fix: str) -> None:
        """At the file's end: a warning where the rows differ."""
        if len(self.seen) < 2 or str(path) in _SAID:
            return
        _SAID.add(str(path))
        counts = "; ".join(f"{rows} row(s) have {past} (the first at line {first})"
                           for past, (rows, first) in sorted(self.seen.items()))
        log.warning("%s: its rows differ in the cells past column %d, the last read: %s. A text "
                    "that holds the separator is cut there (%s); columns that some rows have "
                    "are fine", path, last_read + 1, counts, fix)
