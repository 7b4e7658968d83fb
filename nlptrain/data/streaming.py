"""Streaming: read a training file lazily, one row at a time, for sets too big to index.

The rows come from `readers.iter_rows`, the one parser the in-memory readers use too (same formats,
checks and messages), but they are never kept. `StreamingDataset` shards
those rows by `rank * num_workers + worker_id` (row i belongs to shard i % (world * workers)), so
no row is seen twice in an epoch, tokenizes in small chunks and shuffles through a buffer seeded by
(seed, epoch, shard). Memory is the buffer and one chunk, whatever the file size.

An epoch has no length the trainer can read, so every rank must take the same number of steps:
`prepare_stream` counts the rows once (rank 0, one pass, checking every label) and sets
`[train] steps_per_epoch` to the largest count every rank can fill (one pass over the shortest
rank's share; the few surplus rows of longer shares are left for that epoch, and reported).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from nlptrain.config import FileSpec, TrainConfig
from nlptrain.data.long_texts import without_unread_tails
from nlptrain.data.readers import iter_rows
from nlptrain.data.rows import Row
from nlptrain.data.tokenized import uses_type_ids
from nlptrain.distributed import Backend
from nlptrain.errors import ConfigError, every_local_rank, every_rank
from nlptrain.kinds import SingleLabel, TaskKind

log = logging.getLogger(__name__)


class StreamingDataset(IterableDataset):
    """Rows of one file, tokenized on the fly; each (rank, worker) reads only its own shard.

    Yields the same dicts as `TokenizedDataset` (input_ids, labels, index = the row's number in
    the file), so `Collator` batches them. `len()` is the number of rows in the whole file (all
    ranks), counted once on first use; an epoch on one rank yields about len / world_size rows.
    """

    shards_by_rank = True  # its readers read their own rows: the trainer shards it no more
    epoch_reaches_workers = True  # set_epoch writes shared memory: workers may be kept

    def __init__(self, spec: FileSpec, data_dir: str | Path, label_ids: dict[str, int],
                 tokenizer: Any, max_length: int, rank: int = 0, world_size: int = 1,
                 seed: int = 0, shuffle_buffer: int = 10_000, chunk: int = 512,
                 label_values: Sequence[str] = (), kind: TaskKind | None = None) -> None:
        self.spec, self.data_dir = spec, str(data_dir)
        self.label_ids = dict(label_ids)  # value or name as written in the file -> id
        self.label_values = list(label_values)  # for format 'lines': one file per value
        self.kind = kind or SingleLabel()
        self.tokenizer, self.max_length = tokenizer, max_length
        self.rank, self.world_size = rank, world_size
        self.seed, self.shuffle_buffer, self.chunk = seed, shuffle_buffer, chunk
        self.total_rows: int | None = None
        # Shared memory: DataLoader workers (persistent ones too) see set_epoch from the main
        # process; a plain attribute would stay at the value copied when the worker started.
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @classmethod
    def from_task(cls, task: Any, vocab: Any, tokenizer: Any, dist: Backend) -> StreamingDataset:
        """The task's train file as a stream for this rank (`vocab`: a LabelVocab)."""
        from nlptrain.config import file_spec
        from nlptrain.kinds import from_task

        return cls(file_spec(task, "train"), task.data_dir or ".", vocab.ids(), tokenizer,
                   task.model.max_length, dist.rank, dist.world_size, task.train.seed,
                   task.data.shuffle_buffer, label_values=vocab.values, kind=from_task(task))

    @property
    def pairs(self) -> bool:
        """Whether rows hold a second text (as `TokenizedDataset.pairs`)."""
        return self.spec.text_pair_column != ""

    def set_epoch(self, epoch: int) -> None:
        self._epoch.fill_(epoch)

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def rows(self) -> Iterator[Row]:
        return iter_rows(self.spec, self.data_dir, self.label_values, "train",
                         empty_label_ok=self.kind.empty_label_ok)

    def count_rows(self) -> int:
        """Read the whole file once (constant memory), checking every row and label."""
        count = 0
        for row in self.rows():
            self._label_id(row)
            count += 1
        return count

    def __len__(self) -> int:
        if self.total_rows is None:
            self.total_rows = self.count_rows()
        return self.total_rows

    def _label_id(self, row: Row) -> Any:
        """The row's target (a class id, a multi-hot row or a score), checked like the readers."""
        return self.kind.encode([row.label], self.label_ids, lambda _: (row.path, row.line))[0]

    def shard(self) -> tuple[int, int]:
        """(this reader's shard, number of shards) = (rank * workers + worker id, world * workers)."""
        info = get_worker_info()
        workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        return self.rank * workers + worker, self.world_size * workers

    def __iter__(self) -> Iterator[dict[str, Any]]:
        shard, shards = self.shard()
        if self.shuffle_buffer <= 0:
            yield from self._tokenized(shard, shards)
            return
        rng = random.Random(f"{self.seed}/{self.epoch}/{shard}")  # str seeds are stable
        buffer: list[dict[str, Any]] = []
        for item in self._tokenized(shard, shards):
            if len(buffer) < self.shuffle_buffer:
                buffer.append(item)
                continue
            pick = rng.randrange(len(buffer))  # a full buffer: send a random row out, keep this one
            buffer[pick], item = item, buffer[pick]
            yield item
        rng.shuffle(buffer)
        yield from buffer

    def _tokenized(self, shard: int, shards: int) -> Iterator[dict[str, Any]]:
        rows: list[Row] = []
        meta: list[tuple[int, Any]] = []
        for index, row in enumerate(self.rows()):
            if index % shards != shard:
                continue
            rows.append(row)
            meta.append((index, self._label_id(row)))
            if len(rows) == self.chunk:
                yield from self._encode(rows, meta)
                rows, meta = [], []
        if rows:
            yield from self._encode(rows, meta)

    def _encode(self, rows: list[Row], meta: list[tuple[int, Any]]) -> Iterator[dict[str, Any]]:
        texts, pairs = without_unread_tails(  # (an 18 MB cell took 3 GB whole)
            [row.text for row in rows], None if rows[0].pair is None else [row.pair for row in rows],
            self.tokenizer, self.max_length)
        typed = pairs is not None and uses_type_ids(self.tokenizer)
        encoded = self.tokenizer(texts, pairs, truncation=True,
                                 max_length=self.max_length, return_attention_mask=False,
                                 return_token_type_ids=typed)
        for i, (index, label) in enumerate(meta):
            item = {"input_ids": np.asarray(encoded["input_ids"][i], dtype=np.int32),
                    "labels": label, "index": index}
            if typed:
                item["token_type_ids"] = np.asarray(encoded["token_type_ids"][i], dtype=np.int8)
            yield item


