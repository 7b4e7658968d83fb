"""The memory-mapped token cache: built once (under DDP by the ranks of a machine together, each
tokenizing its share), mapped by every rank, keyed by data + tokenizer + max length; per-rank
files cache each rank's own share."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from conftest import write_toy_tsv
from ddp import run_ranks
from kinds_data import write_multi_label_tsv
from nlptrain.callbacks import PerRankData

from nlptrain import TrainConfig, Trainer
from nlptrain.config import FileSpec, TaskConfig
from nlptrain.data import LabelVocab, build_datasets, load_file, read_examples
from nlptrain.data.split import Manifest, split_task
from nlptrain.data.tokenized import TokenizedDataset, cache_key, cached
from nlptrain.errors import DataError
from nlptrain.kinds import MultiLabel
from nlptrain.models import load_model, load_tokenizer
from nlptrain.task_files import load_task


class Counting:
    """A tokenizer that counts its calls (so a test can tell a cache hit from a build)."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.calls = 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_cache_is_built_once_then_mapped(tmp_path, tiny_model_dir):
    tokenizer = Counting(load_tokenizer(str(tiny_model_dir)))
    texts = ["a short one", "and a somewhat longer text here", "x"]

    def build():
        return TokenizedDataset.from_texts(texts, [0, 1, 0], tokenizer, 8), {"rows": 3}

    first, meta = cached(tmp_path / "entry", build)
    again, meta_again = cached(tmp_path / "entry", build)
    assert tokenizer.calls == 1 and meta == meta_again == {"rows": 3}
    assert isinstance(again.ids, np.memmap) and isinstance(again.offsets, np.memmap)
    for i in range(3):
        assert np.array_equal(first[i]["input_ids"], again[i]["input_ids"])
    assert len(again[1]["input_ids"]) == 8  # truncated to max_length, kept in the cache
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_key_follows_data_tokenizer_and_max_length(tmp_path, tiny_model_dir):
    data = write_toy_tsv(tmp_path / "train.tsv", 30)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    key = cache_key([data], tokenizer, 32, {})
    assert cache_key([data], tokenizer, 32, {}) == key
    tokenizer(["a call leaves truncation and padding state"], truncation=True, max_length=8,
              padding="max_length")
    assert cache_key([data], tokenizer, 32, {}) == key  # the same tokenizer after use: same key
    assert cache_key([data], tokenizer, 64, {}) != key
    assert cache_key([data], tokenizer, 32, {"labels": ["a"]}) != key
    other = load_tokenizer(str(tiny_model_dir))
    other.add_tokens(["nlptrainword"])
    assert cache_key([data], other, 32, {}) != key
    data.write_text(data.read_text() + "one more row\tpos\n")
    assert cache_key([data], tokenizer, 32, {}) != key


def test_key_follows_the_code_that_reads_the_files(tmp_path, tiny_model_dir, monkeypatch):
    """An entry made before a reader check was added (the repeated header row, say) loaded as
    if the checked code had read the file: the check never ran, and a 'label' class trained."""
    import nlptrain.data.tokenized as tokenized

    data = write_toy_tsv(tmp_path / "train.tsv", 30)
    tokenizer = load_tokenizer(str(tiny_model_dir))
    key = cache_key([data], tokenizer, 32, {})
    monkeypatch.setattr(tokenized, "reading_code", lambda: "other readers")
    assert cache_key([data], tokenizer, 32, {}) != key


@pytest.mark.parametrize("damage", ["cut", "gone", "emptied"])  # (emptied: numpy's EOFError)
def test_a_damaged_entry_is_made_again_not_a_traceback(tmp_path, tiny_model_dir, caplog, damage):
    tokenizer = Counting(load_tokenizer(str(tiny_model_dir)))

    def build():
        return TokenizedDataset.from_texts(["a short one", "a longer text here"], [0, 1],
                                           tokenizer, 8), {"rows": 2}

    expected = np.array(cached(tmp_path / "entry", build)[0].ids)  # (a copy: the map is cut too)
    ids = tmp_path / "entry" / ("ids.npy" if damage == "cut" else "labels.npy")
    if damage == "gone":
        ids.unlink()
    else:
        ids.write_bytes(ids.read_bytes()[:100 if damage == "cut" else 0])
    with caplog.at_level("WARNING", logger="nlptrain"):
        again, _ = cached(tmp_path / "entry", build)
    assert "a damaged token cache entry" in caplog.text and tokenizer.calls == 2
    assert np.array_equal(np.asarray(again.ids), expected)


