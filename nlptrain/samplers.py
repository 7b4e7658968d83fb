"""Samplers that shard data across ranks.

`ShardedSampler` is the training sampler the trainer injects when the user gave none. It is a
`DistributedSampler` (same seed + epoch shuffle, same padding rule) with two additions:

- one global order per epoch, dealt round-robin to the ranks, so after k steps the ranks together
  have consumed exactly the first k * world * batch samples of it. A resume therefore starts at a
  global sample count and works with any world size, without reading the skipped batches.
- optional length grouping: the order is cut into chunks of `group_size` samples and each chunk is
  sorted by length, so a batch (and the batches of all ranks in the same step) holds texts of
  similar length and dynamic padding has little to pad. Chunks are random, and so is the order
  of a chunk's blocks of `block_size` samples after its longest, so every epoch is still one
  shuffled pass over the data, not longest to shortest (a set of one chunk would be, each epoch).

`TokenBudgetSampler` builds batches by a token budget instead of a row count (`max_tokens`).
`EvalBatches` gives each rank a disjoint share of batches that are the same for any world size.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DistributedSampler, Sampler

from nlptrain.errors import DataError


class ShardedSampler(DistributedSampler):
    resumes_by_samples = True  # the trainer passes set_epoch(epoch, start=samples done)

    def __init__(
        self,
        dataset: Sequence,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        lengths: np.ndarray | None = None,
        group_size: int = 1024,
        block_size: int | None = None,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=False)
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.group_size = group_size
        # The loader's 8 batches: whole steps of 1, 2, 4 or 8 ranks, and not a function of the
        # world size, so a resume under another one finds the same global order.
        self.block_size = block_size
        self.start = 0  # global samples of this epoch already consumed (resume)

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        """Seed the order with `seed + epoch`; skip the first `start` samples of it (resume)."""
        super().set_epoch(epoch)
        self.start = start

    def global_order(self) -> np.ndarray:
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n)
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).numpy()
        if self.lengths is not None:
            for begin in range(0, n, self.group_size):
                chunk = order[begin : begin + self.group_size]
                chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]
                order[begin : begin + self.group_size] = self._blocks_shuffled(chunk, generator)
        return order

    def _blocks_shuffled(self, chunk: np.ndarray, generator: torch.Generator) -> np.ndarray:
        """The length-sorted `chunk`'s whole blocks in random order, its longest first (a batch
        too long for memory fails at the first step, not hours later), a part block last."""
        size = self.block_size
        whole = len(chunk) // size if size else 0
        if whole <= 2:
            return chunk
        blocks = [chunk[i * size : (i + 1) * size] for i in range(whole)]
        rest = torch.randperm(whole - 1, generator=generator).tolist()
        return np.concatenate([blocks[0], *(blocks[1 + i] for i in rest), chunk[whole * size :]])

    def _remaining(self) -> np.ndarray:
        # The rows after the resume offset, padded like DistributedSampler (the epoch's first
        # rows again) up to a multiple of this world size: a resume under the same world size
        # ends the epoch on the same rows as the run that never stopped, and one under another
        # world size repeats no more rows than that world's padding (fewer than one per rank).
        return _pad(self.global_order(), self.start, self.num_replicas)

    def __iter__(self) -> Iterator[int]:
        share = self._remaining()[self.rank :: self.num_replicas]
        for begin in range(0, len(share), 4096):  # ints in small chunks: no list of the whole share
            yield from share[begin : begin + 4096].tolist()

    def __len__(self) -> int:
        return -(-max(len(self.dataset) - self.start, 0) // self.num_replicas)


def _pad(order: np.ndarray, start: int, world: int) -> np.ndarray:
    """`order` from `start` on, and the first rows of `order` again, up to a multiple of `world`."""
    rest = order[start:]
    short = -len(rest) % world
    return np.concatenate([rest, np.resize(order, short)]) if short and len(order) else rest


class EvalBatches(Sampler[list[int]]):
    """Evaluation batches that are the same for every world size: the rows sorted longest first,
    cut into batches of `batch_size`, batch b to rank b % world. A row then meets the same batch
    neighbours and padding on 1 process or N, so its output is the same to the bit and the
    metrics are one process's exactly (a regression's correlations too); no row comes twice.
    A batch sampler (`DataLoader(batch_sampler=...)`)."""

    def __init__(self, size: int, rank: int, world_size: int, batch_size: int,
                 lengths: np.ndarray | None = None) -> None:
        order = np.arange(size) if lengths is None else \
            np.argsort(-np.asarray(lengths)[:size], kind="stable")
        self.batches = [order[i:i + batch_size] for i in range(0, size, batch_size)][rank::world_size]

    def __iter__(self) -> Iterator[list[int]]:
        return (batch.tolist() for batch in self.batches)

    def __len__(self) -> int:
        return len(self.batches)


def repeat_forever(loader: Iterable) -> Iterator:
    """The loader's batches again and again (a stream shorter than the agreed steps). A pass
    that gives none is an error: it would spin for ever, deaf to a stop signal (no step ends)."""
    while True:
        empty = True
        for batch in loader:
            empty = False
            yield batch
        if empty:
            raise DataError("the training data gave no batch in a whole pass: a generator or "
                            "iterator is read once (give a list, a Dataset or a DataLoader, "
                            "which can be read again), or the stream is empty")


class TokenBudgetSampler(Sampler[list[int]]):
    """Batches by a token budget (fairseq's `max_tokens`): each holds as many rows as fit in
    `max_tokens` padded tokens (rows x its longest row), so short texts come many to a batch and
    long ones few, at a steady cost per step. A batch sampler (`DataLoader(batch_sampler=...)`).

    Like `ShardedSampler`: one global plan per epoch (seed + epoch), length-grouped in random
    chunks, the batches shuffled, dealt round-robin to the ranks; exactly one pass over the rows;
    every rank gets as many batches (the plan splits its largest batches until the count divides
    by the world size, and where only single rows are left, repeats the epoch's first rows); a
    resume skips the first `start` global samples of the plan, with any
    world size, without reading them.
    """

    resumes_by_samples = True  # the trainer passes set_epoch(epoch, start=samples done)

    def __init__(self, lengths: np.ndarray, max_tokens: int, num_replicas: int = 1,
                 rank: int = 0, seed: int = 0, shuffle: bool = True, group_batches: int = 64) -> None:
        self.lengths = np.maximum(np.asarray(lengths, dtype=np.int64), 1)
        self.max_tokens, self.num_replicas, self.rank = max_tokens, num_replicas, rank
        self.seed, self.shuffle, self.epoch, self.start = seed, shuffle, 0, 0
        # Rows sorted together: about `group_batches` batches' worth.
        rows_per_batch = max(1, max_tokens // max(int(self.lengths.mean()) if len(lengths) else 1, 1))
        self.group_rows = group_batches * rows_per_batch
        self._plan: list[np.ndarray] | None = None

    def set_epoch(self, epoch: int, start: int = 0) -> None:
        self.epoch, self.start, self._plan = epoch, start, None

    def global_plan(self) -> list[np.ndarray]:
        """This epoch's batches (row numbers) in order, before any resume offset."""
        n = len(self.lengths)
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(n, generator=generator).numpy() if self.shuffle else np.arange(n)
        batches: list[np.ndarray] = []
        for begin in range(0, n, self.group_rows):
            chunk = order[begin : begin + self.group_rows]
            chunk = chunk[np.argsort(-self.lengths[chunk], kind="stable")]  # longest first
            i = 0
            while i < len(chunk):  # the first row of a batch is its longest: it sets the width
                rows = max(1, self.max_tokens // int(self.lengths[chunk[i]]))
                batches.append(chunk[i : i + rows])
                i += rows
        if self.shuffle and len(batches) > 1:
            # The most tokens first (a batch too big for memory fails at once), the rest shuffled.
            first = max(range(len(batches)), key=lambda b: len(batches[b]) *
                        int(self.lengths[batches[b]].max()))
            rest = [b for i, b in enumerate(batches) if i != first]
            batches = [batches[first]] + [rest[i] for i in torch.randperm(
                len(rest), generator=generator).tolist()]
        return batches

    def plan(self) -> list[np.ndarray]:
        """The batches left in this epoch after `start` samples, their count a multiple of the
        world size."""
        if self._plan is not None:
            return self._plan
        left, skip, planned = [], self.start, self.global_plan()
        for batch in planned:
            if skip >= len(batch):
                skip -= len(batch)
                continue
            left.append(batch[skip:])  # a resume under another world size may cut a batch
            skip = 0
        while len(left) % self.num_replicas:
            largest = max(range(len(left)), key=lambda b: len(left[b]), default=None)
            if largest is None or len(left[largest]) < 2:
                break
            batch = left.pop(largest)
            left[largest:largest] = [batch[: len(batch) // 2], batch[len(batch) // 2 :]]
        if left and len(left) % self.num_replicas:
            # Single rows that cannot be split among the ranks: the last ranks repeat the epoch's
            # first rows, as DistributedSampler pads, so that no row is dropped.
            missing = self.num_replicas - len(left) % self.num_replicas
            left += [row[None] for row in np.resize(np.concatenate(planned), missing)]
        self._plan = left
        return left

    def __iter__(self) -> Iterator[list[int]]:
        for batch in self.plan()[self.rank :: self.num_replicas]:
            yield batch.tolist()

    def __len__(self) -> int:
        return len(self.plan()[self.rank :: self.num_replicas])
