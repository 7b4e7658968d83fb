"""Readers for TSV, CSV, JSONL, Parquet and one-file-per-label text files.

Every reader streams its file (line by line from bytes; Parquet by record batches), so a bad row
or undecodable byte is reported with its file and line (a Parquet file's 1-based row number), and
memory does not grow beyond the rows kept. CRLF, a UTF-8 BOM and blank lines are accepted.
"""

from __future__ import annotations

import csv
import json
import logging
import re
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from nlptrain.config import FileSpec
from nlptrain.data.numbered_header import check_numbered_header
from nlptrain.data.parquet import parquet_rows  # (pyarrow is imported only when asked)
from nlptrain.data.ragged_rows import RaggedRows
from nlptrain.data.rows import TASK_FIX, Roles, Row, checked_row, column_fix, role_text, roles_of
from nlptrain.data.text_files import PACKED_SUFFIXES, decoded_lines, open_checked, packed
from nlptrain.errors import DataError
from nlptrain.task_files import CHOICES

log = logging.getLogger(__name__)

# Where a file's format is said, for a file read in another than its own.
TASK_FORMAT_FIX = "Say so in its own table (--set data.<train|valid|test>.format={format})"
FORMATS_BY_SUFFIX = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl",
                     ".parquet": "parquet"}


def read_format(spec: FileSpec) -> str:
    """The format a [data] entry is read in: a path with {label} is one file per label, one text
    a line; else its own (`format_of`)."""
    return "lines" if "{label}" in spec.path else format_of(spec)


def format_of(spec: FileSpec) -> str:
    if spec.format != "auto":
        formats = CHOICES[("data", "format")]  # a per-file table's is not checked with [data]'s
        if spec.format not in formats:
            raise DataError(f"{spec.path}: unknown format '{spec.format}'; use one of "
                            f"{', '.join(sorted(formats))}")
        return spec.format
    suffix = Path(spec.path).suffix.lower()
    if suffix in PACKED_SUFFIXES:  # (its format is the one of the file it holds)
        raise DataError(packed(spec.path, PACKED_SUFFIXES[suffix]))
    if suffix not in FORMATS_BY_SUFFIX:
        raise DataError(f"{spec.path}: cannot tell the format from '{suffix}'; give --data-format "
                        "(format = 'tsv', 'csv', 'jsonl', 'parquet' or 'lines' in the task's [data])")
    return FORMATS_BY_SUFFIX[suffix]


def _column(name: str | int, header: list[str] | None, path: Path, role: str, fix: str,
            format_fix: str = "") -> int:
    if isinstance(name, int):
        if name < 0:  # Python's from the end: a text column -1 read the label as the text
            raise DataError(f"{path}: {role} column {name}: columns count from 0, the first; "
                            f"{fix}")
        return name
    if header is None:
        raise DataError(f"{path}: {role} column '{name}' needs a header row; give a 0-based "
                        "column index, or --header (header = true in a task's [data])")
    if name not in header:
        one = header[0] if len(header) == 1 else ""
        other = "jsonl" if header[0].lstrip().startswith("{") else "csv" if "," in one else \
            "tsv" if "\t" in one else ""
        if ";" in one and not other:  # a spreadsheet's CSV in a locale whose decimal mark is ','
            fix = (f"the header is one cell: is the file separated by ';'? Commas (.csv) and tabs "
                   f"(.tsv) are read: save it with one of them; or {fix}")
        if other:  # a whole line in one cell, or JSON split at its commas: another format
            fix = (f"the header is {'one cell' if one else 'a JSON object'}: is the file "
                   f"{other}? {format_fix.format(format=other)}; or {fix}")
        raise DataError(f"{path}:1: no {role} column '{name}' in the header {header}; {fix}")
    if header.count(name) > 1:  # which one is meant cannot be told
        raise DataError(f"{path}:1: the header names {header.count(name)} columns '{name}' "
                        f"({role}); rename all but one")
    return header.index(name)


def quoted_cells_hint(row: list[str], quoting: int) -> str:
    """For a TSV row that does not fit: quotes at a cell's ends mean a file that quotes its cells
    (as csv writers do), which TSV reads as plain text unless told."""
    quoted = any(cell.strip()[:1] == '"' or cell.strip()[-1:] == '"' for cell in row)
    return ("cells in quotes? If the file quotes its cells (as csv writers do), give --quoted "
            "(quoted = true in the task's [data])" if quoting == csv.QUOTE_NONE and quoted else "")


