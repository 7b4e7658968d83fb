"""Ready callbacks. Each file is one callback to use, copy or extend (installed as
`nlptrain.callbacks`)."""

from nlptrain.callbacks.best_model import SaveBestModel
from nlptrain.callbacks.checkpointing import Checkpointer
from nlptrain.callbacks.early_stopping import EarlyStopping
from nlptrain.callbacks.grad_clip import GradClip
from nlptrain.callbacks.lr_schedule import LRSchedule
from nlptrain.callbacks.metric_logger import MetricLogger
from nlptrain.callbacks.progress import ProgressBar

__all__ = ["Checkpointer", "EarlyStopping", "GradClip", "LRSchedule", "MetricLogger",
           "ProgressBar", "SaveBestModel"]
