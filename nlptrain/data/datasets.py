"""Datasets of a task: read its files, map labels to ids, split, tokenize (cached).

`build_datasets` is what the CLI uses. Under DDP, the ranks of a machine tokenize each file once,
together, into the memory-mapped cache (shared_tokenize.py); then every rank maps the same cache
files, so a machine holds one copy of the token ids however many ranks it runs.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nlptrain.config import FileSpec, TaskConfig, file_spec
from nlptrain.data.readers import Examples, iter_rows, read_examples, read_format, source_files
from nlptrain.data.rows import label_text
from nlptrain.data.shared_tokenize import ALONE, Share, cached_shared
from nlptrain.data.text_files import open_checked
from nlptrain.data.tokenized import TokenizedDataset, cache_key, default_cache_dir, say_truncated
from nlptrain.distributed import Backend, SingleProcess
from nlptrain.errors import DataError
from nlptrain.kinds import SingleLabel, TaskKind, from_task
from nlptrain.kinds.base import LabelIds

log = logging.getLogger(__name__)


@dataclass
class LabelVocab:
    """Label values as written in the files, and the names users see, both in id order."""

    values: list[str]
    names: list[str]
    learned_from: str = field(default="", compare=False)  # the train file, where the task names none

    @classmethod
    def from_config(cls, labels: list | dict) -> LabelVocab:
        if isinstance(labels, dict):
            return cls([label_text(k) for k in labels], [label_text(v) for v in labels.values()])
        return cls([label_text(v) for v in labels], [label_text(v) for v in labels])

    @classmethod
    def infer(cls, values: list[str]) -> LabelVocab:
        unique = set(values)
        numeric = all(re.fullmatch(r"-?[0-9]+", v) for v in unique)  # what int() reads, no more
        ordered = sorted(unique, key=int if numeric else str)
        return cls(ordered, ordered)

    @classmethod
    def for_kind(cls, kind: TaskKind, cells: list, configured: list | dict) -> LabelVocab:
        """The task's labels when it names them, else those seen in `cells` (the train rows);
        a regression task has one output, its score."""
        if not kind.has_classes:
            return cls(["score"], ["score"])
        if configured:
            return cls.from_config(configured)
        return cls.infer([value for cell in cells for value in kind.label_values(cell)])

    def ids(self) -> dict[str, int]:
        """Label as written in a file -> id; the names are accepted too, and a boolean label in
        each of its usual spellings (JSON's and TOML's true, Python's True, TRUE): a JSONL file's
        booleans then match a model or task that lists them as "True"."""
        found = LabelIds({value: i for i, value in enumerate(self.values)})
        found.learned_from = self.learned_from  # (what an unknown label is said to be not one of)
        found.update({name: i for i, name in enumerate(self.names) if name not in found})
        for spelt, i in list(found.items()):
            if spelt.lower() in ("true", "false"):
                for alias in (spelt.lower(), spelt.capitalize(), spelt.upper()):
                    found.setdefault(alias, i)
        return found

    def encode(self, examples: Examples, kind: TaskKind | None = None) -> np.ndarray:
        """The targets of `examples` (single-label ids unless another kind is given)."""
        return (kind or SingleLabel()).encode(examples.labels, self.ids(), examples.origin)


@dataclass
class Datasets:
    train: TokenizedDataset | None
    valid: TokenizedDataset | None
    test: TokenizedDataset | None
    vocab: LabelVocab
    sources: dict[str, str] = field(default_factory=dict)
    shard_rows: int | None = None  # the rows of per-rank files (no rank holds them all)

    def rows(self, name: str) -> int | None:
        """The rows of set `name`, also the train set's of per-rank files; None: no such set."""
        data = getattr(self, name)
        return len(data) if data is not None else self.shard_rows if name == "train" else None


def can_stratify(labels: np.ndarray) -> bool:
    """A held-out split can keep the class balance: single-label class ids, each class with two
    rows or more (one row cannot be on both sides)."""
    if labels.ndim != 1 or labels.dtype.kind != "i" or not len(labels):
        return False
    return bool(np.bincount(np.clip(labels, 0, None))[np.unique(labels)].min() >= 2)


def check_class_rows(labels: np.ndarray, vocab: LabelVocab, inferred: bool, where: str) -> None:
    """Warn about single-label classes the train rows barely teach: none at all (a class the task
    names but the file lacks), or, where the labels were read from the file, one or two rows (a
    typo such as 'postive' makes a class of its own; naming [data] labels refuses it instead)."""
    if labels.ndim != 1 or labels.dtype.kind != "i":
        return
    counts = np.bincount(np.clip(labels, 0, None), minlength=len(vocab.names))
    absent = np.flatnonzero(counts == 0)
    if len(absent):  # a file a class (format lines): the empty ones are named
        files = [where.replace("{label}", vocab.values[i]) for i in absent] if "{label}" in where \
            else [where]
        log.warning("%s: no train rows of class(es) %s: the model cannot learn them",
                    ", ".join(files), ", ".join(repr(vocab.names[i]) for i in absent))
    rare = [f"{vocab.values[i]!r} ({counts[i]} row{'s' if counts[i] > 1 else ''})"
            for i in np.flatnonzero((counts > 0) & (counts <= 2))] if inferred else []
    if rare and len(labels) > 20:
        log.warning("%s: label(s) %s of %d rows: typos? Each value is a class of its own; name the "
                    "task's labels ([data] labels = [...]) to refuse others", where,
                    ", ".join(rare), len(labels))


def stratified_split(labels: np.ndarray, size: float, seed: int, where: str = "train",
                     which: str = "valid") -> tuple[np.ndarray, np.ndarray]:
    """(kept, held out) row numbers; stratified by label when every class can be split (single
    labels only: multi-label and regression targets are split at random). A split that leaves
    nothing to train on, or too few rows for a class on each side, is a DataError naming
    `where` (the train file) and `which` set's [data] size key."""
    from sklearn.model_selection import train_test_split  # here: a slow import, rarely needed

    rows, n = np.arange(len(labels)), len(labels)
    held, kept = math.ceil(size * n), math.floor((1 - size) * n)  # as scikit-learn counts them
    fix = f"or give the task a [data] {which} file"
    if kept < 1:
        raise DataError(f"{where}: [data] {which}_size = {size:g} of {n} train row(s) leaves "
                        f"none to train on; lower {which}_size {fix}")
    stratify = labels if can_stratify(labels) else None
    if stratify is not None:
        classes = len(np.unique(labels))
        # scikit-learn would raise a bare ValueError: say what to change instead.
        if stratify is not None and min(held, kept) < classes:
            low, high = math.ceil(100 * classes / n) / 100, math.floor(100 * (n - classes) / n) / 100
            span = f"between {low:g} and {high:g}" if low < high else f"to {low:g}"  # 2 per class
            raise DataError(f"{where}: [data] {which}_size = {size:g} of {n} train rows holds "
                            f"out {held} and keeps {kept}, but a stratified split needs a row of "
                            f"each of the {classes} classes on both sides; set {which}_size "
                            f"{span} {fix}")
    kept_rows, held_rows = train_test_split(rows, test_size=size, random_state=seed,
                                            stratify=stratify)
    return np.sort(kept_rows), np.sort(held_rows)


def _files(spec: FileSpec, data_dir: Path, vocab: LabelVocab | None) -> list[Path]:
    if "{label}" in spec.path:
        return [data_dir / spec.path.replace("{label}", v) for v in (vocab.values if vocab else [])]
    return [data_dir / spec.path]


def load_file(spec: FileSpec, data_dir: Path, vocab: LabelVocab | None, tokenizer: Any,
              max_length: int, cache_dir: Path | None, what: str,
              kind: TaskKind | None = None, configured: list | dict | None = None,
              share: Share = ALONE) -> tuple[TokenizedDataset, LabelVocab]:
    """Read, encode the targets of, and tokenize one file (through the cache when `cache_dir` is
    set, the tokenizing shared by the ranks of `share`). Without `vocab`, the labels come from
    `configured` or from this file's rows."""
    kind = kind or SingleLabel()

    def read() -> tuple[int, dict, Any]:
        values = vocab.values if vocab and kind.has_classes else []  # as written in files
        examples = read_examples(spec, data_dir, values, what,
                                 empty_label_ok=kind.empty_label_ok)
        labels = vocab or LabelVocab.for_kind(kind, examples.labels, configured or [])
        targets = labels.encode(examples, kind)

        def tokenize(begin: int, end: int) -> TokenizedDataset:
            pairs = None if examples.pairs is None else examples.pairs[begin:end]
            part = what if (begin, end) == (0, len(examples)) else f"{what} rows {begin}-{end}"
            return TokenizedDataset.from_texts(examples.texts[begin:end], targets[begin:end],
                                               tokenizer, max_length, pairs=pairs, what=part,
                                               report=False)  # said below, from the whole set
        meta = {"rows": len(examples), "values": labels.values, "names": labels.names}
        return len(examples), meta, tokenize

    files = _files(spec, data_dir, vocab)
    if cache_dir is None:
        rows, meta, tokenize = read()
        dataset = tokenize(0, rows)
        meta["truncated"] = dataset.truncated
    else:
        for path in files:
            open_checked(path, what)
        # The file's bytes are in the key: not the path that names it (train.tsv, or its
        # absolute path as --train-file gives it, tokenized it twice); a label template stays.
        named = {**vars(spec), "path": spec.path if "{label}" in spec.path else ""}
        how = {"spec": named, "labels": vocab and [vocab.values, vocab.names],
               "format": read_format(spec),
               "kind": kind.cache_key()}
        key = cache_key(files, tokenizer, max_length, how)
        size = sum(path.stat().st_size for path in files)
        dataset, meta = cached_shared(Path(cache_dir) / key, read, what, share, size)
    dataset.max_length, dataset.pairs = max_length, spec.text_pair_column != ""
    # Said from the whole set's count (however many ranks tokenized it), a cached one's too.
    dataset.truncated = meta.get("truncated")
    say_truncated(what, dataset.truncated, len(dataset), max_length)
    return dataset, vocab or LabelVocab(meta["values"], meta["names"])


def entry_files(task: TaskConfig, which: str, data_dir: str | Path | None = None) -> list[Path] | None:
    """The files the task's [data] `which` entry reads in `data_dir` (default: the task's), each
    checked to be there (one per label for format 'lines'); None where the task names none."""
    spec = file_spec(task, which)
    if spec is None:
        return None
    values = LabelVocab.from_config(task.data.labels).values if task.data.labels else []
    return source_files(spec, task.data_dir if data_dir is None else data_dir, values, which)


def build_datasets(task: TaskConfig, tokenizer: Any, dist: Backend | None = None,
                   use_cache: bool = True, only: str | None = None) -> Datasets:
    """The task's train/valid/test sets, with held-out splits made from train where asked.
    `only` ('train', 'valid' or 'test'): the one set wanted (`eval --split`). The others' own
    files are not read; when it has a file of its own and the task names its labels (or has
    none: regression), train is not read either."""
    dist = dist or SingleProcess()
    data_dir = Path(task.data_dir or ".")
    specs = {which: file_spec(task, which) for which in ("train", "valid", "test")}
    if specs["train"] is None and not task.data.train_shards:
        raise DataError(f"task '{task.name}': no [data] train file")
    kind = from_task(task)
    vocab = LabelVocab.for_kind(kind, [], task.data.labels) \
        if task.data.labels or not kind.has_classes else None
    # Per-rank files or a stream: no rank loads the whole train file (see streaming.py, split.py).
    per_rank = bool(task.data.train_shards or task.data.streaming)
    wants_one = only in ("valid", "test") and specs[only] is not None
    if per_rank and not (wants_one and vocab is not None):  # (eval of a per-rank run's model
        from nlptrain.data.streaming import per_rank_labels  # reads none: any world size)

        vocab = per_rank_labels(task, vocab, dist.world_size)
        if not task.data.labels and kind.has_classes:  # what split or the stream saw in train
            vocab.learned_from = task.data.train_shards or str(data_dir / specs["train"].path)
    # The cache sits next to the data read: the train file's, or the one set `eval` reads
    # (a --test-file of its own must not fill the default task's data folder).
    alone = wants_one and vocab is not None
    for which in ("valid", "test") if only is None else (only,) if only != "train" else ():
        spec = specs[which]  # there, before train is read (minutes, for a large one)
        if not alone and spec is not None and ("{label}" not in spec.path or vocab is not None):
            # Its header and first row too: a wrong column is said now, not after train is read
            next(iter_rows(spec, data_dir, vocab.values if vocab else [], which,
                           empty_label_ok=kind.empty_label_ok), None)
    anchor = specs[only] if alone else specs["train"]
    anchor_files = _files(anchor, data_dir, vocab) if anchor else []
    cache_dir = None
    if use_cache:
        cache_dir = Path(task.data.cache_dir) if task.data.cache_dir else \
            default_cache_dir(anchor_files[0].parent if anchor_files else data_dir)

    # The ranks of a machine tokenize a missing cache entry together (shared_tokenize.py).
    share = Share.agree(dist) if dist.world_size > 1 and cache_dir is not None else ALONE
    if alone:
        one_set = Datasets(None, None, None, vocab)
        setattr(one_set, only, load_file(specs[only], data_dir, vocab, tokenizer,
                                         task.model.max_length, cache_dir, only, kind,
                                         share=share)[0])
        return one_set
    train, labels = (None, vocab) if per_rank else load_file(
        specs["train"], data_dir, vocab, tokenizer, task.model.max_length, cache_dir, "train",
        kind, share=share)
    if train is not None and kind.has_classes and not labels.names:  # (a multi-label file of
        # empty cells): said of the train file, not as a label of the test file missing
        kind.check_labels(labels.names, str(data_dir / specs["train"].path))
    if train is not None and vocab is None and kind.has_classes:
        labels.learned_from = str(data_dir / specs["train"].path)
    loaded = {"train": train}
    for which in ("valid", "test"):
        if specs[which] is not None and only in (None, which):
            loaded[which], _ = load_file(specs[which], data_dir, labels, tokenizer,
                                         task.model.max_length, cache_dir, which, kind, share=share)
    sets = Datasets(loaded["train"], loaded.get("valid"), loaded.get("test"), labels)
    seed = task.data.split_seed
    if per_rank:  # the train rows are read later, each rank its own: nothing to hold out here
        from nlptrain.data.streaming import StreamingDataset, warn_no_held_out

        if dist.is_main:  # the same on every rank: said once
            warn_no_held_out(task, sets)
        if task.data.train_shards:  # their count and folder, from the manifest (report, results)
            from nlptrain.data.split import Manifest

            manifest = Manifest.of_task(task)[1]
            sets.shard_rows = sum(part["rows"] for part in manifest.parts)
            sets.sources["train"] = f"{task.data.train_shards} ({manifest.world_size} per-rank files)"
        sets.train = StreamingDataset.from_task(task, sets.vocab, tokenizer, dist) \
            if task.data.streaming else None
        return sets
    where = str(data_dir / specs["train"].path)  # the file the held-out rows come from
    if dist.is_main:  # the same on every rank: said once
        check_class_rows(sets.train.label_ids, sets.vocab, not task.data.labels, where)
    if specs["test"] is None and task.data.test_size > 0:  # (a test file not read: `only`)
        how = "stratified" if can_stratify(sets.train.label_ids) else "at random"
        kept, held = stratified_split(sets.train.label_ids, task.data.test_size, seed, where,
                                      "test")
        sets.train, sets.test = sets.train.select(kept), sets.train.select(held)
        sets.sources["test"] = f"{task.data.test_size:.0%} of train ({how}, seed {seed})"
    if specs["valid"] is None and task.data.valid_size > 0:
        how = "stratified" if can_stratify(sets.train.label_ids) else "at random"
        kept, held = stratified_split(sets.train.label_ids, task.data.valid_size, seed, where,
                                      "valid")
        sets.train, sets.valid = sets.train.select(kept), sets.train.select(held)
        sets.sources["valid"] = f"{task.data.valid_size:.0%} of the rest of train ({how}, seed {seed})"
    return sets
