"""Ready callbacks. Each file is one callback to use, copy or extend (installed as
`nlptrain.callbacks`)."""

from nlptrain.callbacks.best_model import SaveBestModel
from nlptrain.callbacks.checkpointing import Checkpointer
from nlptrain.callbacks.early_stopping import EarlyStopping
from nlptrain.callbacks.ema import EMA
from nlptrain.callbacks.fgm import FGM
from nlptrain.callbacks.freeze import Freeze
from nlptrain.callbacks.grad_clip import GradClip
from nlptrain.callbacks.lr_schedule import LRSchedule
from nlptrain.callbacks.metric_logger import MetricLogger
from nlptrain.callbacks.per_rank_data import PerRankData
from nlptrain.callbacks.progress import ProgressBar
from nlptrain.callbacks.rdrop import RDrop
from nlptrain.callbacks.tensorboard import TensorBoardLogger  # imports tensorboard only when used

__all__ = ["EMA", "FGM", "Checkpointer", "EarlyStopping", "Freeze", "GradClip", "LRSchedule",
           "MetricLogger", "PerRankData", "ProgressBar", "RDrop", "SaveBestModel", "TensorBoardLogger"]
