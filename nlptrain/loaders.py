"""The training DataLoader the trainer makes for a Dataset (a user's own loader is used as is).

Rows per batch (`batch_size`, length-grouped by `ShardedSampler`) or a token budget per batch
(`max_tokens`, `TokenBudgetSampler`); either way one shuffled pass per epoch, sharded by rank,
resumable at a global sample count. `epoch_batches` takes each epoch's batches from a loader.
"""

from __future__ import annotations

import itertools
import logging
import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, default_collate, get_worker_info

from nlptrain.config import TrainConfig
from nlptrain.distributed import Backend
from nlptrain.errors import ConfigError, DataError, every_rank
from nlptrain.loader_workers import PassesEndingStuckWorkers, stuck_workers_ended, worker_timeout
from nlptrain.progress import Progress
from nlptrain.random_state import rng_state, set_rng_state
from nlptrain.samplers import ShardedSampler, TokenBudgetSampler, repeat_forever
from nlptrain.signals import leave_stops_to_the_main_process

log = logging.getLogger(__name__)


def train_loader(data: Dataset, config: TrainConfig, world_size: int, rank: int, collate: Any,
                 device: torch.device) -> DataLoader:
    lengths = getattr(data, "lengths", None)
    # Workers kept across epochs hold the dataset as they got it: a user's IterableDataset would
    # never see set_epoch there (nlptrain's stream keeps its epoch in shared memory).
    epoch_reaches = not isinstance(data, IterableDataset) or getattr(data, "epoch_reaches_workers", False)
    common: dict[str, Any] = dict(
        collate_fn=collate, num_workers=config.num_workers,
        pin_memory=device.type == "cuda", persistent_workers=config.num_workers > 0 and epoch_reaches,
        worker_init_fn=leave_stops_to_the_main_process,
        timeout=worker_timeout(config.num_workers, config.timeout),
        # Its own generator: creating the iterator then draws no number from the global RNG, so
        # dropout after a resume is exactly that of an uninterrupted run.
        generator=torch.Generator().manual_seed(config.seed))
    if config.max_tokens:
        if isinstance(data, IterableDataset) or lengths is None:
            raise ConfigError("[train] max_tokens needs a dataset that knows its rows' lengths "
                              "(a TokenizedDataset; not a stream)")
        padded_width = getattr(collate, "width", None)  # a Collator's: max_length, the multiple
        if callable(padded_width):
            lengths = padded_width(np.asarray(lengths))
        longest = int(np.max(lengths, initial=0))
        if longest > config.max_tokens:  # a batch of that row alone would exceed the budget
            multiple = "" if getattr(collate, "pad_to", None) else \
                " (or pad_to_multiple_of, which rounds each row's width up)"  # (else: no effect)
            raise ConfigError(f"[train] max_tokens = {config.max_tokens} is less than the longest "
                              f"training row ({longest} tokens, as padded): set max_tokens to at "
                              f"least {longest}, or lower [model] max_length{multiple}")
        batches = TokenBudgetSampler(lengths, config.max_tokens, world_size, rank, config.seed)
        return DataLoader(data, batch_sampler=batches, **common)
    sampler = None
    if isinstance(data, IterableDataset):
        data = _shard_by_rank(data, world_size, rank, config.num_workers)
    else:
        sampler = ShardedSampler(data, world_size, rank, shuffle=True, seed=config.seed,
                                 lengths=lengths if config.group_by_length else None,
                                 group_size=64 * config.batch_size,
                                 block_size=8 * config.batch_size)
    return DataLoader(data, batch_size=config.batch_size, sampler=sampler,
                      drop_last=config.drop_last, **common)


