"""Data: readers, label vocabulary, splits, tokenized sets (cached), batching, per-rank files,
streaming. `build_datasets` (datasets.py) is what the CLI uses.

Names are imported on first use, so a command that needs no torch (`split`, `--help`) starts
at once.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "build_datasets": "datasets", "Datasets": "datasets", "LabelVocab": "datasets",
    "stratified_split": "datasets", "load_file": "datasets",
    "TokenizedDataset": "tokenized", "Collator": "tokenized",
    "read_examples": "readers", "iter_rows": "readers",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"nlptrain.data.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'nlptrain.data' has no attribute {name!r}")
