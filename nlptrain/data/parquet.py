"""Parquet files, read by record batches: a bad row is named by its 1-based row number, and
memory holds one batch of the columns read."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from nlptrain.data.rows import Roles, Row, checked_row, column_fix, role_text
from nlptrain.errors import DataError


def parquet_rows(path: Path, roles: Roles, fix: str, empty_label_ok: bool) -> Iterator[Row]:
    """Rows of a Parquet file by record batches; columns by name (or 0-based index), row numbers
    1-based. A list column is a multi-label cell, a number a class id or score."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{path}: reading Parquet needs pyarrow: pip install 'nlptrain[parquet]'"
                        ) from None
    try:
        table = pq.ParquetFile(path)
    except Exception as err:  # pyarrow's errors have no common base worth naming
        raise DataError(f"{path}: not a readable Parquet file ({err})") from None
    names = table.schema_arrow.names
    twice = next((name for name in names if names.count(name) > 1), None)
    if twice is not None:  # pyarrow's KeyError otherwise, as a traceback
        raise DataError(f"{path}: the file names {names.count(twice)} columns '{twice}'; rename "
                        "all but one")
    columns = {}
    for role, name in roles:
        if isinstance(name, int):
            name = names[name] if 0 <= name < len(names) else str(name)
        if name not in names:
            raise DataError(f"{path}: no {role_text(role)} column '{name}' in the columns {names}; "
                            f"{column_fix(fix, role)}")
        columns[role] = name
    number = 0
    for batch in table.iter_batches(columns=list(dict.fromkeys(columns.values()))):
        cells = {role: batch.column(name).to_pylist() for role, name in columns.items()}
        for i in range(batch.num_rows):
            number += 1
            yield checked_row({role: values[i] for role, values in cells.items()}, path, number,
                              empty_label_ok)