def _table_rows(path: Path, spec: FileSpec, delimiter: str, roles: Roles, fix: str,
                empty_label_ok: bool, label_values: Sequence[str] = (),
                format_fix: str = "") -> Iterator[Row]:
    """TSV (no quoting: text may hold quotes) or CSV (standard quoting; a row may span lines)."""
    line_of_row: list[int] = []

    def lines() -> Iterator[str]:
        for number, text in decoded_lines(path):
            line_of_row.append(number)
            yield text + "\n"  # the csv module needs line ends to keep breaks in quoted cells

    quoting = csv.QUOTE_NONE if delimiter == "\t" and not spec.quoted else csv.QUOTE_MINIMAL
    extra_cells_fix = ("a text holding a tab? Replace it by a space (TSV has no quoting)"
                       if quoting == csv.QUOTE_NONE else 'a text holding a separator? Quote the '
                       'cell ("...", with "" for a quote inside)')
    csv.field_size_limit(2**31 - 1)  # long documents are rows too (the default refuses > 128 KiB)
    rows = csv.reader(lines(), delimiter=delimiter, quoting=quoting, strict=True)
    header: list[str] | None = None
    columns: dict[str, int] = {}  # role -> column
    ragged = RaggedRows()
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
            elif header is not None and row[0].strip().removeprefix("\ufeff") == header[0] and \
                    [cell.strip().removeprefix("\ufeff") for cell in row] == header:  # (joined
                # BOM'd exports keep their BOM); read as data, it would be a class
                raise DataError(f"{path}:{line}: the header row again (files joined with cat?); "
                                "remove it, e.g. join them with tail -n +2 for each file after "
                                "the first")
            if not columns:
                columns = {role: _column(name, header, path, role_text(role),
                                         column_fix(fix, role), format_fix)
                           for role, name in roles}
                if header is not None:
                    check_numbered_header(header, columns, spec, label_values, path, line)
                    continue
            if len(row) <= max(columns.values()):
                where = ", ".join(f"{role_text(role)} in column {c + 1}"
                                  for role, c in columns.items())
                beyond = next(role for role, c in columns.items() if c >= len(row))
                hint = quoted_cells_hint(row, quoting) or column_fix(fix, beyond)
                raise DataError(f"{path}:{line}: {len(row)} column(s), expected at least "
                                f"{max(columns.values()) + 1} ({where}); {hint}")
            # Fewer, and a cell opens a quote it leaves open: the first line of a quoted cell that
            # spans lines, each line read as a row (a command that reads only the text column,
            # predict's, would score its pieces). Quotes in a text ("Jaws" is a classic, a TV
            # of 55") open none.
            if header is not None and len(row) < len(header) and quoting == csv.QUOTE_NONE and \
                    any(cell.startswith('"') and cell.count('"') % 2 for cell in row):
                raise DataError(f"{path}:{line}: {len(row)} column(s), but the header has "
                                f"{len(header)}; {quoted_cells_hint(row, quoting)}")
            # More cells than the header names: a tab (TSV) or comma (CSV) inside a text has
            # shifted the cells, so the label column would read a piece of the text. Without a
            # header, cells past the columns read that differ from row to row are said at the end.
            if header is not None and any(cell.strip() for cell in row[len(header):]):
                raise DataError(f"{path}:{line}: {len(row)} columns, but the header has "
                                f"{len(header)}; {quoted_cells_hint(row, quoting) or extra_cells_fix}")
            if header is None:
                ragged.add(row, max(columns.values()), line)
            yield checked_row({role: row[c] for role, c in columns.items()}, path, line,
                              empty_label_ok)
        if columns:
            ragged.say(path, max(columns.values()), "TSV has no quoting: replace such a tab by a "
                       "space" if quoting == csv.QUOTE_NONE else 'quote such a cell ("...")')
    except csv.Error as err:
        if "unexpected end of data" in str(err) and line_of_row:
            # A quote never closed: csv read to the end of the file; the culprit is where it opened.
            raise DataError(f"{path}:{line_of_row[0]}: a quoted cell that starts in this row is never "
                            "closed (no matching \"); close it, or double a quote inside a cell "
                            "(\"\")") from None
        # Where the row began (its opening quote, here), and how far csv read it.
        first, last = (line_of_row[0], line_of_row[-1]) if line_of_row else (line, line)
        where = f"{path}:{first}" + (f" (its quoted cell read on into line {last})" if last != first else "")
        if "expected after '\"'" in str(err):  # a text that begins with a quote, read as quoting
            cure = ("give --no-quoted (quoted = false in the task's [data]): the file's quotes "
                    "are text" if delimiter == "\t" else 'quote the whole cell, with "" for '
                    "each quote inside")
            raise DataError(f"{where}: a cell starts with a quote that is not CSV quoting (its "
                            f"closing quote is not at the cell's end); {cure}") from None
        raise DataError(f"{where}: {err}") from None


