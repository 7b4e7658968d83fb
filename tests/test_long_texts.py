"""A text far longer than the tokens kept of it: the tokenizer sees only a cut of it (a 20 MB
cell took 2.9 GB and 14 s whole), and the kept tokens are the whole text's, alone or in a pair,
from a tokenized set and from a stream."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from nlptrain.config import FileSpec
from nlptrain.data import Collator, TokenizedDataset
from nlptrain.data.long_texts import CHARS_PER_TOKEN
from nlptrain.data.streaming import StreamingDataset
from nlptrain.models import load_tokenizer

MAX_LENGTH = 16
LIMIT = MAX_LENGTH * CHARS_PER_TOKEN


def prose(words: int, seed: int) -> str:
    pick = random.Random(seed)
    vocabulary = ["film", "good", "the", "plot,", "actors", "boring.", "a", "wonderful", "score"]
    return " ".join(pick.choice(vocabulary) for _ in range(words))


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    return load_tokenizer(str(tiny_model_dir))


@pytest.fixture
def longest_seen(tokenizer, monkeypatch) -> list[int]:
    """The longest text each call of the tokenizer was given."""
    seen: list[int] = []
    call = type(tokenizer).__call__

    def spy(self, text=None, text_pair=None, *args, **kwargs):
        seen.append(max(len(t) for t in [*(text or []), *(text_pair or [])]))
        return call(self, text, text_pair, *args, **kwargs)

    monkeypatch.setattr(type(tokenizer), "__call__", spy)
    return seen


def whole(tokenizer, text: str, pair: str | None = None) -> list[int]:
    return tokenizer(text, pair, truncation=True, max_length=MAX_LENGTH)["input_ids"]


def rows_of(dataset: TokenizedDataset) -> list[list[int]]:
    return [dataset[i]["input_ids"].tolist() for i in range(len(dataset))]


def test_a_long_texts_tokens_are_the_whole_texts_from_a_cut_of_it(tokenizer, longest_seen) -> None:
    long, short = prose(20_000, 1), prose(3, 2)
    # Both sides long: whole, the tokenizer's overflow of a pair is every pair of its sides'
    # pieces (two 120 kB texts passed 24 GB), so the reference is made at twice the mark.
    both = prose(180, 3), prose(190, 4)
    texts, pairs = [long, short, both[0], short], [short, long, both[1], short]
    expected = [whole(tokenizer, t, p) for t, p in zip(texts, pairs, strict=True)]
    assert len(long) > 200 * LIMIT and min(map(len, both)) > 2 * LIMIT
    longest_seen.clear()
    pair_rows = TokenizedDataset.from_texts(texts, [0, 1, 0, 1], tokenizer, MAX_LENGTH, pairs=pairs)
    assert rows_of(pair_rows) == expected
    assert max(longest_seen) <= LIMIT  # the long texts were never tokenized whole
    assert pair_rows.truncated == 3  # still counted as cut
    single = TokenizedDataset.from_texts(texts, [0, 1, 0, 1], tokenizer, MAX_LENGTH)
    assert rows_of(single) == [whole(tokenizer, t) for t in texts]
    assert max(longest_seen) <= LIMIT


def test_a_long_text_of_few_tokens_is_tokenized_whole(tokenizer, longest_seen) -> None:
    """Past the mark but fewer than max_length tokens before it (spaces, a long unknown word):
    a cut could lose tokens, so the tokenizer reads it whole."""
    spaced = "good" + " " * (2 * LIMIT) + prose(40, 4)
    one_word = "x" * (2 * LIMIT) + " " + prose(40, 5)
    rows = TokenizedDataset.from_texts([spaced, one_word], [0, 1], tokenizer, MAX_LENGTH)
    assert rows_of(rows) == [whole(tokenizer, spaced), whole(tokenizer, one_word)]
    assert max(longest_seen) > 2 * LIMIT


def test_a_streamed_long_text_is_cut_alike(tokenizer, longest_seen, tmp_path: Path) -> None:
    long = prose(20_000, 6)
    (tmp_path / "train.tsv").write_text(f"text\tlabel\n{long}\tpos\nshort one\tneg\n")
    stream = StreamingDataset(FileSpec(path="train.tsv", format="tsv"), tmp_path,
                              {"neg": 0, "pos": 1}, tokenizer, MAX_LENGTH, 0, 1, seed=5)
    batches = list(DataLoader(stream, batch_size=2, collate_fn=Collator(0)))
    by_index = {int(i): row for b in batches for i, row in zip(b["index"], b["input_ids"], strict=True)}
    assert by_index[0][:MAX_LENGTH].tolist() == whole(tokenizer, long)
    assert max(longest_seen) <= LIMIT