def test_an_entry_is_as_readable_as_the_umask_makes_files(tmp_path, tiny_model_dir):
    """Entries were private (mkdtemp's 0700): a data folder's cache shared by its users failed
    for all but the first with a PermissionError traceback."""
    import os

    tokenizer = load_tokenizer(str(tiny_model_dir))
    old = os.umask(0o022)
    try:
        cached(tmp_path / "entry", lambda: (TokenizedDataset.from_texts(["a b"], [0], tokenizer, 8), {}))
    finally:
        os.umask(old)
    assert (tmp_path / "entry").stat().st_mode & 0o777 == 0o755


@pytest.mark.parametrize("trouble", ["a file where the folder goes", "a full disk"])
def test_a_cache_folder_that_cannot_take_an_entry_is_one_error_naming_it(
        tmp_path, tiny_model_dir, monkeypatch, trouble):
    """A read-only, full or misnamed cache folder was an OSError traceback."""
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cache = tmp_path / "cache"
    if trouble == "a full disk":
        def full(self, folder):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(TokenizedDataset, "save", full)
    else:
        cache.write_text("not a folder")
    with pytest.raises(DataError, match=f"token cache {cache}: entry cannot be written .*; give "
                                        r"another folder \(--cache-dir DIR.* \(--no-cache\)"):
        cached(cache / "entry", lambda: (TokenizedDataset.from_texts(["a b"], [0], tokenizer, 8), {}))
    assert not cache.is_dir() or not list(cache.iterdir())  # no staging folder left


@pytest.mark.parametrize("error_file", ["written", "refused too"])
def test_a_full_disk_under_a_ranks_share_is_one_error_naming_the_cache(
        tmp_path, tiny_model_dir, monkeypatch, error_file):
    """A short write of a rank's part (numpy's, with no errno) was a traceback; so was the error
    file it leaves for the ranks waiting on it, when the full disk refused that too."""
    from nlptrain.data import shared_tokenize

    tokenizer = load_tokenizer(str(tiny_model_dir))

    def short(self, folder):
        raise OSError("218242 requested and 23520 written")
    monkeypatch.setattr(TokenizedDataset, "save", short)
    if error_file == "refused too":
        def full(*args, **kwargs):
            raise OSError(28, "No space left on device")
        monkeypatch.setattr(shared_tokenize, "open", full, raising=False)
    texts, labels = ["a b", "c d"], [0, 1]
    read = lambda: (2, {}, lambda begin, end: TokenizedDataset.from_texts(  # noqa: E731
        texts[begin:end], labels[begin:end], tokenizer, 8))
    share = shared_tokenize.Share(index=1, count=2, tag="t", rank=1)
    with pytest.raises(DataError, match=f"token cache {tmp_path / 'cache'}: entry cannot be written "
                                        r"\(218242 requested and 23520 written; \d+ MB free on its disk\)"):
        shared_tokenize.cached_shared(tmp_path / "cache" / "entry", read, "train", share,
                                      source_bytes=shared_tokenize.SHARE_MIN_BYTES)
    left = list((tmp_path / "cache").glob(".parts-*/error-1"))
    assert [p.read_text().split(":")[0] for p in left] == \
        (["DataError"] if error_file == "written" else [])


def test_the_same_file_named_by_another_path_is_a_cache_hit(tmp_path, tiny_model_dir):
    """--train-file gives the absolute path: the same bytes were tokenized and stored again."""
    write_toy_tsv(tmp_path / "train.tsv", 20)
    tokenizer = Counting(load_tokenizer(str(tiny_model_dir)))
    vocab = LabelVocab.from_config(["neg", "pos"])
    for name in ("train.tsv", str(tmp_path / "train.tsv"), "./train.tsv"):
        load_file(FileSpec(path=name), tmp_path, vocab, tokenizer, 16, tmp_path / "cache", "train")
    assert tokenizer.calls == 1 and len(list((tmp_path / "cache").iterdir())) == 1


def test_key_follows_truncation_side_and_type_ids(tmp_path, tiny_model_dir):
    """Both change the tokens a row keeps: a left-truncating tokenizer must not map the entry a
    right-truncating one wrote."""
    write_toy_tsv(tmp_path / "train.tsv", 30)
    right, left, untyped = (load_tokenizer(str(tiny_model_dir)) for _ in range(3))
    left.truncation_side = "left"
    untyped.model_input_names = ["input_ids", "attention_mask"]  # as DistilBERT's
    spec, vocab = FileSpec(path="train.tsv"), LabelVocab.from_config(["neg", "pos"])
    keys = {cache_key([tmp_path / "train.tsv"], t, 8, {}) for t in (right, left, untyped)}
    assert len(keys) == 3
    first, _ = load_file(spec, tmp_path, vocab, right, 8, tmp_path / "cache", "train")
    again, _ = load_file(spec, tmp_path, vocab, left, 8, tmp_path / "cache", "train")
    examples = read_examples(spec, tmp_path, [])
    wanted = TokenizedDataset.from_texts(examples.texts, vocab.encode(examples), left, 8)
    assert np.array_equal(again.ids, wanted.ids) and not np.array_equal(again.ids, first.ids)