def _jsonl_rows(path: Path, roles: Roles, fix: str, empty_label_ok: bool) -> Iterator[Row]:
    first = True  # the file's first line: a whole document's start, where it is one
    for line, text in decoded_lines(path):
        if not text.strip():
            continue
        whole, first = _not_lines(text) if first else "", False
        try:
            row = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(f"{path}:{line}: not valid JSON ({err.msg}){whole}") from None
        if not isinstance(row, dict):
            raise DataError(f"{path}:{line}: expected a JSON object per line{whole}")
        if "\\ud" in text.lower():  # an escaped half of a UTF-16 pair, maybe alone: see below
            row = _whole_characters(row, path, line)
        cells = {}
        for role, key in roles:
            if str(key) not in row:
                raise DataError(f"{path}:{line}: no '{key}' field ({role_text(role)}); "
                                f"{column_fix(fix, role)}")
            cells[role] = row[str(key)]
        yield checked_row(cells, path, line, empty_label_ok)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # what json.loads leaves of a lone "\\ud83d"


def _whole_characters(row: dict, path: Path, line: int) -> dict:
    """The row with each lone UTF-16 surrogate (an emoji cut in half, as social-media exports
    have them) read as U+FFFD, said once a file: no tokenizer takes one (a TypeError)."""
    def whole(value: object) -> object:
        if isinstance(value, str) and _LONE_SURROGATE.search(value):
            if str(path) not in _SAID_SURROGATES:
                _SAID_SURROGATES.add(str(path))
                log.warning("%s:%d: a lone UTF-16 surrogate escape (half an emoji?) read as "
                            "U+FFFD (and any later ones in the file)", path, line)
            return _LONE_SURROGATE.sub("\ufffd", value)
        if isinstance(value, dict):  # (a kept column's object)
            return {key: whole(v) for key, v in value.items()}
        return [whole(v) for v in value] if isinstance(value, list) else value

    return {key: whole(value) for key, value in row.items()}


_SAID_SURROGATES: set[str] = set()


def _not_lines(text: str) -> str:
    """Why a line of a whole JSON document (an array, an object over several lines) fails."""
    if text.lstrip().startswith("["):
        return ("; one object a line (JSON Lines) is read, and this file is a JSON array: "
                "convert it, e.g. jq -c '.[]' IN > OUT")
    if text.strip() == "{":
        return ("; one object a line (JSON Lines) is read, and this object spans lines: "
                "convert the file, e.g. jq -c . IN > OUT")
    return ""


def source_files(spec: FileSpec, data_dir: str | Path, label_values: Sequence[str],
                 what: str = "data") -> list[Path]:
    """The files one [data] entry reads, checked to exist (one per label for format 'lines')."""
    base = Path(data_dir) if data_dir else Path(".")
    if "{label}" not in spec.path:
        if spec.format == "lines":  # which file holds which label's lines is in the path alone
            raise DataError(f"{spec.path}: format 'lines' reads one file per label and needs "
                            "{label} in the path, e.g. 'train.{label}.txt'")
        return [open_checked(base / spec.path, what, spec.path)]
    if not label_values:
        raise DataError(f"{spec.path}: format 'lines' needs the task's [data] labels")
    return [open_checked(base / spec.path.replace("{label}", v), what, spec.path.replace("{label}", v))
            for v in label_values]


def iter_rows(spec: FileSpec, data_dir: str | Path, label_values: Sequence[str] = (),
              what: str = "data", labelled: bool = True, fix: str = TASK_FIX,
              empty_label_ok: bool = False, keep: Sequence[str | int] = (),
              format_fix: str = TASK_FORMAT_FIX) -> Iterator[Row]:
    """Every row of one [data] entry in file order, read lazily; errors name file and line.
    For format 'lines' (a path with {label}), one file per label value, one text a line.
    `empty_label_ok`: an empty label cell lists no labels (a multi-label task's row). `keep`:
    other columns each row carries as they are (`Row.kept`)."""
    fmt = read_format(spec)
    files = source_files(spec, data_dir, list(label_values), what)
    empty = True
    if fmt == "lines":
        for value, path in zip(label_values or [""], files, strict=True):
            for line, text in decoded_lines(path):
                if text.strip():
                    empty = False
                    yield Row(text, value, str(path), line)
    else:
        path, roles = files[0], roles_of(spec, labelled, keep)
        if fmt == "jsonl":
            rows = _jsonl_rows(path, roles, fix, empty_label_ok)
        elif fmt == "parquet":
            rows = parquet_rows(path, roles, fix, empty_label_ok)
        else:
            rows = _table_rows(path, spec, "\t" if fmt == "tsv" else ",", roles, fix,
                               empty_label_ok, label_values, format_fix)
        for row in rows:
            empty = False
            yield row
    if empty:
        raise DataError(f"{files[0]}: {what} file holds no rows")


