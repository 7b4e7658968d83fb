"""The protocol every task kind follows (see the package's docstring), and what kinds share."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nlptrain.errors import ConfigError, DataError
from nlptrain.scores import metric_label

if TYPE_CHECKING:  # numpy and torch are imported where used: --help builds its texts from KINDS
    import numpy as np
    import torch

# Metrics where a smaller value is better; every other metric is better when larger, unless
# [train] best_is says otherwise (a user's own error metric).
LOWER_IS_BETTER = frozenset({"loss", "mse", "mae"})
FLOAT32_MAX = 3.4028234663852886e+38  # float(np.finfo(np.float32).max)
ADD_LABEL = "[data] labels in a task file, label_names= in Python"  # where the labels are named
Where = Callable[[int], tuple[str, int]]  # row number -> (file, line), for error messages
IGNORED_TARGET = -100  # cross-entropy's ignore_index: a row (a token) the loss leaves out


class TaskKind:
    """The protocol every kind follows (and the single-label behaviour shared by default)."""

    name = ""
    problem_type = ""
    default_metric = ""
    metric_names: tuple[str, ...] = ()  # what `metrics` returns as scalars; metric_for_best picks one
    headline: tuple[str, ...] = ()      # the few metrics that logs, reports and plots show
    has_classes = True                  # per-class table and label vocabulary (False: one output, a score)
    empty_label_ok = False              # an empty label cell is a row's labels (none), not a gap
    multi_hot = False                   # targets are 0/1 rows, a column a label (a dataset may give them so)
    decision_rule = ""                  # how outputs become predictions, where it is a setting
    output_names: tuple[str, ...] = ()  # the outputs' names where the kind fixes them (a score)
    # What help texts say of the kind: a target (`[data] kind`), its metrics (`eval --help`), and
    # what `[train] class_weights` are to its loss.
    described = ""
    metrics_described = ""
    class_weights_described = ""
    metric_notes: Mapping[str, str] = {}  # a metric's condition, for metric_for_best's help
    settings: tuple[str, ...] = ()      # the [data] keys it reads (from_settings); others' are refused
    takes_class_weights = False         # [train] class_weights: a weight per class (or label)
    takes_label_smoothing = False       # [train] label_smoothing
    # transformers allows three problem_types: a kind sharing another's records its own name too.
    names_itself = False

    # -- settings, and what a model's config records ------------------------------------------
    @classmethod
    def from_settings(cls, data: Mapping[str, Any]) -> TaskKind:
        """The kind with the settings of a task's [data] (or a run's config.json: its keys may be
        missing, the defaults then)."""
        return cls()

    @classmethod
    def recorded_in(cls, config: Any) -> TaskKind | None:
        """This kind as `record_into` wrote it into a transformers config; None: not this kind."""
        if getattr(config, "nlptrain_kind", cls.name) != cls.name:
            return None
        return cls() if getattr(config, "problem_type", None) == cls.problem_type else None

    def record_into(self, config: Any) -> None:
        """Write the kind into a transformers config: the export then loads and predicts as the
        model trained, whatever the config said before."""
        config.problem_type = self.problem_type
        if self.names_itself:
            config.nlptrain_kind = self.name
        elif hasattr(config, "nlptrain_kind"):  # trained before as a kind that names itself
            del config.nlptrain_kind

    @classmethod
    def check_fine_tuning(cls, class_weights: bool, label_smoothing: float, source: str = "") -> None:
        """`[train] class_weights` (given: True) and `label_smoothing`, refused where this kind's
        loss takes none (`takes_class_weights`, `takes_label_smoothing`)."""
        from nlptrain.kinds import KINDS  # (the registry imports this module)

        said = f"{source}: " if source else ""
        if class_weights and not cls.takes_class_weights:
            if not cls.has_classes:
                raise ConfigError(f"{said}[train] class_weights is for classes; a {cls.name} task "
                                  "has none")
            takers = " or ".join(k.name for k in KINDS.values() if k.takes_class_weights)
            raise ConfigError(f"{said}[train] class_weights is for {takers} tasks, not {cls.name}")
        if label_smoothing and not cls.takes_label_smoothing:
            takers = " or ".join(k.name for k in KINDS.values() if k.takes_label_smoothing)
            raise ConfigError(f"{said}[train] label_smoothing is for {takers} tasks, not {cls.name}")

    def cache_key(self) -> list[Any]:
        """What of the kind a token cache's key holds: its targets are encoded by it. (The value
        is part of existing caches' keys: [name, the multi-label separator or None].)"""
        return [self.name, None]

    def scoring_change(self, trained: TaskKind) -> str:
        """What an evaluation should say where it scores with other settings than `trained`
        (the model's kind, of the same name) had; "" where none."""
        return ""

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

    def check_logits(self, logits: torch.Tensor, label_names: Sequence[str]) -> None:
        """Refuse logits of another shape than (rows, `output_size`): a user's own model, built
        for another task, whose loss or metrics would fail in torch or numpy, or be wrong."""
        width = self.output_size(label_names)
        if logits.ndim != 2 or logits.shape[-1] != width:  # torch's error names sizes alone
            what = f"{len(label_names)} labels" if self.has_classes else "one score a row"
            gives = f"{logits.shape[-1]} output(s) a row," if logits.ndim == 2 else \
                f"logits of shape {tuple(logits.shape)}, not (rows, outputs),"
            raise ConfigError(f"the model gives {gives} but this {self.name} task needs {width} "
                              f"({what}); build its head with {width} output(s)")

    def check_targets(self, targets: np.ndarray, label_names: Sequence[str], where: str) -> None:
        """Targets a user gave (a TokenizedDataset's, a list of rows'), as numbers and not empty:
        of the kind's shape, refused now rather than as a torch error in the first step (none by
        default)."""

    def batch_targets_problem(self, targets: torch.Tensor, rows: torch.Tensor,
                              label_names: Sequence[str]) -> str | None:
        """What the loss would fail on, or train on wrongly, in a batch's finite `targets` (`rows`:
        them, a row each) from a user's loader; None where nothing is."""
        return None

    # -- training and evaluation --------------------------------------------------------------
    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        """The training loss; `class_weights` (one per class) and `label_smoothing` where the kind
        has them (`[train]` keys of those names), else a ConfigError."""
        raise NotImplementedError

    def balanced_weights(self, targets: np.ndarray, label_names: Sequence[str]) -> np.ndarray:
        """`[train] class_weights = "balanced"`: weights from the training targets that make every
        class weigh the same (a kind that `takes_class_weights`)."""
        raise NotImplementedError

    def check_class_weights(self, weights: Sequence[float], label_names: Sequence[str]) -> None:
        """`[train] class_weights` given as numbers, one a label: refused where the loss cannot
        take them (none by default)."""

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        """What evaluation keeps of the logits (float32, one row per example)."""
        raise NotImplementedError

    def consistency_loss(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """How far apart two forward passes' logits are (R-Drop's term): a symmetric divergence
        between the outputs they mean, averaged over rows."""
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

    def usage(self, text: str, pairs: bool, label_names: Sequence[str]) -> list[str]:
        """The model card's lines that call a transformers pipeline `classify` on `text` (a
        Python literal: a string, or a dict of a pair), and say what it gives."""
        raise NotImplementedError


def per_class_scores(truth: np.ndarray, guess: np.ndarray, label_names: Sequence[str]) -> dict:
    """Precision, recall, F1 and support of each class, by name (the report's per-class table)."""
    from sklearn.metrics import precision_recall_fscore_support

    ids = list(range(len(label_names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        truth, guess, labels=ids, zero_division=0)
    return {name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(label_names, precision, recall, f1, support, strict=True)}


def unseen_labels_error(missing: Sequence[str]) -> ConfigError:
    """class_weights = 'balanced' where a label has no training row (its weight would be inf)."""
    return ConfigError(f"[train] class_weights = 'balanced': no training row has the label(s) "
                       f"{list(missing)}; give the weights as a list instead")


def check_class_targets(targets: np.ndarray, label_names: Sequence[str], where: str) -> None:
    """Class ids within the labels (a single-label row), or one column a label (multi-label)."""
    count = len(label_names)
    if targets.ndim == 2 and targets.shape[1] != count:
        raise DataError(f"{where}: its rows have {targets.shape[1]} label columns, the model "
                        f"{count} labels ({', '.join(map(str, label_names))})")
    if targets.ndim == 1 and targets.size:
        import numpy as np

        bad = np.flatnonzero((targets < 0) | (targets >= count))
        if bad.size:
            raise DataError(f"{where}: row index {bad[0]} has class id {targets[bad[0]]}, but the "
                            f"model has {count} labels ({', '.join(map(str, label_names))}): "
                            f"ids 0 to {count - 1}")


def symmetric_kl(first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
    """(KL(p||q) + KL(q||p)) / 2 between two log-distributions over the last dimension (summed
    over it and any other beyond the row's), averaged over rows."""
    import torch.nn.functional as F

    p_q = F.kl_div(second, first, log_target=True, reduction="none").sum(dim=-1)  # KL(p || q)
    q_p = F.kl_div(first, second, log_target=True, reduction="none").sum(dim=-1)  # KL(q || p)
    rows = (p_q + q_p) / 2
    return rows.reshape(rows.shape[0], -1).sum(dim=-1).mean()


def bernoulli_logs(logits: torch.Tensor) -> torch.Tensor:
    """Each logit as a Bernoulli's log p and log (1 - p), on a last dimension of two."""
    import torch
    import torch.nn.functional as F

    return torch.stack([F.logsigmoid(logits), F.logsigmoid(-logits)], dim=-1)


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
