"""Ready callbacks. Each file is one callback to use, copy or extend (installed as
`nlptrain.callbacks`)."""

from nlptrain.callbacks.best_model import SaveBestModel
from nlptrain.callbacks.checkpointing import Checkpointer
from nlptrain.callbacks.early_stopping import EarlyStopping
from nlptrain.callbacks.grad_clip import GradClip
from nlptrain.callbacks.lr_schedule import LRSchedule
from nlptrain.callbacks.metric_logger import MetricLogger
from nlptrain.callbacks.per_rank_data import PerRankData
from nlptrain.callbacks.progress import ProgressBar
from nlptrain.callbacks.tensorboard import TensorBoardLogger  # imports tensorboard only when used

__all__ = ["Checkpointer", "EarlyStopping", "GradClip", "LRSchedule", "MetricLogger", "PerRankData",
           "ProgressBar", "SaveBestModel", "TensorBoardLogger"]
