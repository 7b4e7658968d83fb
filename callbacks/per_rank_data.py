"""Per-rank training files: each rank reads, tokenizes and holds only its own share.

    python -m nlptrain split --task sst2 --data-dir DATA --world-size 4 --shuffle --out /data/sst2-4
    torchrun --nproc_per_node 4 -m nlptrain train --task sst2 --data-dir DATA --train-shards /data/sst2-4

or, from Python, `DistTrainer(model, None, eval_set, tokenizer=tokenizer,
callbacks=[PerRankData(folder, labels)])`.
In `on_train_start` the callback reads `manifest.json` of a folder made by `nlptrain split`, refuses
a job whose world size is not the manifest's, and sets `trainer.train_data` to a DataLoader over
this rank's file (chosen from the current RANK / WORLD_SIZE), with an `EpochSampler`: file order, or
a shuffle seeded by seed + epoch. No DistributedSampler: the trainer keeps this loader as is.

Uneven files (different batch counts per rank) would hang DDP. Policy `drop` (default): the trainer
agrees with one all_reduce(MIN) that every rank takes the shortest rank's batch count, and the
longer ranks leave their surplus rows out of that epoch. Policy `wrap`: every rank's sampler runs
to the longest file's row count, repeating its own rows from the start (or a fresh shuffle), so
nothing is left out and short ranks see some rows twice. Either way rank 0 logs, each epoch the
numbers change, what every rank takes, drops and repeats (also in `self.reports`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch.utils.data import DataLoader, Sampler

from nlptrain.config import FileSpec
from nlptrain.data import LabelVocab, TokenizedDataset
from nlptrain.data.label_order import LabelOrder
from nlptrain.data.readers import Examples, iter_rows
from nlptrain.data.split import Manifest
from nlptrain.data.tokenized import cache_key, cached, default_cache_dir
from nlptrain.errors import ConfigError, DataError
from nlptrain.events import Callback
from nlptrain.kinds import SingleLabel, TaskKind, from_task
from nlptrain.models import record_how_rows_were_read
from nlptrain.signals import leave_stops_to_the_main_process

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger("nlptrain")

POLICIES = ("drop", "wrap")


class EpochSampler(Sampler[int]):
    """Rows 0..size-1 in order, or shuffled with seed + epoch; `length` > size wraps around."""

    def __init__(self, size: int, shuffle: bool = False, seed: int = 0,
                 length: int | None = None) -> None:
        self.size, self.shuffle, self.seed = size, shuffle, seed
        self.length = size if length is None else length
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        if not self.size:
            return iter(())
        if not self.shuffle:
            return iter(i % self.size for i in range(self.length))
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        rounds = [torch.randperm(self.size, generator=generator)
                  for _ in range(-(-self.length // self.size))]  # wrapping: a fresh order each round
        return iter(torch.cat(rounds)[: self.length].tolist())

    def __len__(self) -> int:
        return self.length


class PerRankData(Callback):
    def __init__(self, folder: str | Path, labels: LabelVocab | list | dict | None = None,
                 max_length: int = 128, shuffle: bool = False, seed: int = 0,
                 uneven: str = "drop", cache_dir: str | Path | None = None,
                 tokenizer: Any = None, kind: TaskKind | None = None, pairs: bool = False) -> None:
        if uneven not in POLICIES:
            raise ConfigError(f"uneven shards policy '{uneven}': choose one of {', '.join(POLICIES)}")
        self.folder = Path(folder)
        self.labels = labels if labels is None or isinstance(labels, LabelVocab) \
            else LabelVocab.from_config(labels)
        self.max_length, self.shuffle, self.seed, self.uneven = max_length, shuffle, seed, uneven
        self.cache_dir = None if cache_dir is None else Path(cache_dir)
        self.tokenizer = tokenizer
        self.kind = kind or SingleLabel()  # what a row's label is (see nlptrain.kinds)
        self.pairs = pairs                 # rows hold a second text ("text_pair")
        self.manifest: Manifest | None = None
        self.sampler: EpochSampler | None = None
        self._checksums_then: list | None = None  # the files a resumed run read (its checkpoint)
        self.reports: list[dict[str, Any]] = []  # per epoch: agreed batches and each rank's rows
        self._reported = False

    @classmethod
    def from_task(cls, task: Any, labels: LabelVocab, use_cache: bool = True) -> PerRankData:
        """The callback for `[data] train_shards` (relative to the data folder)."""
        folder = Path(task.data_dir or ".") / task.data.train_shards
        cache = Path(task.data.cache_dir) if task.data.cache_dir else default_cache_dir(folder)
        return cls(folder, labels, task.model.max_length, task.data.shard_shuffle, task.train.seed,
                   task.data.uneven_shards, cache if use_cache else None, kind=from_task(task),
                   pairs=task.data.text_pair_column != "")

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        if self.manifest is not None:  # which files the run read: a resume reads the same
            state["part_checksums"] = [part.get("checksum") for part in self.manifest.parts]

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        self._checksums_then = state.get("part_checksums")

    def on_train_start(self, trainer: Trainer) -> None:
        self.manifest = Manifest.load(self.folder)
        self.manifest.check_world_size(trainer.dist.world_size, self.folder)
        self._check_same_files(trainer)
        rank = trainer.dist.rank
        part = self.manifest.part_path(self.folder, rank)
        dataset = self._load(part, trainer)
        record_how_rows_were_read(trainer.unwrapped_model, dataset)  # for the export's predict
        if len(dataset) != self.manifest.rows[rank]:
            raise DataError(f"{part}: {len(dataset)} rows, but the manifest says "
                            f"{self.manifest.rows[rank]}; the file changed: run split again")
        if trainer.is_main and not self.shuffle and self.kind.has_classes:
            self._warn_if_grouped(part, dataset)
        length = max(self.manifest.rows) if self.uneven == "wrap" else len(dataset)
        self.sampler = EpochSampler(len(dataset), self.shuffle, self.seed, length)
        cfg = trainer.config
        trainer.train_data = DataLoader(
            dataset, batch_size=cfg.batch_size, sampler=self.sampler, collate_fn=trainer.collate,
            drop_last=cfg.drop_last, num_workers=cfg.num_workers,
            pin_memory=trainer.device.type == "cuda", persistent_workers=cfg.num_workers > 0,
            worker_init_fn=leave_stops_to_the_main_process,
            generator=torch.Generator().manual_seed(self.seed))  # not the global RNG (resume)

    def _warn_if_grouped(self, part: Path, dataset: TokenizedDataset) -> None:
        """Rows grouped by label (split without --shuffle), read in file order: every rank
        trains class by class. Said from rank 0's file (round-robin parts look alike)."""
        order = LabelOrder.of_targets(dataset.label_ids)  # the targets held: no second read
        if order.grouped:
            log.warning("%s: the rows come grouped by label (%s): read in file order, each rank "
                        "trains class by class and learns little; give --shard-shuffle (or split "
                        "again with --shuffle)", part, order)

    def _check_same_files(self, trainer: Trainer) -> None:
        """A resume mid-epoch skips the batches done of each rank's file: of files split again
        since (other rows, another order) it would skip rows never trained. Refused then; said
        at an epoch's end, where the rest of the run simply reads the new files."""
        then = self._checksums_then
        if then is None or then == [part.get("checksum") for part in self.manifest.parts]:
            return
        if trainer.batch_in_epoch:
            raise DataError(f"{self.folder}: its files were split again since the checkpoint (their "
                            "checksums differ from those the run read): resuming mid-epoch would "
                            "skip rows it never trained; resume with the files it began with")
        if trainer.is_main:
            log.warning("%s: its files were split again since the checkpoint; the run goes on "
                        "with the new ones", self.folder)

    def on_epoch_start(self, trainer: Trainer) -> None:
        if self.sampler is not None:
            self.sampler.set_epoch(trainer.epoch)  # the trainer calls it too; this keeps it explicit
        self._reported = False

    def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
        # The agreed batch count is known only now (the trainer agrees after on_epoch_start).
        if self._reported or self.manifest is None:
            return
        self._reported = True
        cfg = trainer.config
        ranks = plan(self.manifest.rows, trainer.batches_per_epoch, cfg.batch_size, cfg.drop_last,
                     self.uneven == "wrap")
        # What set the count: [train] steps_per_epoch when it cut every rank short, else the files.
        capped = bool(cfg.steps_per_epoch) and all(r["batches"] > trainer.batches_per_epoch
                                                   for r in ranks)
        why = f"steps_per_epoch {cfg.steps_per_epoch}" if capped else \
            f"uneven shards policy: {self.uneven}"
        steps_left = cfg.max_steps - trainer.global_step if cfg.max_steps else None
        if steps_left is not None and steps_left * cfg.grad_accum < trainer.batches_per_epoch:
            why += f"; max_steps {cfg.max_steps} ends the run {steps_left} optimizer step(s) in"
        report = {"epoch": trainer.epoch, "batches": trainer.batches_per_epoch, "ranks": ranks,
                  "why": why}
        # Said as the first epoch starts, then where the plan changes (also where max_steps ends).
        changed = not self.reports or (self.reports[-1]["ranks"], self.reports[-1]["why"]) != \
            (ranks, why)
        if trainer.is_main and not self.reports and capped and not self.shuffle and \
                any(r["dropped"] for r in ranks):
            log.warning("per-rank data in file order with steps_per_epoch = %d: each epoch trains "
                        "the same first rows of each file, and the rest are never trained; give "
                        "--shard-shuffle, or leave steps_per_epoch at 0", cfg.steps_per_epoch)
        self.reports.append(report)
        if trainer.is_main and changed:
            log.info("%s", self.describe(report))

    def describe(self, report: dict[str, Any]) -> str:
        order = "random rows, new each epoch" if self.shuffle else "in file order"
        lines = [f"per-rank data, epoch {report['epoch'] + 1}: each rank takes "
                 f"{report['batches']} batches ({report['why']})"]
        for rank, info in enumerate(report["ranks"]):
            part = self.manifest.parts[rank]["file"] if self.manifest else f"rank {rank}"
            line = f"  rank {rank}: {part}: {info['rows']} rows, takes {info['trained']}"
            if info["dropped"]:
                line += f", dropped {info['dropped']} ({'the last ones' if not self.shuffle else order})"
            if info["repeated"]:
                line += (f", repeated {info['repeated']} "
                         f"({'its first ones' if not self.shuffle else 'from a second shuffle'})")
            lines.append(line)
        return "\n".join(lines)

    def _load(self, part: Path, trainer: Trainer) -> TokenizedDataset:
        tokenizer = self.tokenizer or trainer.tokenizer
        if tokenizer is None:
            raise ConfigError("PerRankData needs a tokenizer: pass tokenizer= to it or the trainer")
        labels = self.labels or LabelVocab.from_config(trainer.label_names)
        spec = FileSpec(path=str(part), format="jsonl", text_column="text", label_column="label",
                        text_pair_column="text_pair" if self.pairs else "")

        def build() -> tuple[TokenizedDataset, dict]:
            examples = read_part(spec)
            targets = labels.encode(examples, self.kind)
            return TokenizedDataset.from_texts(examples.texts, targets, tokenizer, self.max_length,
                                               pairs=examples.pairs, what=f"{part.name} (this rank's)"
                                               ), {"rows": len(examples)}

        if self.cache_dir is None:
            return build()[0]
        # Each rank caches its own share: the next run maps it instead of tokenizing.
        key = cache_key([part], tokenizer, self.max_length,
                        {"per_rank": part.name, "labels": [labels.values, labels.names],
                         "kind": self.kind.cache_key(),
                         "pairs": self.pairs})
        dataset = cached(self.cache_dir / key, build)[0]
        dataset.max_length, dataset.pairs = self.max_length, self.pairs  # a cache maps ids only
        return dataset


def read_part(spec: FileSpec) -> Examples:
    """The rows of one part file, checked as the readers check them; the targets are encoded by
    the caller, which names a bad label's file and line."""
    examples = Examples()
    # The parts hold what split wrote: a column the task reads and they lack (a pair's second
    # text, split without the task) is mended by splitting again, not by the task's keys.
    fix = ("make the per-rank files again with split --task TASK (it writes the task's "
           "{role}_column), or --set data.{role}_column=... to split")
    for row in iter_rows(spec, "", (), "per-rank train", fix=fix):
        examples.add(row)
    return examples


def plan(rows: list[int], batches: int, batch_size: int, drop_last: bool = False,
         wrap: bool = False) -> list[dict[str, int]]:
    """What each rank trains on when every rank takes `batches` batches of its sampler."""
    out = []
    longest = max(rows) if rows else 0
    for n in rows:
        length = longest if wrap else n  # sampler positions of this rank
        available = length // batch_size if drop_last else math.ceil(length / batch_size)
        taken = min(batches, available) * batch_size if drop_last else min(length, batches * batch_size)
        out.append({"rows": n, "batches": available, "trained": min(taken, n),
                    "dropped": n - min(taken, n), "repeated": max(taken - n, 0)})
    return out

