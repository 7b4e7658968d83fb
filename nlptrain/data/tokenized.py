"""Token ids in flat arrays, the batch collator, and the memory-mapped token cache.

A `TokenizedDataset` keeps all token ids of a set in one int32 array plus row offsets: ~4 bytes a
token instead of a Python list per row. The same class reads the arrays from a memory-mapped
cache, so ranks on one machine share one copy through the page cache and later runs skip
tokenizing. A split or shard is a view (`select`) that stores only row numbers.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from nlptrain.data.long_texts import without_unread_tails
from nlptrain.durable import new_staging_folder, replace_folder
from nlptrain.errors import DataError

log = logging.getLogger(__name__)

CACHE_VERSION = 3  # 2: targets of any kind, type ids of pairs; 3: a row of more cells than its
# header is refused (an entry of 2 may hold such a row, its label read from a piece of the text)


class TokenizedDataset(Dataset):
    def __init__(self, ids: np.ndarray, offsets: np.ndarray, labels: np.ndarray,
                 rows: np.ndarray | None = None, type_ids: np.ndarray | None = None,
                 max_length: int | None = None, pairs: bool | None = None) -> None:
        self.ids = ids            # int32, every row's token ids back to back
        self.offsets = offsets    # int64, row i is ids[offsets[i]:offsets[i + 1]]
        self.labels = labels      # targets, first dimension the row: int64 class ids (-1 when
                                  # unknown), float32 multi-hot rows, or float32 scores
        self.rows = rows          # this view's rows of the arrays (None: all)
        self.type_ids = type_ids  # int8 beside `ids`: a pair's segment of each token (or None)
        # How the rows were tokenized (None: not known), for the export: `predict` reads as the
        # model was trained.
        self.max_length, self.pairs = max_length, pairs
        self.truncated: int | None = None  # rows cut at max_length as tokenized (None: not known)

    def __len__(self) -> int:
        return len(self.labels) if self.rows is None else len(self.rows)

    def _row(self, i: int) -> int:
        return i if self.rows is None else int(self.rows[i])

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = self._row(i)
        begin, end = self.offsets[row], self.offsets[row + 1]
        item = {"input_ids": self.ids[begin:end], "labels": self.labels[row], "index": i}
        if self.type_ids is not None:
            item["token_type_ids"] = self.type_ids[begin:end]
        return item

    @property
    def lengths(self) -> np.ndarray:
        lengths = np.diff(self.offsets)
        return lengths if self.rows is None else lengths[self.rows]

    @property
    def label_ids(self) -> np.ndarray:
        return self.labels if self.rows is None else self.labels[self.rows]

    def select(self, indices: Sequence[int] | np.ndarray) -> TokenizedDataset:
        """A view of these rows (numbered from 0 again); the token arrays are shared."""
        picked = np.asarray(indices, dtype=np.int64)
        rows = picked if self.rows is None else self.rows[picked]
        return TokenizedDataset(self.ids, self.offsets, self.labels, rows, self.type_ids,
                                self.max_length, self.pairs)

    @classmethod
    def from_texts(cls, texts: Sequence[str], labels: Sequence[Any] | np.ndarray, tokenizer: Any,
                   max_length: int, chunk: int = 4096, pairs: Sequence[str] | None = None,
                   what: str = "data", report: bool = True) -> TokenizedDataset:
        """Tokenize in batches with the fast tokenizer; truncation to `max_length` tokens.
        With `pairs`, each row is encoded as a real pair (`tokenizer(text, text_pair)`): the
        longer side is truncated first, and each token's segment is kept as its type id (for
        models that read type ids). The rows cut are counted (`.truncated`), and said unless
        `report` is false (a share of a set, whose total is said once)."""
        if len(labels) != len(texts) or (pairs is not None and len(pairs) != len(texts)):
            raise DataError(f"{what}: {len(texts)} texts, {len(labels)} labels"
                            f"{'' if pairs is None else f', {len(pairs)} second texts'}: give one "
                            "of each a row")
        for side, column in (("text", texts), ("second text", pairs or ())):
            bad = next((i for i, text in enumerate(column)
                        if not isinstance(text, str) or not text.strip()), None)
            if bad is not None:  # else the tokenizer's TypeError, with no row to look at
                raise DataError(f"{what}: the {side} at row index {bad} is "
                                f"{column[bad]!r}, not a text; drop the row or give it one")
        pieces, type_pieces, lengths, truncated = [], [], [], 0
        typed = pairs is not None and uses_type_ids(tokenizer)
        last_report = time.perf_counter()

        for begin in range(0, len(texts), chunk):
            if time.perf_counter() - last_report >= 10:  # a large set: show it is moving
                log.info("%s: tokenized %d of %d rows", what, begin, len(texts))
                last_report = time.perf_counter()
            first, second = without_unread_tails(  # (an 18 MB cell took 3 GB whole)
                texts[begin:begin + chunk], None if pairs is None else pairs[begin:begin + chunk],
                tokenizer, max_length)
            encoded = tokenizer(first, second, truncation=True,
                                max_length=max_length, return_attention_mask=False,
                                return_token_type_ids=typed)
            rows = encoded["input_ids"]
            truncated += sum(bool(e.overflowing) for e in encoded.encodings or ())
            lengths += [len(row) for row in rows]
            pieces.append(np.fromiter((t for row in rows for t in row), dtype=np.int32))
            if typed:
                type_pieces.append(np.fromiter((t for row in encoded["token_type_ids"] for t in row),
                                               dtype=np.int8))
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        ids = np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)
        type_ids = None
        if typed:
            type_ids = np.concatenate(type_pieces) if type_pieces else np.zeros(0, dtype=np.int8)
        if report:
            say_truncated(what, truncated, len(lengths), max_length)
        dataset = cls(ids, offsets, as_targets(labels), type_ids=type_ids, max_length=max_length,
                      pairs=pairs is not None)
        dataset.truncated = truncated
        return dataset

    def save(self, folder: Path) -> None:
        for name in ("ids", "offsets", "labels", "type_ids"):
            if getattr(self, name) is not None:
                np.save(folder / f"{name}.npy", getattr(self, name))

    @classmethod
    def load(cls, folder: Path) -> TokenizedDataset:
        arrays = {name: np.load(folder / f"{name}.npy", mmap_mode="r")
                  for name in ("ids", "offsets", "labels", "type_ids")
                  if (folder / f"{name}.npy").is_file()}
        loaded = cls(**arrays)
        if int(loaded.offsets[-1]) != len(loaded.ids) or len(loaded.labels) != len(loaded.offsets) - 1:
            raise ValueError(f"{folder}: its arrays do not fit together")
        return loaded


def say_truncated(what: str, truncated: int | None, rows: int, max_length: int) -> None:
    if truncated:
        log.info("%s: %d of %d rows were longer than max_length (%d tokens) and were truncated",
                 what, truncated, rows, max_length)


def loss_targets(labels: np.ndarray) -> np.ndarray:
    """The losses' types whatever a user's rows hold (int8 category codes, float64 scores):
    float32 scores and multi-hot rows, int64 class ids. Every rank's share of a gathered set
    has these: a gather of blocks of two types is a collective of two sizes (a gloo abort)."""
    return labels.astype(np.float32 if labels.dtype.kind == "f" else np.int64, copy=False)


def as_targets(labels: Sequence[Any] | np.ndarray) -> np.ndarray:
    """An array as it is; a list stored as the kinds store theirs: scores and multi-hot rows as
    float32 (3.8 must not become 3), class ids as int64."""
    try:
        found = np.asarray(labels)
        names = not_ids(found)
        if names:
            raise DataError(names)
        if found.dtype.kind == "O":  # numbers (or lists of them) in an object array, as pandas'
            found = np.asarray(found.tolist())  # .values gives them: floats stay floats
    except ValueError:  # lists of unequal length: label ids a row, not one 0/1 a label
        raise DataError("multi-label rows of unequal length: give each row a list of 0/1, one "
                        "a label (multi-hot), not the ids of its labels") from None
    if isinstance(labels, np.ndarray) and labels.dtype.kind != "O":
        return labels
    return found.astype(np.float32 if found.dtype.kind == "f" and found.size else np.int64)


def not_ids(targets: np.ndarray) -> str:
    """What is wrong with targets that hold names ('pos') or a gap (None) among numbers, which
    no loss takes ("": none)."""
    if targets.dtype.kind not in "USO":
        return ""
    bad = next((i for i, v in enumerate(targets.reshape(len(targets), -1))
                if any(x is None or isinstance(x, str) for x in v)), None)
    if bad is None:  # (numbers in an object array)
        return ""
    value = targets[bad]  # (a numpy value, or None)
    value = value.tolist() if hasattr(value, "tolist") else value
    return (f"the label at row index {bad} is {value!r}: give class ids (0 to "
            "n-1, in the order of the model's label names), a list of 0/1 a row "
            "(multi-label), or a score (regression); e.g. [names.index(label) for "
            "label in labels]")


def uses_type_ids(tokenizer: Any) -> bool:
    """Does the model read `token_type_ids` (BERT: yes; DistilBERT, RoBERTa: no)?"""
    return "token_type_ids" in getattr(tokenizer, "model_input_names", ())


class Collator:
    """Pads a list of rows into a batch: to `pad_to` tokens, or (dynamic) to the longest row
    rounded up to a multiple of `multiple`, never past `limit` (max_length) for that rounding.
    Targets keep their type: class ids as int64, multi-hot rows and scores as float32."""

    def __init__(self, pad_id: int, pad_to: int | None = None, multiple: int = 1,
                 limit: int | None = None) -> None:
        self.pad_id = pad_id
        self.pad_to = pad_to
        self.multiple, self.limit = max(multiple, 1), limit

    def width(self, longest: np.ndarray | int) -> np.ndarray | int:
        """A batch's padded length, given its longest row's (an array: each row's own batch)."""
        if self.pad_to:
            return np.maximum(longest, self.pad_to)
        rounded = -(-longest // self.multiple) * self.multiple
        return np.maximum(longest, np.minimum(rounded, self.limit)) if self.limit else rounded

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        missing = [key for key in ("input_ids", "labels") if key not in rows[0]]
        if missing:  # (else a KeyError inside a DataLoader)
            raise DataError(f"a row holds no {', '.join(map(repr, missing))} (its keys: "
                            f"{', '.join(map(repr, rows[0]))}): the Collator pads rows of "
                            "input_ids and labels (a datasets.Dataset's 'label' column: "
                            "rename_column('label', 'labels'))")
        width = int(self.width(max(len(r["input_ids"]) for r in rows)))
        input_ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        pairs = "token_type_ids" in rows[0]
        type_ids = np.zeros((len(rows), width), dtype=np.int64) if pairs else None
        for i, row in enumerate(rows):
            n = len(row["input_ids"])
            input_ids[i, :n] = row["input_ids"]
            mask[i, :n] = 1
            if type_ids is not None:
                type_ids[i, :n] = row["token_type_ids"]
        labels = np.stack([np.asarray(r["labels"]) for r in rows])
        if labels.dtype.kind in "USO":  # names from a dataset of the user's: numpy's int() error
            given = np.empty(len(rows), dtype=object)  # as given: stacked, 0 beside "pos" is "0"
            for i, row in enumerate(rows):
                given[i] = row["labels"]
            wrong = not_ids(given if labels.ndim == 1 else labels)  # (rows of names: all names)
            if wrong:
                raise DataError(f"in a batch of your dataset's rows, {wrong}")
        batch = {
            "input_ids": torch.from_numpy(input_ids),
            "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(loss_targets(labels)),
        }
        if "index" in rows[0]:  # the row's place, which evaluation gathers by; training needs none
            batch["index"] = torch.tensor([r["index"] for r in rows], dtype=torch.long)
        if type_ids is not None:
            batch["token_type_ids"] = torch.from_numpy(type_ids)
        return batch


def file_digest(paths: Sequence[Path]) -> str:
    """One file: the digest of its bytes. Several: the digest of their digests, so where one file
    ends counts (a line moved from the end of `neg.txt` to the start of `pos.txt` is new data)."""
    digests = []
    for path in paths:
        digest = hashlib.blake2b(digest_size=16)
        with open(path, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        digests.append(digest.hexdigest())
    if len(digests) == 1:  # as before: the cache entries and manifests of one file stay valid
        return digests[0]
    return hashlib.blake2b(" ".join(digests).encode(), digest_size=16, person=b"files").hexdigest()


def tokenizer_digest(tokenizer: Any) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        state = {"vocab": repr(tokenizer.get_vocab())}
    else:
        state = json.loads(backend.to_str())
        # A call leaves its truncation/padding settings in the backend: without dropping them, the
        # key of the same tokenizer would change once it has been used (a rank would miss rank 0's
        # entry).
        state.pop("truncation", None)
        state.pop("padding", None)
    # Set on the Python side, not in the backend, yet they change the tokens a row keeps.
    state["nlptrain"] = {"truncation_side": getattr(tokenizer, "truncation_side", "right"),
                         "type_ids": uses_type_ids(tokenizer)}
    return hashlib.blake2b(json.dumps(state, sort_keys=True).encode(), digest_size=8).hexdigest()


def cache_key(paths: Sequence[Path], tokenizer: Any, max_length: int, extra: dict) -> str:
    """Data bytes + tokenizer + max length + how rows were read + the code that read them: any
    change is a new entry."""
    parts = [str(CACHE_VERSION), file_digest(paths), tokenizer_digest(tokenizer), str(max_length),
             json.dumps(extra, sort_keys=True), reading_code()]
    return hashlib.blake2b("|".join(parts).encode(), digest_size=12).hexdigest()


@functools.cache
def reading_code() -> str:
    """A digest of the code that makes an entry of a file (its decoding, the readers, the row checks, Parquet,
    the label vocabulary, the kinds' targets, tokenizing): an entry that other code made (before
    a check was added to the readers, say) is made again, not loaded as if this code read it."""
    here = Path(__file__).parent
    digest = hashlib.blake2b(digest_size=8)
    kinds = sorted((here.parent / "kinds").glob("*.py"))
    for source in ("text_files.py", "readers.py", "rows.py", "parquet.py", "datasets.py",
                   "tokenized.py", "long_texts.py", *kinds):
        digest.update((here / source).read_bytes())
    return digest.hexdigest()


CACHE_FOLDER = ".nlptrain_cache"  # beside the data, where that folder is writable


def default_cache_dir(data_folder: Path) -> Path:
    """Next to the data when that folder is writable, else the user's cache folder. A folder
    with no write permission bits counts as not writable for root too (who may write anyway):
    a data set marked read-only is left as it is, and so is an installed package's (the default
    task's data in site-packages: a cache there would outlive an uninstall)."""
    installed = any(part in ("site-packages", "dist-packages")
                    for part in Path(data_folder).resolve().parts)  # "." inside one too
    if os.access(data_folder, os.W_OK) and _has_write_bits(data_folder) and not installed:
        return data_folder / CACHE_FOLDER
    home = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(home) / "nlptrain"


def _has_write_bits(folder: Path) -> bool:
    try:
        return bool(folder.stat().st_mode & 0o222)
    except OSError:
        return False


def cached(folder: Path, build: Any, what: str = "data") -> tuple[TokenizedDataset, dict]:
    """Load the entry in `folder`, or build it (returns dataset, meta) and write it atomically."""
    start = time.perf_counter()
    if entry_exists(folder):
        try:
            dataset = TokenizedDataset.load(folder)
            meta = json.loads((folder / "meta.json").read_text())
        except PermissionError as err:
            raise cache_error(folder, "cannot be read", err) from None
        except (OSError, ValueError, TypeError, EOFError) as err:  # a file cut short, or gone
            log.warning("%s: a damaged token cache entry (%s); it is made again", folder,
                        str(err).splitlines()[0][:120])
            shutil.rmtree(folder, ignore_errors=True)
        else:
            log.info("%s: %d rows from the token cache in %.2f s", what, len(dataset),
                     time.perf_counter() - start)
            return dataset, meta
    dataset, meta = build()
    write_entry(folder, dataset, meta)
    log.info("%s: %d rows read and tokenized in %.2f s, cached in %s", what, len(dataset),
             time.perf_counter() - start, folder)
    return TokenizedDataset.load(folder), meta


def entry_exists(folder: Path) -> bool:
    """Whether the entry is there; one another user keeps private is an error that says so."""
    try:
        return (folder / "meta.json").is_file()
    except PermissionError as err:
        raise cache_error(folder, "cannot be read", err) from None


def cache_error(folder: Path, what: str, err: OSError) -> DataError:
    try:
        free = f"; {shutil.disk_usage(folder.parent).free / 2**20:.0f} MB free on its disk"
    except OSError:
        free = ""
    return DataError(f"token cache {folder.parent}: {folder.name} {what} ({err.strerror or err}{free}); "
                     "give another folder (--cache-dir DIR, or [data] cache_dir) or tokenize in "
                     "memory (--no-cache)")


def write_entry(folder: Path, dataset: TokenizedDataset, meta: dict) -> None:
    """Write a cache entry: the whole folder appears at once (a crash leaves only .tmp-*), and
    of two concurrent writers the first wins. A folder that cannot take it (read-only, full) is
    one error naming it."""
    staging = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staging = new_staging_folder(folder.parent, ".tmp-")
        dataset.save(staging)
        (staging / "meta.json").write_text(json.dumps(meta))
        replace_folder(staging, folder, replace_existing=False)
    except OSError as err:
        if not entry_exists(folder):
            raise cache_error(folder, "cannot be written", err) from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
