"""Keeps the best model so far (by `metric_for_best`) as a `save_pretrained` folder."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nlptrain.events import Callback

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer


class SaveBestModel(Callback):
    # Every rank runs it: the strategy gathers the weights (FSDP2: from every rank), rank 0
    # writes and holds the others until the folder is complete, so none reads a half-written model.

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.saved_metrics: dict | None = None

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        if is_best:
            trainer.strategy.export(trainer.model, trainer.tokenizer, self.folder)
            self.saved_metrics = metrics
