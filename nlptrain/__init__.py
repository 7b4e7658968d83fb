"""nlptrain: fine-tune transformer text classifiers in one process or many (DDP).

    from nlptrain import Trainer, DistTrainer, Callback

Names are imported on first use, so `python -m nlptrain --help` does not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Trainer": "nlptrain.trainer", "DistTrainer": "nlptrain.trainer",
    "Callback": "nlptrain.events", "EVENTS": "nlptrain.events",
    "TaskConfig": "nlptrain.config", "TrainConfig": "nlptrain.config",
    "DataConfig": "nlptrain.config", "ModelConfig": "nlptrain.config",
    "load_task": "nlptrain.config",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'nlptrain' has no attribute {name!r}")
