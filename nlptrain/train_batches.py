"""Where each epoch's training batches come from, for the trainer's loop."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset

from nlptrain.config import TrainConfig
from nlptrain.data.hf_datasets import RowList
from nlptrain.data.tokenized import TokenizedDataset
from nlptrain.distributed import Backend
from nlptrain.errors import ConfigError, DataError
from nlptrain.loaders import check_own_loader, epoch_batches, planned_batch_rows, train_loader
from nlptrain.progress import Progress
from nlptrain.random_state import rng_state
from nlptrain.step_agreement import StepWindow


class TrainBatches:
    """A Dataset gets the default sharded loader, made once and kept while the train data stays
    the same object (a callback may swap `trainer.train_data`); a user's DataLoader or iterable
    is read as is (said once where every rank reads it whole). Each epoch starts at `set_epoch`,
    skips what a resumed checkpoint had trained, and gives every rank as many batches
    (`epoch_batches`)."""

    def __init__(self, dist: Backend, device: torch.device) -> None:
        self.dist, self.device = dist, device
        self.epoch_random: dict[str, Any] | None = None  # RNG state the epoch's batches began in
        self.resume_samples = 0  # of the epoch, trained before the checkpoint a run resumed from
        self._loader_for: tuple[Any, Any] = (None, None)  # (the data, the loader made for it)
        self._said_unsharded = False  # a user's loader that every rank reads whole

    def of_epoch(self, data: Any, to_dataset: Callable[[Any], Any], config: TrainConfig,
                 collate: Any, progress: Progress, window: StepWindow,
                 targets_problem: Callable[[torch.Tensor], str | None] | None = None
                 ) -> Iterator[dict[str, torch.Tensor]]:
        """This epoch's batches of `data` (`to_dataset` reads a 🤗 dataset, say, as ours), and
        the rows that weigh each micro-batch in its step (`window`). `targets_problem(targets)`
        sees each batch's targets where a loader or stream of the user's gives them, whose rows
        nothing checked before (a dataset's were, when the trainer took it)."""
        if data is None:
            raise ConfigError("no training data: pass train_data or set trainer.train_data "
                              "in a callback's on_train_start")
        resumed, self.resume_samples = self.resume_samples, 0
        if not resumed:  # (a resume has the checkpoint's: a user's loader's skip draws from it)
            self.epoch_random = rng_state()
        loader = self.loader(data, to_dataset, config, collate)
        batches = epoch_batches(loader, config, progress, self.dist, resumed, self.epoch_random)
        made = loader is self._loader_for[1]  # a loader of the user's, even over our sampler: no plan
        plan = planned_batch_rows(loader, self.dist.world_size) if made else None
        window.plan_rows(plan, progress.batch_in_epoch, self.dist.rank)
        checked = made and isinstance(getattr(loader, "dataset", None), TokenizedDataset | RowList)
        return batches if checked or targets_problem is None else \
            _targets_checked(batches, targets_problem, progress)

    def loader(self, data: Any, to_dataset: Callable[[Any], Any], config: TrainConfig,
               collate: Any) -> Any:
        """A user's DataLoader or iterable as is; for a Dataset, the default sharded loader."""
        if self._loader_for[0] is data:
            return self._loader_for[1]
        dist, original, data = self.dist, data, to_dataset(data)
        if not isinstance(data, Dataset) or isinstance(data, DataLoader):
            self._said_unsharded |= check_own_loader(  # (a new one each epoch: said once)
                data, config, dist.world_size, say=dist.is_main and not self._said_unsharded)
            return data
        loader = train_loader(data, config, dist.world_size, dist.rank, collate, self.device)
        self._loader_for = (original, loader)
        return loader

    def close(self) -> None:
        """Let the loader go (its workers end with it)."""
        self._loader_for = (None, None)


def _targets_checked(batches: Iterator[dict[str, torch.Tensor]],
                     problem: Callable[[torch.Tensor], str | None], progress: Progress
                     ) -> Iterator[dict[str, torch.Tensor]]:
    """Each batch's targets checked on the host (a class id past the labels: an IndexError deep
    in the loss on a CPU, a device-side assert on a GPU, or a multi-label target of 2 that trains
    without a word); targets already on a GPU are not read back (no sync a step)."""
    for batch in batches:
        targets = batch.get("labels") if hasattr(batch, "get") else None
        found = problem(targets) if isinstance(targets, torch.Tensor) and \
            targets.device.type == "cpu" else None
        if found:
            raise DataError(f"training batch {progress.batch_in_epoch + 1} of epoch "
                            f"{progress.epoch + 1}: {found}")
        yield batch
