"""nlptrain: fine-tune transformer text classifiers in one process or many (DDP).

    from nlptrain import Trainer, DistTrainer, Callback

Names are imported on first use, so `python -m nlptrain --help` does not wait for torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker reads; at run time __getattr__ imports on first use
    from nlptrain.config import DataConfig, ModelConfig, TaskConfig, TrainConfig
    from nlptrain.events import EVENTS, Callback
    from nlptrain.task_files import load_task
    from nlptrain.trainer import DistTrainer, Trainer

from nlptrain.version import __version__ as __version__  # the package's (one place)

_EXPORTS = {
    "Trainer": "nlptrain.trainer", "DistTrainer": "nlptrain.trainer",
    "Callback": "nlptrain.events", "EVENTS": "nlptrain.events",
    "TaskConfig": "nlptrain.config", "TrainConfig": "nlptrain.config",
    "DataConfig": "nlptrain.config", "ModelConfig": "nlptrain.config",
    "load_task": "nlptrain.task_files",
}
# _EXPORTS' names, and the TYPE_CHECKING imports' (tests/test_typing.py)
__all__ = ["Callback", "DataConfig", "DistTrainer", "EVENTS", "ModelConfig", "TaskConfig",
           "TrainConfig", "Trainer", "load_task"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'nlptrain' has no attribute {name!r}")