def per_rank_labels(task: Any, vocab: Any, world_size: int) -> Any:
    """The label vocabulary when no rank reads the whole train file: the task's [data] labels,
    else (per-rank files) the labels `split` saw. Checks the per-rank files fit the job."""
    from nlptrain.data import LabelVocab

    if task.data.train_shards and task.data.streaming:
        raise ConfigError(f"task '{task.name}': [data] train_shards and streaming exclude each "
                          "other; choose one")
    if task.data.train_shards:
        from nlptrain.data.split import Manifest

        folder, manifest = Manifest.of_task(task)
        manifest.check_world_size(world_size, folder)  # before any model is loaded
        if vocab is None:  # (a multi-label file split as single-label saw "joy,fear" as one)
            from nlptrain.kinds import from_task

            return LabelVocab.for_kind(from_task(task), list(manifest.labels), [])
        # Checked now, from the labels `split` saw: a rank would find them only once training
        # began, after --overwrite had replaced the earlier run.
        from nlptrain.kinds import from_task

        known = vocab.ids()
        unknown = sorted({value for cell in manifest.labels
                          for value in from_task(task).label_values(cell)} - set(known))
        if unknown:
            raise every_local_rank(ConfigError(
                f"{folder / 'manifest.json'}: the per-rank files hold labels the "
                f"task does not name: {', '.join(unknown[:10])} (the task's: "
                f"{', '.join(vocab.names)}); add them to [data] labels, or split "
                "a file without them"))
        return vocab
    if vocab is None:
        raise ConfigError(f"task '{task.name}': streaming needs [data] labels, since the train "
                          "file is not read ahead; e.g. labels = [\"neg\", \"pos\"]")
    return vocab