class RankShard(IterableDataset):
    """A user's IterableDataset, sharded by rank as a DistributedSampler shards a Dataset: rank
    r of W keeps items r, r + W, r + 2W, ... of what its `__iter__` yields (in each DataLoader
    worker, of that worker's share: workers shard in the dataset, as torch's docs ask). Where
    the dataset says its length, the rows that do not divide are made up as DistributedSampler
    does, with its first items again: every rank then takes as many, and none is left out (the
    ranks agree on the shortest share's batches, which dropped the longer shares' last rows)."""

    def __init__(self, data: IterableDataset, world_size: int, rank: int) -> None:
        self.data, self.world_size, self.rank = data, world_size, rank

    def __iter__(self) -> Iterator[Any]:
        mine = itertools.islice(iter(self.data), self.rank, None, self.world_size)
        return self._made_up_to(len(self), mine) if self._padded() else mine

    def _padded(self) -> bool:
        # Several DataLoader workers each shard their own share, which the length does not count.
        worker = get_worker_info()
        return hasattr(self.data, "__len__") and (worker is None or worker.num_workers == 1)

    def _made_up_to(self, share: int, mine: Iterator[Any]) -> Iterator[Any]:
        taken = 0
        for item in mine:
            yield item
            taken += 1
        rows = len(self.data)
        if taken == share or taken * self.world_size + self.rank < rows:
            return  # whole, or the dataset yielded fewer rows than it says (said later)
        # Position p of the padded order, past the dataset's rows, is row p mod rows again.
        wanted = [(k * self.world_size + self.rank) % rows for k in range(taken, share)]
        needed = set(wanted)
        found = {i: item for i, item in enumerate(itertools.islice(iter(self.data), max(wanted) + 1))
                 if i in needed}
        yield from (found[i] for i in wanted if i in found)

    def __len__(self) -> int:  # this rank's share, where the dataset knows its length (else 0)
        if not hasattr(self.data, "__len__"):
            return 0
        if self._padded():
            return math.ceil(len(self.data) / self.world_size)
        return max(0, len(self.data) - self.rank + self.world_size - 1) // self.world_size

    def set_epoch(self, epoch: int) -> None:  # a stream that reshuffles by epoch
        if hasattr(self.data, "set_epoch"):
            self.data.set_epoch(epoch)


def _has_len(data: Any) -> bool:
    """Whether a user's dataset says its length (a RankShard has `__len__` whatever it wraps)."""
    return hasattr(data.data if isinstance(data, RankShard) else data, "__len__")


def _shard_by_rank(data: IterableDataset, world_size: int, rank: int, workers: int) -> IterableDataset:
    """`data` as this rank's share: every rank running the same `__iter__` trained each row once
    per rank. A dataset that deals its rows itself says so (`shards_by_rank = True`, as
    nlptrain's streams and per-rank readers do) and is left as it is."""
    if workers > 1 and rank == 0 and not getattr(data, "shards_by_rank", False):
        log.info("%d DataLoader workers each run %s.__iter__: it must shard by "
                 "torch.utils.data.get_worker_info() (as torch's docs ask), else each row is read "
                 "%d times", workers, type(data).__name__, workers)
    if world_size == 1 or getattr(data, "shards_by_rank", False):
        return data
    if rank == 0:
        log.info("%s: an IterableDataset, sharded by rank: each of the %d ranks keeps every "
                 "%d-th item of its iterator (set shards_by_rank = True on a dataset that yields "
                 "only its rank's rows itself)", type(data).__name__, world_size, world_size)
    return RankShard(data, world_size, rank)