def test_key_follows_where_each_label_file_ends(tmp_path, tiny_model_dir):
    """A line moved from the end of one {label} file to the start of the next leaves the bytes
    back to back the same, but changes the line's label."""
    (tmp_path / "neg.txt").write_text("bad one\nawful one\n")
    (tmp_path / "pos.txt").write_text("good one\n")
    spec, vocab = FileSpec(path="{label}.txt"), LabelVocab.from_config(["neg", "pos"])
    tokenizer = load_tokenizer(str(tiny_model_dir))
    first, _ = load_file(spec, tmp_path, vocab, tokenizer, 8, tmp_path / "cache", "train")
    (tmp_path / "neg.txt").write_text("bad one\n")
    (tmp_path / "pos.txt").write_text("awful one\ngood one\n")
    again, _ = load_file(spec, tmp_path, vocab, tokenizer, 8, tmp_path / "cache", "train")
    assert first.labels.tolist() == [0, 0, 1] and again.labels.tolist() == [0, 1, 1]


def digest(dataset: TokenizedDataset) -> str:
    return hashlib.blake2b(b"".join(np.ascontiguousarray(a).tobytes() for a in
                                    (dataset.ids, dataset.offsets, dataset.labels))).hexdigest()


def cache_job(rank: int, world: int, task_file: str, model_dir: str, timeout: float) -> dict:
    from nlptrain import distributed

    dist = distributed.from_env(timeout)
    task = load_task(task_file)
    out = {}
    for run in ("first", "second"):
        tokenizer = Counting(load_tokenizer(model_dir))
        sets = build_datasets(task, tokenizer, dist)
        out[run] = {"calls": tokenizer.calls, "file": sets.train.ids.filename,
                    "mapped": isinstance(sets.train.ids, np.memmap), "digest": digest(sets.train)}
    dist.close()
    return out


def test_the_ranks_tokenize_their_shares_into_one_entry_and_wait_outside_collectives(
        tmp_path, toy_task):
    """60,000 rows: tokenizing them takes one rank longer than the 2 s collective timeout, so a
    rank that waited inside a collective for rank 0 would fail (gloo's recv timeout)."""
    big = write_toy_tsv(tmp_path / "train.tsv", 60_000, seed=3)
    model = load_task(toy_task).model.name
    results = run_ranks(cache_job, 2, tmp_path, str(toy_task), str(model), 2.0)
    first = [r["first"] for r in results]
    assert all(r["calls"] > 0 for r in first)  # each rank tokenized a share
    assert first[0]["file"] == first[1]["file"] and all(r["mapped"] for r in first)
    assert [r["second"]["calls"] for r in results] == [0, 0]  # a later run skips tokenizing
    # The joined entry is the one a single process makes of the whole file.
    tokenizer, examples = load_tokenizer(str(model)), read_examples(FileSpec(path=str(big)), "", [])
    whole = TokenizedDataset.from_texts(examples.texts, LabelVocab.from_config(["neg", "pos"])
                                        .encode(examples), tokenizer, 32)
    assert {r["digest"] for run in results for r in run.values()} == {digest(whole)}
    entries = [p.name for p in (tmp_path / "cache").iterdir()]
    assert len(entries) == 2 and not [n for n in entries if n.startswith(".")]  # train + test


class Failing(Counting):
    def __call__(self, *args, **kwargs):
        raise RuntimeError("tokenizer broke")


def failing_job(rank: int, world: int, task_file: str, model_dir: str, failing: int,
                share_min_bytes: int) -> str:
    from nlptrain import distributed
    from nlptrain.data import shared_tokenize

    shared_tokenize.SHARE_MIN_BYTES = share_min_bytes
    dist = distributed.from_env(2.0)
    tokenizer = load_tokenizer(model_dir)
    try:
        build_datasets(load_task(task_file), Failing(tokenizer) if rank == failing else tokenizer,
                       dist)
    except Exception as error:
        return f"{type(error).__name__}: {error}"
    finally:
        dist.close()
    return "no error"


@pytest.mark.parametrize("failing, share_min_bytes", [(1, 0), (0, 1 << 20)],
                         ids=["rank 1 fails its share", "rank 0 fails a small file it tokenizes alone"])
def test_a_rank_that_fails_stops_the_others_instead_of_leaving_them_waiting(
        tmp_path, toy_task, failing, share_min_bytes):
    model = load_task(toy_task).model.name
    errors = run_ranks(failing_job, 2, tmp_path, str(toy_task), str(model), failing,
                       share_min_bytes, timeout=60)
    assert errors[failing] == "RuntimeError: tokenizer broke"
    assert errors[1 - failing] == (f"RemoteRankError: rank {failing} failed: while preparing the "
                                   "train set: RuntimeError: tokenizer broke")
    assert not [p for p in (tmp_path / "cache").iterdir() if not p.name.startswith(".parts-")]


