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
    """The longest text each call of the tokenizer was given (a pair's sides too)."""
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
    texts, pairs = [long, short, long, short], [short, long, prose(3, 3), short]
    expected = [whole(tokenizer, t, p) for t, p in zip(texts, pairs, strict=True)]
    assert len(long) > 200 * LIMIT
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


def mixed(pick: random.Random, characters: int) -> str:
    """Words, numbers and runs of punctuation: sides whose tokens a character count does not
    tell, so that a cut side may have fewer tokens than the other side has whole."""
    pieces = ["film", "the", "wonderful", "3.14159,2.71828;", "!!!", "w0rd5", "a", "é"]
    weights = [pick.random() for _ in pieces]
    text = ""
    while len(text) < characters:
        text += pick.choices(pieces, weights)[0] + pick.choice([" ", " ", "  ", "\n", "\r\n"])
    return text


@pytest.mark.parametrize("max_length", [16, 17])  # a pair's budget odd (13), even (14)
def test_a_pairs_kept_tokens_are_its_whole_sides_whatever_is_cut(tokenizer, max_length) -> None:
    """Longest-first truncation keeps of each side what the shorter side's length says: a cut
    that made the longer side the shorter one (or the two alike) moved a token from one side to
    the other under an odd budget."""
    pick = random.Random(max_length)
    limit = max_length * CHARS_PER_TOKEN
    texts, pairs = [], []
    sizes = [20, limit // 2, limit + 50, 2 * limit]
    for _ in range(80):
        texts.append(mixed(pick, pick.choice(sizes)))
        pairs.append(mixed(pick, pick.choice(sizes)))
    texts.append("word " * 1000)  # the other side shorter in characters, longer in tokens
    pairs.append("!" * (limit - 20))
    expected = [tokenizer(t, p, truncation=True, max_length=max_length)["input_ids"]
                for t, p in zip(texts, pairs, strict=True)]
    rows = TokenizedDataset.from_texts(texts, [0] * len(texts), tokenizer, max_length, pairs=pairs)
    assert rows_of(rows) == expected


@pytest.mark.parametrize("max_length", [16, 17])  # a pair's budget odd (13), even (14)
def test_two_long_sides_keep_the_whole_sides_tokens(tokenizer, longest_seen, max_length) -> None:
    """Cut at the mark, "word word ..." holds fewer tokens than "! ! ...", whole it holds more:
    under an odd budget the odd token goes to the whole sides' longer one, so those sides are
    read whole; under an even one each keeps half the budget, and both are cut."""
    limit = max_length * CHARS_PER_TOKEN
    words, marks = "word " * (6 * limit // 5), "! " * (3 * limit // 4)
    texts, pairs = [words, marks, words], [marks, words, words]
    expected = [tokenizer(t, p, truncation=True, max_length=max_length)["input_ids"]
                for t, p in zip(texts, pairs, strict=True)]
    longest_seen.clear()
    rows = TokenizedDataset.from_texts(texts, [0, 1, 0], tokenizer, max_length, pairs=pairs)
    assert rows_of(rows) == expected
    assert (max(longest_seen) < len(words)) == (max_length == 17)


def test_a_tokenizer_that_keeps_a_texts_end_reads_it_whole(tiny_model_dir: Path) -> None:
    left = load_tokenizer(str(tiny_model_dir))
    left.truncation_side = "left"
    text = " ".join(f"w{i}" for i in range(1500))
    rows = TokenizedDataset.from_texts([text], [0], left, MAX_LENGTH)
    assert rows_of(rows) == [left(text, truncation=True, max_length=MAX_LENGTH)["input_ids"]]
    assert left.decode(rows_of(rows)[0], skip_special_tokens=True).split()[-1] == "w1499"


def test_a_streamed_long_text_is_cut_alike(tokenizer, longest_seen, tmp_path: Path) -> None:
    long = prose(20_000, 6)
    (tmp_path / "train.tsv").write_text(f"text\tlabel\n{long}\tpos\nshort one\tneg\n")
    stream = StreamingDataset(FileSpec(path="train.tsv", format="tsv"), tmp_path,
                              {"neg": 0, "pos": 1}, tokenizer, MAX_LENGTH, 0, 1, seed=5)
    batches = list(DataLoader(stream, batch_size=2, collate_fn=Collator(0)))
    by_index = {int(i): row for b in batches for i, row in zip(b["index"], b["input_ids"], strict=True)}
    assert by_index[0][:MAX_LENGTH].tolist() == whole(tokenizer, long)
    assert max(longest_seen) <= LIMIT


def byte_level_bpe(corpus: list[str]):
    """A GPT-2-like tokenizer (byte-level BPE, no special tokens), trained here: its
    pre-tokenizer gives a run of spaces tokens of its own, split before the next word."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=bpe)


def test_a_byte_level_tokenizers_space_runs_at_the_cut_keep_the_whole_texts_tokens() -> None:
    pick = random.Random(7)
    texts = [mixed(pick, 3 * LIMIT).replace("  ", " " * pick.randint(2, 40)) for _ in range(40)]
    gpt2_like = byte_level_bpe(texts)
    assert gpt2_like.num_special_tokens_to_add() == 0
    rows = TokenizedDataset.from_texts(texts, [0] * len(texts), gpt2_like, MAX_LENGTH)
    assert rows_of(rows) == [gpt2_like(t, truncation=True, max_length=MAX_LENGTH)["input_ids"]
                             for t in texts]
    pairs = TokenizedDataset.from_texts(texts, [0] * len(texts), gpt2_like, MAX_LENGTH,
                                        pairs=texts[::-1])
    assert rows_of(pairs) == [gpt2_like(t, p, truncation=True, max_length=MAX_LENGTH)["input_ids"]
                              for t, p in zip(texts, texts[::-1], strict=True)]


def test_no_max_length_leaves_every_text_whole(tokenizer) -> None:
    from nlptrain.data.long_texts import without_unread_tails

    long = prose(2_000, 8)
    assert without_unread_tails([long], [long], tokenizer, None) == ([long], [long])
