"""Data: readers, label vocabulary, splits, tokenized sets (cached), batching, per-rank files,
streaming. `build_datasets` (datasets.py) is what the CLI uses.

Names are imported on first use, so a command that needs no torch (`split`, `--help`) starts
at once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker reads; at run time __getattr__ imports on first use
    from nlptrain.data.datasets import (
        Datasets,
        LabelVocab,
        build_datasets,
        entry_files,
        load_file,
        stratified_split,
    )
    from nlptrain.data.readers import iter_rows, read_examples
    from nlptrain.data.tokenized import Collator, TokenizedDataset

_EXPORTS = {
    "build_datasets": "datasets", "Datasets": "datasets", "LabelVocab": "datasets",
    "stratified_split": "datasets", "load_file": "datasets", "entry_files": "datasets",
    "TokenizedDataset": "tokenized", "Collator": "tokenized",
    "read_examples": "readers", "iter_rows": "readers",
}
# _EXPORTS' names, and the TYPE_CHECKING imports' (tests/test_typing.py)
__all__ = ["Collator", "Datasets", "LabelVocab", "TokenizedDataset", "build_datasets",
           "entry_files", "iter_rows", "load_file", "read_examples", "stratified_split"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"nlptrain.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'nlptrain.data' has no attribute {name!r}")
