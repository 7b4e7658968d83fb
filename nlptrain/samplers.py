"""Samplers that shard data across ranks.

`ShardedSampler` is the training sampler the trainer injects when the user gave none. It is a
`DistributedSampler` (same seed + epoch shuffle, same padding rule) with two additions:

- one global order per epoch, dealt round-robin to the ranks, so after k steps the ranks together
  have consumed exactly the first k * world * batch samples of it. A resume therefore starts at a
  global sample count and works with any world size, without reading the skipped batches.
- optional length grouping: the order is cut into chunks of `group_size` samples and each chunk is
  sorted by length, so a batch (and the batches of all ranks in the same step) holds texts of
  similar length and dynamic padding has little to pad. Chunks are random, so every epoch is still
  one shuffled pass over the data.

`EvalSampler` gives each rank a disjoint share with no padding duplicates, longest first.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import DistributedSampler, Sampler


class ShardedSampler(DistributedSampler):
    def __init__(
        self,
        dataset: Sequence,
        num_replicas: int = 1,
        rank: int = 0,
        shuffle: bool = True,
        seed: int = 0,
        lengths: np.ndarray | None = None,
        group_size: int = 1024,
    ) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle,
                         seed=seed, drop_last=False)
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.group_size = group_size
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
                # Longest first: a too-long batch fails at the first step, not hours later.
                order[begin : begin + self.group_size] = chunk[
                    np.argsort(-self.lengths[chunk], kind="stable")]
        return order

    def _remaining(self) -> np.ndarray:
        rest = self.global_order()[self.start :]
        # Pad like DistributedSampler (repeat from the front) so every rank gets as many samples.
        short = -len(rest) % self.num_replicas
        if short:
            rest = np.concatenate([rest, np.resize(rest, short)]) if len(rest) else rest
        return rest

    def __iter__(self) -> Iterator[int]:
        share = self._remaining()[self.rank :: self.num_replicas]
        for begin in range(0, len(share), 4096):  # ints in small chunks: no list of the whole share
            yield from share[begin : begin + 4096].tolist()

    def __len__(self) -> int:
        remaining = max(len(self.dataset) - self.start, 0)
        return -(-remaining // self.num_replicas)


class EvalSampler(Sampler[int]):
    """Rank r takes rows r, r+world, ...: disjoint shares, no duplicates, longest first."""

    def __init__(self, size: int, rank: int, world_size: int,
                 lengths: np.ndarray | None = None) -> None:
        self.indices = np.arange(rank, size, world_size)
        if lengths is not None:
            self.indices = self.indices[np.argsort(-np.asarray(lengths)[self.indices], kind="stable")]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices.tolist())

    def __len__(self) -> int:
        return len(self.indices)


def repeat_forever(loader: Iterable) -> Iterator:
    """The loader's batches again and again (a stream shorter than the agreed steps)."""
    while True:
        yield from loader