def check_own_loader(data: Any, config: TrainConfig, world_size: int, say: bool) -> bool:
    """A user's DataLoader or iterable of batches (e.g. PerRankData's), to be used as is; refused
    under max_tokens, which it would silently ignore: its batches are already made. `say`: tell
    where its sampler does not shard by rank, so that every rank reads every row (True: said)."""
    if config.max_tokens:
        raise ConfigError(f"[train] max_tokens = {config.max_tokens} cannot batch this training "
                          f"data: it is already batched ({type(data).__name__}, e.g. per-rank "
                          "files); give a Dataset, or leave max_tokens at 0")
    if isinstance(data, DataLoader) and data.collate_fn is default_collate and \
            getattr(data.dataset, "lengths", None) is not None:  # nlptrain's rows: ragged
        raise DataError("a DataLoader of your own over tokenized rows needs collate_fn="
                        "trainer.collate (nlptrain.data.Collator): torch's default collate "
                        "cannot stack rows of different lengths")
    said = say and world_size > 1 and isinstance(data, DataLoader) and not isinstance(
        data.dataset, IterableDataset) and isinstance(_sampler_of(data), _UNSHARDED)
    if said:
        log.info("train_data is a DataLoader of your own, used as is: its %s does not shard by "
                 "rank, so each of the %d ranks reads all %d of its rows (right for per-rank data; "
                 "else give the Dataset itself, which nlptrain shards, or a DistributedSampler)",
                 type(_sampler_of(data)).__name__, world_size, len(data.dataset))
    return said


_UNSHARDED = (torch.utils.data.SequentialSampler, torch.utils.data.RandomSampler,
              torch.utils.data.WeightedRandomSampler)


def _sampler_of(loader: DataLoader) -> Any:
    """The sampler of torch's own batching; a batch sampler of the user's may shard itself."""
    batches = loader.batch_sampler
    return batches.sampler if type(batches) is torch.utils.data.BatchSampler else batches


def epoch_batches(loader: Any, config: TrainConfig, progress: Progress, dist: Backend,
                  resumed: int, epoch_random: dict[str, Any] | None = None
                  ) -> Iterator[dict[str, torch.Tensor]]:
    """The epoch's batches from `loader`: set_epoch on its samplers, the resume offset (`resumed`
    samples of the epoch already trained), and as many batches on every rank as the shortest
    shard has (uneven shards would hang DDP), recorded in `progress`. `epoch_random`: the random
    state the epoch's batches were first drawn in, where a user's loader resumes by reading."""
    skip = 0
    batches = getattr(loader, "batch_sampler", None)
    candidates = (getattr(loader, "sampler", None), batches, getattr(batches, "sampler", None),
                  getattr(loader, "dataset", None))  # a stream shuffles by epoch too
    for sampler in {id(c): c for c in candidates if c is not None}.values():
        if getattr(sampler, "resumes_by_samples", False):  # ours: ShardedSampler, TokenBudget
            sampler.set_epoch(progress.epoch, start=resumed)  # resume without reading batches
            resumed = 0
        elif hasattr(sampler, "set_epoch"):
            sampler.set_epoch(progress.epoch)
    if resumed:  # a stream, a user's loader or sampler: skip by reading (slow, but exact)
        skip = progress.batch_in_epoch
        (log.warning if dist.is_main else log.debug)(
            "resuming mid-epoch by reading past the epoch's first %d batches (a stream or a "
            "loader of your own cannot start at a row)", skip)
    if _known_length(loader, config):
        local = len(loader) - skip
        if config.steps_per_epoch:  # counted from the epoch's start, also on resume
            local = min(local, _left_of_steps(config, progress, dist))
    elif config.steps_per_epoch:  # a stream: the epoch is the agreed steps, less those done
        local = _left_of_steps(config, progress, dist)
        # (each pass of a stream too short for the agreed steps starts again)
        loader = repeat_forever(PassesEndingStuckWorkers(loader))
    elif config.num_workers > 1 and _has_len(getattr(loader, "dataset", None)):
        raise ConfigError(f"{config.num_workers} DataLoader workers each batch their own share of "
                          "an IterableDataset, so its __len__ does not count the epoch's batches: "
                          "set [train] steps_per_epoch")
    else:
        raise ConfigError("the training data has no length: set [train] steps_per_epoch")
    # Uneven shards: every rank takes as many batches as the shortest, else DDP hangs.
    agreed = dist.agree_min(local)
    if agreed == 0 and progress.batch_in_epoch == 0:  # else the run would "finish" untrained
        raise every_rank(ConfigError(_no_batches(loader, config, dist)))
    if agreed < local:
        log.warning("rank %d: dropping %d of its %d batches this epoch so that every rank "
                    "takes %d (the shortest shard's count)", dist.rank, local - agreed,
                    local, agreed)
    progress.batches_per_epoch = progress.batch_in_epoch + agreed
    progress.steps_per_epoch = math.ceil(progress.batches_per_epoch / config.grad_accum)
    if skip and epoch_random is not None:
        return _first_checked(_read_past(loader, skip, agreed, epoch_random))
    batches = itertools.islice(stuck_workers_ended(iter(loader)), skip, skip + agreed)
    dataset = getattr(loader, "dataset", None)
    return _first_checked(_as_long_as_said(batches, agreed, dataset)
                          if isinstance(dataset, IterableDataset) else batches)


