"""A 1 MB text is a row like any other: read from TSV and CSV, truncated to max_length, counted."""

from __future__ import annotations

import logging

import pytest
from transformers import AutoTokenizer

from nlptrain.config import FileSpec
from nlptrain.data import TokenizedDataset
from nlptrain.data.readers import read_examples

LONG = " ".join(["long"] * 210_000)  # 1 MB, far above the csv module's 128 KiB field limit


@pytest.mark.parametrize("suffix", ["tsv", "csv"])
def test_a_1mb_row_is_read_truncated_and_counted(tmp_path, tiny_model_dir, caplog, suffix):
    sep = "\t" if suffix == "tsv" else ","
    path = tmp_path / f"train.{suffix}"
    path.write_text(f"text{sep}label\nshort one{sep}pos\n{LONG}{sep}neg\nanother{sep}pos\n")
    assert len(LONG) > 1_000_000
    examples = read_examples(FileSpec(path=str(path)), tmp_path, ["neg", "pos"])
    assert [len(t) for t in examples.texts] == [9, len(LONG), 7]
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    with caplog.at_level(logging.INFO, logger="nlptrain"):
        data = TokenizedDataset.from_texts(examples.texts, [1, 0, 1], tokenizer, max_length=32,
                                           what="train")
    assert list(data.lengths) == [4, 32, 3]  # [CLS] ... [SEP]
    assert "train: 1 of 3 rows were longer than max_length (32 tokens) and were truncated" in caplog.text
