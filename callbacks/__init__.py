"""Ready callbacks. Each file is one callback to use, copy or extend (installed as
`nlptrain.callbacks`). `config_callbacks` makes the ones a TrainConfig asks for."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nlptrain.callbacks.best_model import SaveBestModel
from nlptrain.callbacks.checkpointing import Checkpointer
from nlptrain.callbacks.early_stopping import EarlyStopping
from nlptrain.callbacks.ema import EMA
from nlptrain.callbacks.fgm import FGM
from nlptrain.callbacks.freeze import Freeze
from nlptrain.callbacks.grad_clip import GradClip
from nlptrain.callbacks.lr_schedule import LRSchedule, multiply_lr
from nlptrain.callbacks.metric_logger import MetricLogger
from nlptrain.callbacks.per_rank_data import PerRankData
from nlptrain.callbacks.progress import ProgressBar
from nlptrain.callbacks.rdrop import RDrop
from nlptrain.callbacks.step_budget import StepBudget
from nlptrain.callbacks.tensorboard import TensorBoardLogger  # imports tensorboard only when used

if TYPE_CHECKING:
    from nlptrain.config import TrainConfig
    from nlptrain.events import Callback

__all__ = ["EMA", "FGM", "Checkpointer", "EarlyStopping", "Freeze", "GradClip", "LRSchedule",
           "MetricLogger", "PerRankData", "ProgressBar", "RDrop", "SaveBestModel", "StepBudget",
           "TensorBoardLogger",
           "config_callbacks", "multiply_lr", "with_config_callbacks"]


def config_callbacks(config: TrainConfig, progress: bool = False
                     ) -> tuple[list[Callback], list[Callback]]:
    """Callbacks that the config asks for, to run before the user's (progress, lr schedule,
    clipping) and after them (EMA: SaveBestModel saves the average before it is swapped out;
    early stopping decides once every other callback has seen the evaluation, and says so after
    its line)."""
    first: list[Callback] = [ProgressBar()] if progress else []
    first.append(LRSchedule(config.scheduler, config.warmup_ratio, config.warmup_steps))
    if config.max_grad_norm > 0:
        first.append(GradClip(config.max_grad_norm))
    if config.max_steps > 0:
        first.append(StepBudget(config.max_steps))
    last: list[Callback] = [EMA(config.ema_decay)] if config.ema_decay > 0 else []
    if config.early_stopping > 0:
        last.append(EarlyStopping(config.early_stopping))
    return first, last


def with_config_callbacks(callbacks: list[Callback], config: TrainConfig, progress: bool = False
                          ) -> list[Callback]:
    """The user's callbacks between those the config asks for (`config_callbacks`); a user's own
    callback of a class the config would make (or of a subclass) replaces the made one."""
    def given(made: Callback) -> bool:
        return any(isinstance(c, type(made)) for c in callbacks)

    first, last = ([c for c in made if not given(c)] for made in config_callbacks(config, progress))
    return [*first, *callbacks, *last]
