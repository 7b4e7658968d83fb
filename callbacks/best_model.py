"""Keeps the best model so far (by `metric_for_best`) as a `save_pretrained` folder."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)


class SaveBestModel(Callback):
    # Every rank runs it: the strategy gathers the weights (FSDP2: from every rank), rank 0
    # writes and holds the others until the folder is complete, so none reads a half-written model.

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.saved_metrics: dict | None = None
        self.warned = False

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        if is_best:
            trainer.strategy.export(trainer.model, trainer.tokenizer, self.folder)
            self.saved_metrics = metrics

    def on_epoch_end(self, trainer: Trainer) -> None:
        # Checked here, not at on_train_start: a later callback may set eval_data there.
        if trainer.eval_data is None and not self.warned and trainer.is_main:  # said once
            log.warning(f"SaveBestModel({str(self.folder)!r}) has nothing to compare: the trainer "
                        "has no eval_data, so no model is saved there")
            self.warned = True

    # A resumed run that finds no better model must still hand back this one (`final_metrics`).
    # As JSON, like metrics.jsonl: a user's metric may be a numpy float, which a
    # `weights_only` load refuses.
    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        state["best_model_metrics"] = json.dumps(self.saved_metrics)

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        self.saved_metrics = json.loads(state.get("best_model_metrics", "null"))
