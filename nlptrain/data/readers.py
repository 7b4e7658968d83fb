"""Readers for TSV, CSV, JSONL and one-file-per-label text files.

Every reader streams its file line by line from bytes, so a bad row or undecodable byte is
reported with its file and line, and memory does not grow beyond the rows kept. CRLF, a UTF-8 BOM
and blank lines (trailing or not) are accepted.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from nlptrain.config import FileSpec
from nlptrain.errors import DataError

FORMATS_BY_SUFFIX = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl"}


@dataclass
class Examples:
    """Texts with their labels as written in the file, and where each row came from."""

    texts: list[str] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    origins: list[tuple[str, int]] = field(default_factory=list)  # (file, line) for errors

    def __len__(self) -> int:
        return len(self.texts)

    def add(self, text: str, label: str, path: str, line: int) -> None:
        if not text.strip():
            raise DataError(f"{path}:{line}: the row has no text")
        if not label.strip():
            raise DataError(f"{path}:{line}: the row has no label")
        self.texts.append(text)
        self.labels.append(label.strip())
        self.origins.append((path, line))

    def extend(self, other: Examples) -> None:
        self.texts += other.texts
        self.labels += other.labels
        self.origins += other.origins


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


def _column(name: str | int, header: list[str] | None, path: Path, role: str) -> int:
    if isinstance(name, int):
        return name
    if header is None:
        raise DataError(f"{path}: {role} column '{name}' needs a header row; "
                        f"give a 0-based column index or set header = true")
    if name not in header:
        raise DataError(f"{path}:1: no {role} column '{name}' in the header {header}; "
                        f"set {role}_column in the task's [data]")
    return header.index(name)


def read_table(path: Path, spec: FileSpec, delimiter: str) -> Examples:
    """TSV (no quoting: text may hold quotes) or CSV (standard quoting) rows."""
    out = Examples()
    numbered = decoded_lines(path)
    line_of_row: list[int] = []

    def lines() -> Iterator[str]:
        for number, text in numbered:
            line_of_row.append(number)
            yield text + "\n"  # the csv module needs line ends to keep breaks in quoted cells

    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    rows = csv.reader(lines(), delimiter=delimiter, quoting=quoting, strict=True)
    header = None
    text_col = label_col = -1
    consumed = 0
    try:
        for row in rows:
            line, consumed = line_of_row[consumed], len(line_of_row)  # a quoted row may span lines
            if not any(cell.strip() for cell in row):
                continue  # blank line
            if spec.header and header is None:
                header = [cell.strip() for cell in row]
                text_col = _column(spec.text_column, header, path, "text")
                label_col = _column(spec.label_column, header, path, "label")
                continue
            if text_col < 0:
                text_col = _column(spec.text_column, None, path, "text")
                label_col = _column(spec.label_column, None, path, "label")
            needed = max(text_col, label_col) + 1
            if len(row) < needed:
                raise DataError(f"{path}:{line}: {len(row)} column(s), expected at least {needed} "
                                f"(text in column {text_col + 1}, label in column {label_col + 1})")
            out.add(row[text_col], row[label_col], str(path), line)
    except csv.Error as err:
        raise DataError(f"{path}:{line_of_row[-1]}: {err}") from None
    return out


def read_jsonl(path: Path, spec: FileSpec) -> Examples:
    out = Examples()
    for line, text in decoded_lines(path):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{line}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{line}: expected a JSON object per line")
        for role, key in (("text", spec.text_column), ("label", spec.label_column)):
            if str(key) not in row:
                raise DataError(f"{path}:{line}: no '{key}' field ({role}); "
                                f"set {role}_column in the task's [data]")
        out.add(str(row[str(spec.text_column)]), str(row[str(spec.label_column)]), str(path), line)
    return out


def read_lines(path: Path, label: str) -> Examples:
    out = Examples()
    for line, text in decoded_lines(path):
        if text.strip():
            out.add(text, label, str(path), line)
    return out


def read_examples(spec: FileSpec, data_dir: str | Path, label_values: list[str],
                  what: str = "data") -> Examples:
    """Read one [data] entry. For format 'lines', `path` holds `{label}`: one file per label."""
    fmt = format_of(spec) if "{label}" not in spec.path else "lines"
    base = Path(data_dir) if data_dir else Path(".")
    if fmt == "lines":
        if "{label}" not in spec.path:
            raise DataError(f"{spec.path}: format 'lines' needs a path with {{label}}, "
                            "e.g. 'rt-polarity/rt-polarity.{label}'")
        if not label_values:
            raise DataError(f"{spec.path}: format 'lines' needs the task's [data] labels")
        out = Examples()
        for value in label_values:
            path = open_checked(base / spec.path.format(label=value), what)
            out.extend(read_lines(path, value))
    else:
        path = open_checked(base / spec.path, what)
        if fmt == "jsonl":
            out = read_jsonl(path, spec)
        else:
            out = read_table(path, spec, "\t" if fmt == "tsv" else ",")
    if not len(out):
        raise DataError(f"{base / spec.path}: {what} file holds no rows")
    return out



def read_texts(path: Path, fmt: str = "auto", text_column: str | int = "text") -> list[str]:
    """Texts without labels, in file order (for `predict`): TSV/CSV with a header row, JSONL
    objects, or plain text with one text per line ('lines', also any unknown suffix)."""
    path = open_checked(Path(path), "input")
    if fmt == "auto":
        fmt = FORMATS_BY_SUFFIX.get(path.suffix.lower(), "lines")
    if fmt == "lines":
        texts = [text for _, text in decoded_lines(path) if text.strip()]
    elif fmt == "jsonl":
        texts = []
        for line, text in decoded_lines(path):
            if not text.strip():
                continue
            try:
                row = json.loads(text)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:{line}: not valid JSON ({err.msg})") from None
            if not isinstance(row, dict) or str(text_column) not in row:
                raise DataError(f"{path}:{line}: expected a JSON object with a '{text_column}' "
                                "field; name the text field with --text-column")
            if not str(row[str(text_column)]).strip():
                raise DataError(f"{path}:{line}: the row has no text")
            texts.append(str(row[str(text_column)]))
    elif fmt in ("tsv", "csv"):
        delimiter = "\t" if fmt == "tsv" else ","
        if isinstance(text_column, str):  # say which option fixes it (the task's key does not)
            first = next((t for _, t in decoded_lines(path) if t.strip()), "")
            header = [cell.strip() for cell in next(csv.reader([first], delimiter=delimiter))]
            if text_column not in header:
                raise DataError(f"{path}:1: no '{text_column}' column in the header {header}; "
                                "name the text column with --text-column")
        # No labels: the text column stands in for the label column the reader expects.
        spec = FileSpec(path=str(path), format=fmt, header=True, text_column=text_column,
                        label_column=text_column)
        texts = read_table(path, spec, delimiter).texts
    else:
        raise DataError(f"{path}: unknown input format '{fmt}'; use tsv, csv, jsonl or lines")
    if not texts:
        raise DataError(f"{path}: input file holds no texts")
    return texts
