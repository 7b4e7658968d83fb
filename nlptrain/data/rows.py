"""One row of input, as every reader yields it, and the checks each row passes whatever its
format: a text (and a pair's second text) that is a non-empty string, a label or a list of labels.
The readers (TSV, CSV, JSONL, Parquet, 🤗 datasets) differ only in how they find the cells."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from nlptrain.config import FileSpec
from nlptrain.errors import DataError


class Row(NamedTuple):
    text: str
    label: str | list[str]  # as written in the file ('' when reading texts alone); a JSON list stays a list
    path: str
    line: int
    pair: str | None = None  # the second text of a pair task
    kept: dict[str, object] | None = None  # other columns, as read, that predict writes back


KEEP = "keep:"  # the role of a column read only to be written back (predict --keep-columns)


def checked_row(cells: dict[str, object], path: Path, line: int, empty_label_ok: bool = False) -> Row:
    """A Row from the cells of one record (roles text, pair, label; kept columns), each checked.
    With `empty_label_ok` (a multi-label task), an empty label cell is a row with none of the
    labels, as a JSON `[]` is."""
    row = _checked_row(cells, path, line, empty_label_ok)
    kept = {role.removeprefix(KEEP): value for role, value in cells.items()
            if role.startswith(KEEP)}
    return row._replace(kept=kept) if kept else row


def _checked_row(cells: dict[str, object], path: Path, line: int, empty_label_ok: bool) -> Row:
    text, pair, label = (_decoded(cells.get(role), path, line) for role in ("text", "pair", "label"))
    # JSONL and Parquet cells have types: a list or an object is no text, and str() of it
    # would train on its Python repr (or make one label class of it).
    for role, value in (("text", text), ("second text", pair), ("label", label)):
        nested = isinstance(value, dict) or (isinstance(value, list) and (
            role != "label" or any(isinstance(v, (list, dict)) for v in value)))
        if nested:
            raise DataError(f"{path}:{line}: the {role} is a {type(value).__name__} "
                            f"({str(value)[:60]}), not " + ("a string" if role != "label" else
                                                            "a label or a list of labels"))
        if role != "label" and isinstance(value, bool | int | float):  # str() would train on
            # "True", or on an id column's numbers ("101")
            said = str(value).lower() if isinstance(value, bool) else value
            raise DataError(f"{path}:{line}: the {role} is {said} (a {_TYPE_NAMES[type(value)]}), "
                            "not a string: is the column the right one?")
    if text is None or not str(text).strip():
        raise DataError(f"{path}:{line}: the row has no text")
    if "pair" in cells and (pair is None or not str(pair).strip()):
        raise DataError(f"{path}:{line}: the row has no second text (the pair's other side)")
    pair = None if pair is None else str(pair)
    if "label" not in cells:
        return Row(str(text), "", str(path), line, pair)
    if isinstance(label, list):  # JSONL: a list of labels (multi-label); may be empty
        if any(v is None for v in label):  # str() would make a label "None"
            raise DataError(f"{path}:{line}: the label list holds a null ({str(label)[:60]}); "
                            "list the row's labels by name")
        names = [label_text(v) for v in label]
        twice = next((name for name in names if names.count(name) > 1), None)
        if twice is not None:  # a 0/1 row ([0, 1, 1]) would train labels "0" and "1"
            raise DataError(f"{path}:{line}: the label list names '{twice}' more than once "
                            f"({str(label)[:60]}); list the row's labels by name "
                            "([\"joy\", \"fear\"]), not a 0/1 column per label")
        return Row(str(text), names, str(path), line, pair)
    if isinstance(label, float) and math.isnan(label):  # a missing value (Spark's, polars'), as
        raise DataError(f"{path}:{line}: the row has no label (NaN: a missing value)")  # null is:
    if label is None or not str(label).strip():  # not a class "nan", nor a score
        if empty_label_ok and label is not None:  # null is a value left out, not "no label"
            return Row(str(text), [], str(path), line, pair)
        raise DataError(f"{path}:{line}: the row has no label" + (
            " (null; an empty list or cell lists none of the labels)" if empty_label_ok else ""))
    return Row(str(text), label_text(label).strip(), str(path), line, pair)


_TYPE_NAMES = {bool: "boolean", int: "number", float: "number"}


def label_text(value: object) -> str:
    """A label as the file spells it: a JSON, TOML or Parquet boolean as "true"/"false" (as JSON
    and Arrow write it; str() gave "True", which a task's labels = ["false", "true"] refused)."""
    return ("true" if value else "false") if isinstance(value, bool) else str(value)


def _decoded(value: object, path: Path, line: int) -> object:
    """A Parquet binary cell (older Spark and Hive writers' strings) as its text: str() of it
    would train on "b'...'"."""
    if isinstance(value, list):
        return [_decoded(v, path, line) for v in value]
    if not isinstance(value, bytes):
        return value
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        raise DataError(f"{path}:{line}: a binary cell that is not UTF-8 text "
                        f"({value[:30]!r}...)") from None


Roles = list[tuple[str, str | int]]


def roles_of(spec: FileSpec, labelled: bool, keep: Sequence[str | int] = ()) -> Roles:
    """(role, column) of what a record holds: the text, the pair's second text, the label, and
    the columns to keep."""
    roles: Roles = [("text", spec.text_column)]
    if spec.text_pair_column != "":
        roles.append(("pair", spec.text_pair_column))
    if labelled:
        roles.append(("label", spec.label_column))
    return roles + [(KEEP + str(name), name) for name in keep]


def role_text(role: str) -> str:
    return "kept" if role.startswith(KEEP) else role


TASK_FIX = "set {role}_column in the task's [data] (or --{flag}-column)"


def column_fix(fix: str, role: str) -> str:
    """`fix` (TASK_FIX, or a caller's) for a column role: a pair's key is text_pair_column."""
    if role.startswith(KEEP):
        return "check --keep-columns"
    key = "text_pair" if role == "pair" else role
    return fix.format(role=key, flag=key.replace("_", "-"))

