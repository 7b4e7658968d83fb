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


def test_the_rows_cut_are_counted_over_the_whole_set_however_it_was_tokenized(
        tmp_path, tiny_model_dir, caplog, monkeypatch):
    """Under --nproc each rank tokenizes a share, and the count said was rank 0's share alone
    (the others' were at info, which ranks > 0 do not show); a cached set said none."""
    import threading

    from nlptrain.data import LabelVocab, load_file, shared_tokenize
    from nlptrain.data.shared_tokenize import Share

    monkeypatch.setattr(shared_tokenize, "SHARE_MIN_BYTES", 0)  # a small file shared too
    rows = [("long " * 40 if i % 3 == 0 else "short") + f"\t{'pos' if i % 2 else 'neg'}"
            for i in range(12)]  # rows 0, 3, 6, 9 are cut: 2 in each half
    (tmp_path / "train.tsv").write_text("text\tlabel\n" + "\n".join(rows) + "\n")
    spec, vocab = FileSpec(path="train.tsv"), LabelVocab.from_config(["neg", "pos"])
    said = "train: 4 of 12 rows were longer than max_length (16 tokens) and were truncated"
    results = {}

    def rank(index: int) -> None:
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
        results[index] = load_file(spec, tmp_path, vocab, tokenizer, 16, tmp_path / "cache",
                                   "train", share=Share(index, 2, "t", index))[0]

    with caplog.at_level(logging.INFO, logger="nlptrain"):
        ranks = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
        for thread in ranks:
            thread.start()
        for thread in ranks:
            thread.join(60)
    assert [results[i].truncated for i in range(2)] == [4, 4]
    assert caplog.text.count(said) == 2 and "rows 0-6" not in caplog.text, caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="nlptrain"):  # from the cache: said again
        tokenizer = AutoTokenizer.from_pretrained(str(tiny_model_dir))
        again = load_file(spec, tmp_path, vocab, tokenizer, 16, tmp_path / "cache", "train")[0]
    assert again.truncated == 4 and said in caplog.text and "from the token cache" in caplog.text
