"""Readers for TSV, CSV, JSONL and one-file-per-label text files.

Every reader streams its file line by line from bytes, so a bad row or undecodable byte is
reported with its file and line, and memory does not grow beyond the rows kept. CRLF, a UTF-8 BOM
and blank lines (trailing or not) are accepted.
"""

from __future__ import annotations

import csv
import json
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from nlptrain.config import FileSpec
from nlptrain.errors import DataError

FORMATS_BY_SUFFIX = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


def format_of(spec: FileSpec) -> str:
    if spec.format != "auto":
        return spec.format
    suffix = Path(spec.path).suffix.lower()
    if suffix not in FORMATS_BY_SUFFIX:
        raise DataError(f"{spec.path}: cannot tell the format from '{suffix}'; set format = "
                        "'tsv', 'csv', 'jsonl' or 'lines' in the task's [data]")
    return FORMATS_BY_SUFFIX[suffix]


def open_checked(path: Path, what: str) -> Path:
    if not path.is_file():
        raise DataError(f"{path}: {what} file not found; check the path or --data-dir")
    return path


def decoded_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text without its line ending); strict UTF-8, BOM dropped, CRLF accepted."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(
                    f"{path}:{number}: byte {raw[err.start]:#04x} at column {err.start + 1} is not "
                    "UTF-8; convert the file, e.g. iconv -f latin1 -t utf-8 IN > OUT") from None
            yield number, text.rstrip("\r\n")


def _column(name: str | int, header: list[str] | None, path: Path, role: str, fix: str) -> int:
    if isinstance(name, int):
        return name
    if header is None:
        raise DataError(f"{path}: {role} column '{name}' needs a header row; "
                        f"give a 0-based column index or set header = true")
    if name not in header:
        raise DataError(f"{path}:1: no {role} column '{name}' in the header {header}; {fix}")
    return header.index(name)


class Row(NamedTuple):
    text: str
    label: str  # as written in the file; '' when reading texts alone
    path: str
    line: int


def _checked(text: str, label: str | None, path: Path, line: int) -> Row:
    if not text.strip():
        raise DataError(f"{path}:{line}: the row has no text")
    if label is None:
        return Row(text, "", str(path), line)
    if not label.strip():
        raise DataError(f"{path}:{line}: the row has no label")
    return Row(text, label.strip(), str(path), line)


def _table_rows(path: Path, spec: FileSpec, delimiter: str, labelled: bool, fix: str) -> Iterator[Row]:
    """TSV (no quoting: text may hold quotes) or CSV (standard quoting; a row may span lines)."""
    line_of_row: list[int] = []

    def lines() -> Iterator[str]:
        for number, text in decoded_lines(path):
            line_of_row.append(number)
            yield text + "\n"  # the csv module needs line ends to keep breaks in quoted cells

    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    csv.field_size_limit(2**31 - 1)  # long documents are rows too (the default refuses > 128 KiB)
    rows = csv.reader(lines(), delimiter=delimiter, quoting=quoting, strict=True)
    header: list[str] | None = None
    columns: list[int] = []  # text, then label when labelled
    line = 0
    try:
        for row in rows:
            # csv reads no further than this row: the lines since the last clear are its lines.
            line = line_of_row[0]
            line_of_row.clear()
            if not any(cell.strip() for cell in row):
                continue  # blank line
            if spec.header and header is None:
                header = [cell.strip() for cell in row]
            if not columns:
                roles = [("text", spec.text_column), ("label", spec.label_column)][:1 + labelled]
                columns = [_column(name, header, path, role, fix.format(role=role))
                           for role, name in roles]
                if header is not None:
                    continue
            if len(row) <= max(columns):
                roles = zip(("text", "label"), columns, strict=False)
                where = ", ".join(f"{role} in column {c + 1}" for role, c in roles)
                raise DataError(f"{path}:{line}: {len(row)} column(s), expected at least "
                                f"{max(columns) + 1} ({where})")
            yield _checked(row[columns[0]], row[columns[1]] if labelled else None, path, line)
    except csv.Error as err:
        raise DataError(f"{path}:{line_of_row[-1] if line_of_row else line}: {err}") from None