@dataclass
class Examples:
    """Texts (and second texts of pairs) with their labels as written in the file, and where each
    row came from (kept compact: a file number and a line number per row, for error messages)."""

    texts: list[str] = field(default_factory=list)
    labels: list[str | list[str]] = field(default_factory=list)
    pairs: list[str] | None = None  # the second texts, for a pair task
    files: list[str] = field(default_factory=list)
    file_of: array = field(default_factory=lambda: array("H"))
    lines: array = field(default_factory=lambda: array("L"))
    kept: list[dict[str, object]] | None = None  # each row's kept columns (predict)

    def __len__(self) -> int:
        return len(self.texts)

    def add(self, row: Row) -> None:
        if not self.files or self.files[-1] != row.path:
            self.files.append(row.path)
        self.texts.append(row.text)
        self.labels.append(row.label)
        if row.pair is not None:
            self.pairs = [] if self.pairs is None else self.pairs
            self.pairs.append(row.pair)
        self.file_of.append(len(self.files) - 1)
        self.lines.append(row.line)
        if row.kept is not None:
            self.kept = [] if self.kept is None else self.kept
            self.kept.append(row.kept)

    def origin(self, i: int) -> tuple[str, int]:
        """(file, line) of row i."""
        return self.files[self.file_of[i]], self.lines[i]


def read_examples(spec: FileSpec, data_dir: str | Path, label_values: Sequence[str],
                  what: str = "data", empty_label_ok: bool = False) -> Examples:
    """Read one [data] entry into memory."""
    out = Examples()
    for row in iter_rows(spec, data_dir, label_values, what, empty_label_ok=empty_label_ok):
        out.add(row)
    return out


def read_texts(path: Path, fmt: str = "auto", text_column: str | int = "text",
               text_pair_column: str | int = "", keep: Sequence[str | int] = (), header: bool = True,
               quoted: bool = False) -> Examples:
    """Texts without labels, in file order (for `predict`): TSV/CSV (`header`, `quoted` as in a
    task's [data]), JSONL objects, Parquet, or plain text with one text per line ('lines', also
    any unknown suffix). With `text_pair_column`, each row is a pair; with `keep`, each row
    carries those columns too (not 'lines')."""
    path = Path(path)
    if fmt == "auto":
        fmt = FORMATS_BY_SUFFIX.get(path.suffix.lower(), "lines")
    if fmt not in ("tsv", "csv", "jsonl", "parquet", "lines"):
        raise DataError(f"{path}: unknown input format '{fmt}'; use tsv, csv, jsonl, parquet or "
                        "lines")
    out = Examples()
    if fmt == "lines":
        if text_pair_column != "" or keep:
            need = "pairs need" if text_pair_column != "" else "--keep-columns needs"
            raise DataError(f"{path}: {need} columns; give a .tsv, .csv, .jsonl or .parquet "
                            "input (a file of tab-separated columns: --input-format tsv)")
        open_checked(path, "input")
        for line, text in decoded_lines(path):
            if text.strip():
                out.add(Row(text, "", str(path), line))
        if not out:
            raise DataError(f"{path}: input file holds no texts")
        return out
    spec = FileSpec(path=str(path), format=fmt, header=header, quoted=quoted,
                    text_column=text_column, text_pair_column=text_pair_column)
    fix = "name the {role} column with --{flag}-column"
    if fmt in ("tsv", "csv"):  # (no pairs in a file of lines)
        lines = "; one text a line: --input-format lines" if text_pair_column == "" else ""
        fix += f" (a file without a header row: --no-header and its 0-based index{lines})"
    for row in iter_rows(spec, "", (), "input", labelled=False, fix=fix, keep=keep,
                         format_fix="Give --input-format {format}"):
        out.add(row)
    return out
