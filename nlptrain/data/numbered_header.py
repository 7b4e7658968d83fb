"""A first row read as the header where the columns are named by number: said, or refused
where it is data (a file without a header would lose its first row, unsaid)."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from pathlib import Path

from nlptrain.config import FileSpec
from nlptrain.errors import DataError

log = logging.getLogger(__name__)


def check_numbered_header(header: list[str], columns: dict[str, int], spec: FileSpec,
                          label_values: Sequence[str], path: Path, line: int) -> None:
    """Columns by number read any first row as a header, and a file without one lost its first
    row, unsaid. Refused where its label cell is data: one of the task's labels, or a number (a
    score, a class id) beside a text that is not one (pandas' numbered columns are headers);
    else said, as the row read as the header."""
    label, text = columns.get("label"), columns.get("text")
    if not isinstance(spec.label_column, int) or label is None or label >= len(header):
        return
    cell, text_cell = header[label], header[text] if text is not None and text < len(header) else ""
    if _holds_labels(cell, label_values) or _is_number(cell) and text_cell and not _is_number(text_cell):
        raise DataError(f"{path}:{line}: the header row holds the label {cell!r}: a data row? Give "
                        "--no-header (header = false in the task's [data]) for a file without one")
    if str(path) not in _SAID_HEADERS:  # (a stream reads its file each epoch: said once)
        _SAID_HEADERS.add(str(path))
        log.info("%s: line %d read as the header row %s (--no-header for a file without one)",
                 path, line, header)


_SAID_HEADERS: set[str] = set()


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


_PIECES = re.compile(r"[\s,;|/]+")  # what separates a multi-label cell's labels, whatever the task's


def _holds_labels(cell: str, label_values: Sequence[str] | set[str]) -> bool:
    """A label, or labels of a multi-label cell ("14,18": whatever the task's separator, each
    piece between separators is a label): a data row's cell, not a column's name."""
    pieces = [piece for piece in _PIECES.split(cell) if piece]
    return cell in label_values or bool(pieces) and all(piece in label_values for piece in pieces)