def warn_no_held_out(task: Any, sets: Any) -> None:
    for which, size in (("test", task.data.test_size), ("valid", task.data.valid_size)):
        if getattr(sets, which) is None and size > 0:
            log.warning("task %s: no %s set; per-rank or streamed train data is not split, so "
                        "give a [data] %s file", task.name, which, which)


def shard_sizes(rows: int, shards: int) -> list[int]:
    """Rows of each shard when row i goes to shard i % shards."""
    return [rows // shards + (s < rows % shards) for s in range(shards)]


def batches_per_rank(rows: int, world_size: int, workers: int, batch_size: int,
                     drop_last: bool = False) -> list[int]:
    """Batches each rank's DataLoader yields in one pass: each worker batches its own shard."""
    sizes = shard_sizes(rows, world_size * max(workers, 1))
    per_worker = [s // batch_size if drop_last else math.ceil(s / batch_size) for s in sizes]
    step = max(workers, 1)
    return [sum(per_worker[r * step:(r + 1) * step]) for r in range(world_size)]


def prepare_stream(dataset: StreamingDataset, config: TrainConfig, dist: Backend) -> TrainConfig:
    """Count the rows once (rank 0; all ranks learn the count) and return `config` with
    `steps_per_epoch` set to one pass over the shortest rank's share, unless it was set."""
    if dataset.total_rows is None:
        dataset.total_rows = dist.on_main(dataset.count_rows)
    rows = dataset.total_rows
    per_rank = batches_per_rank(rows, dist.world_size, config.num_workers, config.batch_size,
                                config.drop_last)
    if config.steps_per_epoch:  # each epoch reads the stream from its start again
        a_pass = min(per_rank) // config.grad_accum
        if config.steps_per_epoch != a_pass and dist.is_main:
            log.warning("streaming %d rows with steps_per_epoch = %d: one pass is %d steps, and "
                        "each epoch reads the file from its start, so %s; leave steps_per_epoch "
                        "at 0 for one pass an epoch", rows, config.steps_per_epoch, a_pass,
                        "the rows past the epoch's share are never trained" if
                        config.steps_per_epoch < a_pass else "an epoch reads rows twice")
        return config
    steps = min(per_rank) // config.grad_accum
    if steps < 1:
        cures = [cure for cure, needed in (("batch_size", config.batch_size > 1),
                                           ("grad_accum", config.grad_accum > 1)) if needed]
        # Fewer rows than readers: no smaller batch makes a step for every rank.
        row_each = min(batches_per_rank(rows, dist.world_size, config.num_workers, 1, False)) > 0
        cure = f"lower {' or '.join(cures)}" if cures and row_each else "run fewer processes"
        raise every_rank(ConfigError(
            f"{dataset.spec.path}: {rows} rows are too few for {dist.world_size} rank(s) x "
            f"{config.grad_accum} batches of {config.batch_size}; {cure}"))
    taken = steps * config.grad_accum
    if dist.is_main:
        spare = [n - taken for n in per_rank]
        log.info("streaming %d rows: %d rank(s) x %d worker(s), %d steps per epoch; batches left "
                 "unread each epoch per rank: %s", rows, dist.world_size, max(config.num_workers, 1),
                 steps, spare)
    return dataclasses.replace(config, steps_per_epoch=steps)
