"""Rows "text 0", "text 1", ... tokenized with their labels: the Python API tests' small sets."""

from __future__ import annotations

from typing import Any

from nlptrain.data import TokenizedDataset


def numbered_rows(tokenizer: Any, labels: list) -> TokenizedDataset:
    return TokenizedDataset.from_texts([f"text {i}" for i in range(len(labels))], labels,
                                       tokenizer, 16)