def _left_of_steps(config: TrainConfig, progress: Progress, dist: Backend) -> int:
    """The epoch's micro-batches left under steps_per_epoch; none where a resume lowered it below
    those done (the epoch ends there: islice took the negative count with a traceback)."""
    left = config.steps_per_epoch * config.grad_accum - progress.batch_in_epoch
    if left < 0 and dist.is_main:
        log.info("steps_per_epoch %d: epoch %d has done %d batches already, and ends here",
                 config.steps_per_epoch, progress.epoch + 1, progress.batch_in_epoch)
    return max(left, 0)


def planned_batch_rows(loader: DataLoader, world_size: int) -> np.ndarray | None:
    """For a loader `train_loader` made, after `epoch_batches` set its epoch: each rank's rows in
    its i-th batch, for each batch i the epoch has left (`[batch, rank]`: what weighs a
    micro-batch in its step; `StepWindow`). Both samplers plan the epoch alike on every rank: a
    token budget's plan holds each rank's batches; a `ShardedSampler` gives every rank as many
    rows, in batches of `batch_size` and a short last one. None for a stream (no plan)."""
    batches = loader.batch_sampler
    if isinstance(batches, TokenBudgetSampler):
        sizes = np.array([len(batch) for batch in batches.plan()], dtype=np.int64)
        return sizes.reshape(-1, world_size)  # batch i of rank r: plan[i * W + r]
    if isinstance(loader.sampler, ShardedSampler):
        rows, size = len(loader.sampler), batches.batch_size
        sizes = [size] * (rows // size) + ([rows % size] if rows % size and not batches.drop_last else [])
        return np.repeat(np.array(sizes, dtype=np.int64)[:, None], world_size, axis=1)
    return None


def _first_checked(batches: Iterator) -> Iterator:
    """The batches, the first checked to hold what the loop reads (a collate or dataset of a
    user's without them failed as a bare KeyError inside the step)."""
    for at, batch in enumerate(batches):
        if at == 0:
            check_batch(batch, ("input_ids", "attention_mask", "labels"), "a training batch")
        yield batch


def check_batch(batch: Any, keys: tuple[str, ...], what: str) -> None:
    # Any mapping: transformers' collators give a BatchEncoding (a UserDict, not a dict).
    missing = [key for key in keys if not isinstance(batch, Mapping) or key not in batch]
    if missing:
        held = ", ".join(map(repr, batch)) if isinstance(batch, Mapping) else type(batch).__name__
        raise DataError(f"{what} holds no {', '.join(map(repr, missing))} (it holds {held}): a "
                        "batch is a dict of input_ids, attention_mask, labels and index (the row "
                        "numbers, which evaluation gathers by); a collate of your own must keep "
                        "them (nlptrain.data.Collator does)")


def _known_length(loader: Any, config: TrainConfig) -> bool:
    """Whether `len(loader)` is this rank's batches: a list of batches, a DataLoader over a
    Dataset, or over an IterableDataset of a user's with `__len__` (sharded by rank here) read by
    at most one DataLoader worker, where no steps_per_epoch is set (several workers each batch
    their own share: more batches than its length says). Not over nlptrain's stream, whose
    length is the whole file's."""
    if not hasattr(loader, "__len__"):
        return False
    dataset = getattr(loader, "dataset", None)
    if not isinstance(dataset, IterableDataset):
        return True
    if getattr(dataset, "shards_by_rank", False) or config.num_workers > 1 or config.steps_per_epoch:
        return False
    try:
        len(dataset)
    except TypeError:
        return False
    return True


def _as_long_as_said(batches: Iterator, count: int, data: Any) -> Iterator:
    """`count` batches of `batches`; one that ends before is an error naming its dataset (its
    `__len__` said more), not a rank gone quiet while the others wait in a collective."""
    given = 0
    for batch in batches:
        given += 1
        yield batch
    if given < count:
        raise DataError(f"{type(data).__name__} yielded {given} batches on this rank, but its "
                        f"__len__ says {count} or more: make __len__ count the rows it yields")


def _read_past(loader: Any, skip: int, agreed: int, epoch_random: dict[str, Any]) -> Iterator:
    """The batches after the first `skip`, read in the random state the epoch began in: an
    unseeded DataLoader draws its base seed, and a RandomSampler without a generator its order,
    from the global RNG, as the run first did; then the checkpoint's state again (dropout)."""
    now = rng_state()
    set_rng_state(epoch_random)
    batches = stuck_workers_ended(iter(loader))
    for _ in itertools.islice(batches, skip):
        pass
    set_rng_state(now)
    return itertools.islice(batches, agreed)


def _no_batches(loader: Any, config: TrainConfig, dist: Backend) -> str:
    """Why no rank has a batch (every rank calls this, and says the same: one more agreement)."""
    many = dist.world_size > 1
    text = "the training data makes no batch" + (" on some rank" if many else "")
    sampler = getattr(loader, "sampler", None)
    rows = dist.agree_min(len(sampler) if hasattr(sampler, "__len__") else -1)  # the fewest
    if config.drop_last and not config.max_tokens and rows >= 0:
        has = f"a rank gets {rows} row(s)" if many else f"it has {rows} row(s)"
        fewer = ", run fewer processes" if many else ""
        return (f"{text}: drop_last drops every batch, as {has}, fewer than batch_size "
                f"{config.batch_size}; lower batch_size{fewer} or leave drop_last off")
    return f"{text}: is the training set empty?"


def typical_batch(data: Any, collate: Any, rows: int, max_tokens: int = 0
                  ) -> dict[str, torch.Tensor] | None:
    """A batch of `rows` rows of the length most batches have (the middle of the rows sorted by
    length, where the dataset knows them; else its first rows), for timing a step before the
    training starts; under a token budget (`max_tokens`), as many rows of that length as the
    budget holds. None for data that cannot be indexed without reading it (an iterable)."""
    if isinstance(data, IterableDataset) or not hasattr(data, "__getitem__"):
        return None
    try:
        size = len(data)
    except TypeError:
        return None
    if size == 0:
        return None
    lengths = getattr(data, "lengths", None)
    known = lengths is not None and len(lengths) == size
    if max_tokens:  # the budget counts padded tokens: the width the collate pads them to
        typical = int(np.median(np.asarray(lengths))) if known else len(data[0]["input_ids"])
        width = collate.width(typical) if hasattr(collate, "width") else typical
        rows = max_tokens // max(int(width), 1)
    rows = max(1, min(rows, size))
    if known:
        middle = np.argsort(np.asarray(lengths), kind="stable")
        start = (size - rows) // 2
        picked = [int(i) for i in middle[start:start + rows]]
    else:
        picked = list(range(rows))
    return collate([data[i] for i in picked])