def _jsonl_rows(path: Path, spec: FileSpec, labelled: bool, fix: str) -> Iterator[Row]:
    for line, text in decoded_lines(path):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{line}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{line}: expected a JSON object per line")
        roles = [("text", spec.text_column), ("label", spec.label_column)][:1 + labelled]
        for role, key in roles:
            if str(key) not in row:
                raise DataError(f"{path}:{line}: no '{key}' field ({role}); {fix.format(role=role)}")
        label = str(row[str(spec.label_column)]) if labelled else None
        yield _checked(str(row[str(spec.text_column)]), label, path, line)


def source_files(spec: FileSpec, data_dir: str | Path, label_values: Sequence[str],
                 what: str = "data") -> list[Path]:
    """The files one [data] entry reads, checked to exist (one per label for format 'lines')."""
    base = Path(data_dir) if data_dir else Path(".")
    if "{label}" not in spec.path:
        return [open_checked(base / spec.path, what)]
    if not label_values:
        raise DataError(f"{spec.path}: format 'lines' needs the task's [data] labels")
    return [open_checked(base / spec.path.format(label=v), what) for v in label_values]


TASK_FIX = "set {role}_column in the task's [data]"


def iter_rows(spec: FileSpec, data_dir: str | Path, label_values: Sequence[str] = (),
              what: str = "data", labelled: bool = True, fix: str = TASK_FIX) -> Iterator[Row]:
    """Every row of one [data] entry in file order, read lazily; errors name file and line.
    For format 'lines' (a path with {label}), one file per label value, one text a line."""
    fmt = "lines" if "{label}" in spec.path else format_of(spec)
    files = source_files(spec, data_dir, list(label_values), what)
    empty = True
    if fmt == "lines":
        for value, path in zip(label_values or [""], files, strict=True):
            for line, text in decoded_lines(path):
                if text.strip():
                    empty = False
                    yield Row(text, value, str(path), line)
    else:
        path = files[0]
        rows = _jsonl_rows(path, spec, labelled, fix) if fmt == "jsonl" else \
            _table_rows(path, spec, "\t" if fmt == "tsv" else ",", labelled, fix)
        for row in rows:
            empty = False
            yield row
    if empty:
        raise DataError(f"{files[0]}: {what} file holds no rows")


@dataclass
class Examples:
    """Texts with their labels as written in the file, and where each row came from (kept
    compact: a file number and a line number per row, for error messages)."""

    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    file_of: array = field(default_factory=lambda: array("H"))
    lines: array = field(default_factory=lambda: array("L"))

    def __len__(self) -> int:
        return len(self.texts)

    def add(self, row: Row) -> None:
        if not self.files or self.files[-1] != row.path:
            self.files.append(row.path)
        self.texts.append(row.text)
        self.labels.append(row.label)
        self.file_of.append(len(self.files) - 1)
        self.lines.append(row.line)

    def origin(self, i: int) -> tuple[str, int]:
        """(file, line) of row i."""
        return self.files[self.file_of[i]], self.lines[i]


def read_examples(spec: FileSpec, data_dir: str | Path, label_values: Sequence[str],
                  what: str = "data") -> Examples:
    """Read one [data] entry into memory."""
    out = Examples()
    for row in iter_rows(spec, data_dir, label_values, what):
        out.add(row)
    return out


def read_texts(path: Path, fmt: str = "auto", text_column: str | int = "text") -> list[str]:
    """Texts without labels, in file order (for `predict`): TSV/CSV with a header row, JSONL
    objects, or plain text with one text per line ('lines', also any unknown suffix)."""
    path = Path(path)
    if fmt == "auto":
        fmt = FORMATS_BY_SUFFIX.get(path.suffix.lower(), "lines")
    if fmt not in ("tsv", "csv", "jsonl", "lines"):
        raise DataError(f"{path}: unknown input format '{fmt}'; use tsv, csv, jsonl or lines")
    if fmt == "lines":
        open_checked(path, "input")
        texts = [text for _, text in decoded_lines(path) if text.strip()]
        if not texts:
            raise DataError(f"{path}: input file holds no texts")
        return texts
    spec = FileSpec(path=str(path), format=fmt, header=True, text_column=text_column)
    fix = "name the text column with --text-column"
    return [row.text for row in iter_rows(spec, "", (), "input", labelled=False, fix=fix)]