def test_per_rank_share_is_cached(tmp_path, tiny_model_dir):
    write_toy_tsv(tmp_path / "train.tsv", 40)
    task = TaskConfig(name="toy", data_dir=str(tmp_path))
    task.data.train = "train.tsv"
    split_task(task, tmp_path / "parts", 1)
    calls = []
    for _ in range(2):
        tokenizer = Counting(load_tokenizer(str(tiny_model_dir)))
        data = PerRankData(tmp_path / "parts", ["neg", "pos"], max_length=32,
                           cache_dir=tmp_path / "cache", tokenizer=tokenizer)
        trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), None,
                          config=TrainConfig(epochs=1, batch_size=8), callbacks=[data])
        data.on_train_start(trainer)
        calls.append(tokenizer.calls)
        dataset = trainer.train_data.dataset
        assert len(dataset) == 40 and len(trainer.train_data) == 5
    assert calls[0] > 0 and calls[1] == 0
    assert isinstance(dataset.ids, np.memmap)
    shutil.rmtree(tmp_path / "cache")
    assert not Path(tmp_path / "cache").exists()


def test_per_rank_key_follows_the_label_separator(tmp_path, tiny_model_dir):
    """The same part file read with another separator holds other targets (here: labels that are
    not the task's), so it must not map the entry of the first."""
    write_multi_label_tsv(tmp_path / "train.tsv", 40, separator="|")
    task = TaskConfig(name="tags", data_dir=str(tmp_path))
    task.data.train, task.data.label_column = "train.tsv", "tags"
    task.data.kind, task.data.label_separator = "multi_label", "|"
    split_task(task, tmp_path / "parts", 1)
    part = Manifest.load(tmp_path / "parts").part_path(tmp_path / "parts", 0)
    labels = ["food", "music", "sport"]
    trainer = SimpleNamespace(tokenizer=load_tokenizer(str(tiny_model_dir)), label_names=labels)

    def load(separator: str) -> TokenizedDataset:
        return PerRankData(tmp_path / "parts", labels, cache_dir=tmp_path / "cache",
                           kind=MultiLabel(separator))._load(part, trainer)

    assert load("|").labels.sum(axis=1).max() >= 2  # some rows have two labels
    with pytest.raises(DataError, match=r"label '\w+(\|\w+)+' \(in '[\w|]+'\) is not one of the "
                                        r"task's labels"):
        load(",")


def test_a_data_folder_marked_read_only_gets_no_cache_even_from_root(tmp_path, monkeypatch):
    """No write bits: the cache goes to the user's cache folder, also for root (who could write:
    a data set in a container is often root's, and marked read-only to stay as it is)."""
    from nlptrain.data.tokenized import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    (tmp_path / "data").mkdir()
    assert default_cache_dir(tmp_path / "data") == tmp_path / "data" / ".nlptrain_cache"
    (tmp_path / "data").chmod(0o555)
    try:
        assert default_cache_dir(tmp_path / "data") == tmp_path / "home-cache" / "nlptrain"
    finally:
        (tmp_path / "data").chmod(0o755)


def test_an_installed_packages_data_gets_its_cache_in_the_users_cache_folder(tmp_path, monkeypatch):
    """The default task's data, installed in site-packages: a cache written there would stay
    behind after pip uninstall."""
    from nlptrain.data.tokenized import default_cache_dir

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    installed = tmp_path / "lib" / "python3.11" / "site-packages" / "nlptrain" / "data"
    installed.mkdir(parents=True)
    assert default_cache_dir(installed) == tmp_path / "home-cache" / "nlptrain"
    monkeypatch.chdir(installed)  # the same folder, named from inside it
    assert default_cache_dir(Path(".")) == tmp_path / "home-cache" / "nlptrain"


def test_the_code_that_decodes_a_file_is_part_of_its_cache_key(tmp_path, monkeypatch):
    """The line decoder (BOM, CRLF, UTF-8) moved to text_files.py, which the key left out: a
    change there loaded entries the old code had read."""
    import shutil

    import nlptrain
    from nlptrain.data import tokenized

    package = Path(nlptrain.__file__).parent
    copy = shutil.copytree(package, tmp_path / "nlptrain", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(tokenized, "__file__", str(copy / "data" / "tokenized.py"))
    read_code = tokenized.reading_code.__wrapped__  # (the cached one is this process's code's)
    before = read_code()
    with open(copy / "data" / "text_files.py", "a") as decoder:
        decoder.write("# a change\n")
    assert read_code() != before
