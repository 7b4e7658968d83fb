"""Keeps the best model so far (by `metric_for_best`) as a `save_pretrained` folder.

With checkpoints, the folder always holds the model that the checkpoint a resume starts from
calls the best. A new best is written beside it (`best.staged`) and takes its place when the next
checkpoint records it; the one it replaces stays as `best.previous` until a later checkpoint is
written (a resume from the checkpoint before still names it). A resume keeps the folder whose
step its checkpoint names and drops the others: a best scored after that checkpoint belongs to
training the resume discards. Without checkpoints a new best replaces the folder at once."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from nlptrain.events import Callback
from nlptrain.integrity import damage, file_checksums

from .checkpointing import Checkpointer

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)
MARK = "nlptrain_best.json"  # in each folder: the step whose evaluation chose its weights


class SaveBestModel(Callback):
    # Every rank runs it: the strategy gathers the weights (FSDP2: from every rank), rank 0
    # writes and holds the others until the folder is complete, so none reads a half-written model.

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.staged = self.folder.with_name(f"{self.folder.name}.staged")
        self.previous = self.folder.with_name(f"{self.folder.name}.previous")
        self.saved_metrics: dict | None = None
        self.saved_step: int | None = None
        self.warned = False
        self.failed = False

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        if not is_best:
            return
        checkpointed = bool(trainer.callbacks.find(Checkpointer))
        target = self.staged if checkpointed else self.folder
        trainer.strategy.export(trainer.model, trainer.tokenizer, target)
        step = trainer.global_step  # (its files' checksums: a resume keeps no damaged best)
        trainer.dist.on_main(lambda: (target / MARK).write_text(json.dumps(
            {"step": step, "files": file_checksums(target)})))
        self.saved_metrics, self.saved_step = metrics, step

    def on_epoch_end(self, trainer: Trainer) -> None:
        # Checked here, not at on_train_start: a later callback may set eval_data there.
        if trainer.eval_data is None and not self.warned and trainer.is_main:  # said once
            log.warning(f"SaveBestModel({str(self.folder)!r}) has nothing to compare: the trainer "
                        "has no eval_data, so no model is saved there")
            self.warned = True

    def on_exception(self, trainer: Trainer, error: BaseException) -> None:
        self.failed = True  # (a Ctrl-C's checkpoint, written after this, still promotes)

    def on_train_end(self, trainer: Trainer) -> None:
        if not self.failed:  # the run's best in the folder; after a failure a resume sorts them
            trainer.dist.on_main(self._promote)  # (no collective while a peer may be gone)
        self.failed = False

    # A resumed run that finds no better model must still hand back this one (`final_metrics`).
    # As JSON, like metrics.jsonl: a user's metric may be a numpy float, which a
    # `weights_only` load refuses.
    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        state["best_model_metrics"] = json.dumps(self.saved_metrics)
        state["best_model_step"] = self.saved_step
        trainer.dist.on_main(self._promote)

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        self.saved_metrics = json.loads(state.get("best_model_metrics", "null"))
        if "best_model_step" not in state:  # written before the step was kept: as it is
            return
        self.saved_step = state["best_model_step"]
        lost = trainer.dist.on_main(lambda: self._keep_step(self.saved_step))
        if lost:
            if trainer.is_main:
                log.warning("%s: the best model of step %s, which the checkpoint names, %s; the "
                            "best is chosen again from this run's evaluations", self.folder,
                            self.saved_step, lost)
            self.saved_metrics = self.saved_step = trainer.progress.best_metric = None

    def _promote(self) -> None:
        """The staged best into the folder; the folder's, kept as the previous one."""
        if not self.staged.is_dir():
            return
        shutil.rmtree(self.previous, ignore_errors=True)
        if self.folder.is_dir():
            self.folder.rename(self.previous)
        self.staged.rename(self.folder)

    def _keep_step(self, step: int | None) -> str | None:
        """The folder holds the best of `step` (None: no best yet); the others go. Why it is
        lost (gone, or damaged: a file that does not match its checksum), or None."""
        found, damaged = None, None
        for folder in (self.folder, self.staged, self.previous):
            if found is None and step is not None and _step_of(folder) == step:
                damaged = damage(folder, _mark(folder).get("files", {}))
                if damaged is None:
                    found = folder
                    continue
            if folder.is_dir():
                shutil.rmtree(folder)
        if found is not None and found != self.folder:
            found.rename(self.folder)
        if step is None or found is not None:
            return None
        return f"is damaged ({damaged}): removed" if damaged else "is gone"


def _mark(folder: Path) -> dict:
    try:
        mark = json.loads((folder / MARK).read_text())
    except (OSError, ValueError):
        return {}
    return mark if isinstance(mark, dict) else {}


def _step_of(folder: Path) -> int | None:
    try:
        return int(_mark(folder)["step"])
    except (ValueError, KeyError, TypeError):
        return None
