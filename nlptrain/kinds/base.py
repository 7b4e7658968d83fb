"""The protocol every task kind follows (see the package's docstring), and what kinds share."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nlptrain.errors import ConfigError
from nlptrain.scores import metric_label

if TYPE_CHECKING:
    import torch

# Metrics where a smaller value is better; every other metric is better when larger, unless
# [train] best_is says otherwise (a user's own error metric).
LOWER_IS_BETTER = frozenset({"loss", "mse", "mae"})
FLOAT32_MAX = float(np.finfo(np.float32).max)
ADD_LABEL = "[data] labels in a task file, label_names= in Python"  # where the labels are named
Where = Callable[[int], tuple[str, int]]  # row number -> (file, line), for error messages


class TaskKind:
    """The protocol every kind follows (and the single-label behaviour shared by default)."""

    name = ""
    problem_type = ""
    default_metric = ""
    metric_names: tuple[str, ...] = ()  # what `metrics` returns as scalars; metric_for_best picks one
    headline: tuple[str, ...] = ()      # the few metrics that logs, reports and plots show
    has_classes = True                  # per-class table and label vocabulary
    empty_label_ok = False              # an empty label cell is a row's labels (none), not a gap
    decision_rule = ""                  # how outputs become predictions, where it is a setting

    @property
    def plotted(self) -> tuple[str, ...]:
        """Headline scores on one axis (a correlation or F1, not an error in the target's unit)."""
        return tuple(k for k in self.headline if k not in LOWER_IS_BETTER)

    # -- reading ------------------------------------------------------------------------------
    def label_values(self, cell: str | list[str]) -> list[str]:
        """The label values one target cell names (as written in the file)."""
        raise NotImplementedError

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        """Targets of these rows: an array whose first dimension is the row."""
        raise NotImplementedError

    def output_size(self, label_names: Sequence[str]) -> int:
        return len(label_names)

    # -- training and evaluation --------------------------------------------------------------
    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        """The training loss; `class_weights` (one per class) and `label_smoothing` where the kind
        has them (`[train]` keys of those names), else a ConfigError."""
        raise NotImplementedError

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """What evaluation keeps of the logits (float32, one row per example)."""
        raise NotImplementedError

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        raise NotImplementedError

    def is_better(self, metric: str, new: float, old: float | None, best_is: str = "auto") -> bool:
        """Whether `new` beats the best so far, `old` (None: none yet). An undefined score (NaN:
        a collapsed model's correlation) is never the better one, not even the first."""
        if isinstance(new, float) and math.isnan(new):
            return False
        if old is None or (isinstance(old, float) and math.isnan(old)):
            return True
        lower = best_is == "lower" or (best_is == "auto" and metric in LOWER_IS_BETTER)
        return new < old if lower else new > old

    def summary(self, metrics: dict[str, Any], also: str = "") -> str:
        """'accuracy 0.9120, macro-F1 0.9034, loss 0.2710': the headline metrics, `also` (the
        metric that picks the best model, e.g. MRPC's f1) and the loss."""
        shown = [k for k in dict.fromkeys((*self.headline, also, "loss")) if k in metrics]
        return ", ".join(f"{metric_label(k)} {metrics[k]:.4f}" for k in shown)

    def check_metric(self, metric: str, source: str, label_names: Sequence[str] = ()) -> None:
        """`metric` (metric_for_best) is one this kind computes, for these labels where known."""
        if metric not in (*self.metric_names, "loss"):
            raise ConfigError(f"{source}: [train] metric_for_best = {metric!r} is not a metric of "
                              f"{self.name} tasks ([data] kind); choose one of "
                              f"{', '.join(self.metric_names)}, loss")

    def check_labels(self, label_names: Sequence[str], source: str) -> None:
        """The task's labels (configured or found in the train rows) make a task of this kind."""

    def check(self, label_names: Sequence[str], metric: str, source: str) -> None:
        """Before training: the labels, and `metric` (metric_for_best; '': not checked, e.g. one
        that a user's own metric function may give)."""
        self.check_labels(label_names, source)
        if metric:
            self.check_metric(metric, source, label_names)

    # -- predictions for people ---------------------------------------------------------------
    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        """One row of `predict`'s output."""
        raise NotImplementedError


def per_class_scores(truth: np.ndarray, guess: np.ndarray, label_names: Sequence[str]) -> dict:
    """Precision, recall, F1 and support of each class, by name (the report's per-class table)."""
    from sklearn.metrics import precision_recall_fscore_support

    ids = list(range(len(label_names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        truth, guess, labels=ids, zero_division=0)
    return {name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(label_names, precision, recall, f1, support, strict=True)}



def written_values(ids: dict[str, int]) -> list[str]:
    """A label vocabulary's values in id order, each as written in files (the first key of its id)."""
    names = {}
    for key, i in ids.items():
        names.setdefault(i, key)
    return [names[i] for i in sorted(names)]


class LabelIds(dict):
    """Label as written in files -> id, and where the labels came from: the task's own, or
    (`learned_from`) those of the train file, where the task names none."""

    learned_from = ""


def unknown_label(ids: dict[str, int]) -> tuple[str, str]:
    """How a label that is not in `ids` is said: what it is not one of, and the cure."""
    learned = getattr(ids, "learned_from", "")
    if learned:  # a class named in the task would have no train rows
        return (f"is not in the train file ({learned}), whose labels {written_values(ids)} the "
                "task takes, as it names none", "fix the row, or give the train file rows of it")
    return (f"is not one of the task's labels {written_values(ids)}",
            f"fix the row, or add it to the labels ({ADD_LABEL})")
