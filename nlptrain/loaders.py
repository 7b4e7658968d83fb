"""The training DataLoader the trainer makes for a Dataset (a user's own loader is used as is).

Rows per batch (`batch_size`, length-grouped by `ShardedSampler`) or a token budget per batch
(`max_tokens`, `TokenBudgetSampler`); either way one shuffled pass per epoch, sharded by rank,
resumable at a global sample count.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset

from nlptrain.config import TrainConfig
from nlptrain.errors import ConfigError
from nlptrain.samplers import ShardedSampler, TokenBudgetSampler


def train_loader(data: Dataset, config: TrainConfig, world_size: int, rank: int, collate: Any,
                 device: torch.device) -> DataLoader:
    lengths = getattr(data, "lengths", None)
    common: dict[str, Any] = dict(
        collate_fn=collate, num_workers=config.num_workers,
        pin_memory=device.type == "cuda", persistent_workers=config.num_workers > 0,
        # Its own generator: creating the iterator then draws no number from the global RNG, so
        # dropout after a resume is exactly that of an uninterrupted run.
        generator=torch.Generator().manual_seed(config.seed))
    if config.max_tokens:
        if isinstance(data, IterableDataset) or lengths is None:
            raise ConfigError("[train] max_tokens needs a dataset that knows its rows' lengths "
                              "(a TokenizedDataset; not a stream)")
        pad_to = getattr(collate, "pad_to", None)  # padding = max_length: every row is that long
        if pad_to:
            lengths = np.full(len(lengths), pad_to)
        batches = TokenBudgetSampler(lengths, config.max_tokens, world_size, rank, config.seed)
        return DataLoader(data, batch_sampler=batches, **common)
    sampler = None
    if not isinstance(data, IterableDataset):
        sampler = ShardedSampler(data, world_size, rank, shuffle=True, seed=config.seed,
                                 lengths=lengths if config.group_by_length else None,
                                 group_size=64 * config.batch_size)
    return DataLoader(data, batch_size=config.batch_size, sampler=sampler,
                      drop_last=config.drop_last, **common)
