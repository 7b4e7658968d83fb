"""Task kinds: what a row's target is, and everything that follows from it.

A kind owns the part of a task that depends on the shape of its target: how a label cell of a
file becomes a target array, the model's head (`problem_type`, output size), the loss, how logits
become outputs (probabilities or scores), the metrics, and which direction of each metric is
better. Nothing else in nlptrain asks what kind a task is: the loop, evaluation, reports and plots
call these methods. A text pair is not a kind: it is an input option of any kind (STS-B is a pair
with a regression target, MRPC a pair with a single label).

- `SingleLabel`: one class per row; softmax, cross-entropy; accuracy, macro-F1, Matthews
  correlation, binary F1 (GLUE's CoLA and MRPC metrics).
- `MultiLabel`: any number of classes per row (multi-hot); sigmoid, BCE; micro/macro-F1 and
  subset accuracy at `threshold`.
- `Regression`: one real score per row; MSE; Pearson, Spearman, MSE, MAE.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nlptrain.errors import ConfigError, DataError
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


def _per_class(truth: np.ndarray, guess: np.ndarray, label_names: Sequence[str]) -> dict:
    from sklearn.metrics import precision_recall_fscore_support

    ids = list(range(len(label_names)))
    precision, recall, f1, support = precision_recall_fscore_support(
        truth, guess, labels=ids, zero_division=0)
    return {name: {"precision": float(p), "recall": float(r), "f1": float(f), "support": int(s)}
            for name, p, r, f, s in zip(label_names, precision, recall, f1, support, strict=True)}


class SingleLabel(TaskKind):
    name = "single_label"
    problem_type = "single_label_classification"
    default_metric = "accuracy"
    metric_names = ("accuracy", "macro_f1", "mcc", "f1")
    headline = ("accuracy", "macro_f1")

    def label_values(self, cell: str | list[str]) -> list[str]:
        return [cell] if isinstance(cell, str) else list(cell)

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        out = np.empty(len(cells), dtype=np.int64)
        for i, cell in enumerate(cells):
            if isinstance(cell, list):  # a JSON list: "['neg'] is not one of ['neg', ...]" misleads
                path, line = where(i)
                raise DataError(f"{path}:{line}: a list of labels {cell!r}, but the task is "
                                "single_label (one label a row); give one label, or set [data] "
                                "kind = \"multi_label\"")
            if not isinstance(cell, str) or cell not in ids:
                path, line = where(i)
                quoted = isinstance(cell, str) and len(cell) > 1 and cell[0] == cell[-1] == '"' \
                    and cell[1:-1].replace('""', '"') in ids  # a TSV's cells in CSV quotes
                fix = ("the file quotes its cells as CSV does: give --quoted (quoted = true in the "
                       "task's [data])") if quoted else f"fix the row, or add it to the labels ({ADD_LABEL})"
                raise DataError(f"{path}:{line}: label {cell!r} is not one of the task's labels "
                                f"{_values(ids)}; {fix}")
            out[i] = ids[cell]
        return out

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        import torch.nn.functional as F

        if targets.is_floating_point():  # (torch: "expected scalar type Long")
            raise DataError(f"single-label targets are class ids (integers), not {targets.dtype}; "
                            "scores train as a regression (kind=Regression())")
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1).long(),
                               weight=class_weights, label_smoothing=label_smoothing)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().softmax(dim=-1)

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        # Imported here: scikit-learn costs ~1 s at start-up, before the first training step.
        from sklearn.metrics import accuracy_score, confusion_matrix, f1_score, matthews_corrcoef

        ids = list(range(len(label_names)))
        truth, guess = targets, outputs.argmax(axis=1)
        picked = np.clip(truth, 0, None)
        loss = -np.log(np.clip(outputs[np.arange(len(truth)), picked], 1e-12, None)).mean()
        found = {
            "rows": int(len(truth)),
            "correct": int((truth == guess).sum()),
            "accuracy": float(accuracy_score(truth, guess)),
            # Over the labels present in the truth or the predictions, as scikit-learn's default:
            # a class that the set lacks and no row is given is not an F1 of 0.
            "macro_f1": float(f1_score(truth, guess, average="macro", zero_division=0)),
            "mcc": float(matthews_corrcoef(truth, guess)),
            "loss": float(loss),
        }
        if len(label_names) == 2:  # GLUE's F1 (MRPC, QQP): of the second label, e.g. 'equivalent'
            found["f1"] = float(f1_score(truth, guess, pos_label=1, average="binary", zero_division=0))
        found["per_class"] = _per_class(truth, guess, label_names)
        found["confusion_matrix"] = confusion_matrix(truth, guess, labels=ids).tolist()
        return found

    def check_metric(self, metric: str, source: str, label_names: Sequence[str] = ()) -> None:
        super().check_metric(metric, source)
        if metric == "f1" and label_names and len(label_names) != 2:
            raise ConfigError(f"{source}: [train] metric_for_best = 'f1' is the binary F1 of the "
                              f"second label, for two labels; this task has {len(label_names)}: "
                              "use macro_f1")

    def check_labels(self, label_names: Sequence[str], source: str) -> None:
        # Cross-entropy over one class is 0 whatever the model says: nothing would be learnt,
        # and every evaluation would score 1.0.
        if len(label_names) < 2:
            raise ConfigError(f"{source}: a single_label task needs two labels or more; it has "
                              f"{len(label_names)}: {', '.join(map(repr, label_names)) or 'none'} "
                              "(check [data] label_column and the train rows' labels)")

    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        best = int(output.argmax())
        return {"label": label_names[best], "probability": float(output[best])}


class MultiLabel(TaskKind):
    name = "multi_label"
    problem_type = "multi_label_classification"
    empty_label_ok = True  # a row may have none of the labels (e.g. a comment not toxic at all)
    default_metric = "micro_f1"
    metric_names = ("micro_f1", "macro_f1", "subset_accuracy")
    headline = ("micro_f1", "macro_f1", "subset_accuracy")

    def __init__(self, separator: str = ",", threshold: float = 0.5) -> None:
        self.separator, self.threshold = separator, threshold
        self.decision_rule = (f"a label is predicted where its probability is at least {threshold:g}"
                              " (`[data] threshold`); the metrics are at that threshold")

    def check_labels(self, label_names: Sequence[str], source: str) -> None:
        # A head of 0 outputs: its loss, a mean over nothing, is NaN at the first step.
        if not label_names:
            raise ConfigError(f"{source}: a multi_label task needs one label or more; no train "
                              "row has a label (check [data] label_column, or name [data] labels)")

    def label_values(self, cell: str | list[str]) -> list[str]:
        if isinstance(cell, list):
            return [str(v).strip() for v in cell]
        return [v.strip() for v in cell.split(self.separator) if v.strip()] if self.separator \
            else [cell.strip()]

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        out = np.zeros((len(cells), len(set(ids.values()))), dtype=np.float32)
        for i, cell in enumerate(cells):
            for value in self.label_values(cell):
                if value not in ids:
                    path, line = where(i)
                    raise DataError(f"{path}:{line}: label {value!r} (in {cell!r}) is not one of "
                                    f"the task's labels {_values(ids)}; fix the row, or add it to "
                                    f"the labels ({ADD_LABEL})")
                out[i, ids[value]] = 1.0
        return out

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        """BCE; `class_weights` are BCE's `pos_weight`: the weight of each label's positives."""
        import torch.nn.functional as F

        if label_smoothing:
            raise ConfigError("[train] label_smoothing is for single_label tasks, not multi_label")
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), pos_weight=class_weights)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().sigmoid()

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        from sklearn.metrics import accuracy_score, f1_score, multilabel_confusion_matrix

        truth = targets.astype(np.int64)
        guess = (outputs >= self.threshold).astype(np.int64)
        p = np.clip(outputs, 1e-7, 1 - 1e-7)
        loss = -(truth * np.log(p) + (1 - truth) * np.log(1 - p)).mean() if len(truth) else 0.0
        ids = list(range(len(label_names)))
        if truth.shape[1] == 1:  # scikit-learn reads one column as binary targets, not one label:
            truth, guess = (np.hstack([a, np.zeros_like(a)]) for a in (truth, guess))  # scored on ids
        # Macro over the labels in truth or predictions, as single-label's (an absent one: no 0)
        present = [i for i in ids if truth[:, i].any() or guess[:, i].any()] or ids
        # accuracy_score on multi-hot rows is subset accuracy: every label of the row right.
        found = {
            "rows": int(len(truth)),
            "micro_f1": float(f1_score(truth, guess, labels=ids, average="micro", zero_division=0)),
            "macro_f1": float(f1_score(truth, guess, labels=present, average="macro", zero_division=0)),
            "subset_accuracy": float(accuracy_score(truth, guess)),
            "loss": float(loss),
            "threshold": self.threshold,
        }
        found["per_class"] = _per_class(truth, guess, label_names)
        # Per label [[TN, FP], [FN, TP]]: what a confusion matrix means for independent labels.
        found["label_confusion"] = multilabel_confusion_matrix(truth, guess, labels=ids).tolist()
        return found

    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        chosen = [i for i in np.argsort(-output) if output[i] >= self.threshold]
        return {"labels": [label_names[i] for i in chosen],
                "label_probabilities": [float(output[i]) for i in chosen]}


class Regression(TaskKind):
    name = "regression"
    problem_type = "regression"
    default_metric = "pearson"
    metric_names = ("pearson", "spearman", "mse", "mae")
    headline = ("pearson", "spearman", "mse")
    has_classes = False

    def label_values(self, cell: str | list[str]) -> list[str]:
        return []

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        out = np.empty(len(cells), dtype=np.float32)
        for i, cell in enumerate(cells):
            try:
                # (Python reads "1_000" as 1000: a data file's number holds no underscore)
                score = float(cell) if isinstance(cell, str) and "_" not in cell else math.nan
            except ValueError:
                score = math.nan
            spelt_infinite = str(cell).strip().lstrip("+-").lower() in ("inf", "infinity")
            if math.isnan(score) or spelt_infinite:  # (1e400 overflows to inf: out of range)
                path, line = where(i)
                raise DataError(f"{path}:{line}: score {cell!r} is not a number; a regression "
                                "task needs a number in the label column")
            if abs(score) > FLOAT32_MAX:  # trained in float32: it would be inf
                path, line = where(i)
                raise DataError(f"{path}:{line}: score {cell!r} is beyond float32's range "
                                f"(±{FLOAT32_MAX:.3g}); rescale the scores")
            out[i] = score
        return out

    def output_size(self, label_names: Sequence[str]) -> int:
        return 1

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        import torch.nn.functional as F

        if class_weights is not None or label_smoothing:
            raise ConfigError("[train] class_weights and label_smoothing are for classes; a "
                              "regression task has none")
        # In float32: bf16 targets would train 3.8 as 3.796875 (autocast computes it in fp32).
        return F.mse_loss(logits.float().view(-1), targets.float().view(-1))

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().view(-1, 1)

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        from scipy.stats import pearsonr, spearmanr
        from sklearn.metrics import mean_absolute_error, mean_squared_error

        guess, truth = outputs.reshape(-1).astype(np.float64), targets.astype(np.float64)
        scored = len(truth) > 0 and bool(np.isfinite(guess).all())  # (else scikit-learn raises)
        # A constant prediction has no correlation: NaN, as scipy says, which is never a better
        # score (a 0 beat every negative one, and a collapsed model became the best).
        correlated = scored and len(truth) > 1 and np.ptp(guess) > 0 and np.ptp(truth) > 0
        mse = float(mean_squared_error(truth, guess)) if scored else math.nan
        return {
            "rows": int(len(truth)),
            "pearson": float(pearsonr(truth, guess).statistic) if correlated else math.nan,
            "spearman": float(spearmanr(truth, guess).statistic) if correlated else math.nan,
            "mse": mse,
            "mae": float(mean_absolute_error(truth, guess)) if scored else math.nan,
            "loss": mse,
        }

    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        return {"score": float(output[0])}


KINDS = {kind.name: kind for kind in (SingleLabel, MultiLabel, Regression)}


def from_task(task: Any) -> TaskKind:
    """The kind a task file asks for (`[data] kind`, `label_separator`, `threshold`)."""
    data = task.data
    if data.kind == "multi_label":
        return MultiLabel(data.label_separator, data.threshold)
    return KINDS[data.kind]()


def from_run_config(config: dict[str, Any]) -> TaskKind:
    """The kind of a finished run, from its config.json (older runs: single-label)."""
    data = config.get("task", {}).get("data", {})
    name = data.get("kind", "single_label")
    if name == "multi_label":
        return MultiLabel(data.get("label_separator", ","), data.get("threshold", 0.5))
    return KINDS.get(name, SingleLabel)()


def from_model_config(config: Any) -> TaskKind:
    """The kind a saved `transformers` model was trained for (its `problem_type`)."""
    problem = getattr(config, "problem_type", None)
    if problem == "multi_label_classification":
        return MultiLabel(threshold=float(getattr(config, "nlptrain_threshold", 0.5)))
    # No problem_type: transformers' own rule (a classifier's forward): one output is a regression.
    if problem == "regression" or (problem is None and getattr(config, "num_labels", 2) == 1):
        return Regression()
    return SingleLabel()


def record_kind(config: Any, kind: TaskKind) -> None:
    """Write `kind` into a transformers config (`problem_type`, a multi-label threshold): the
    export then loads and predicts as the model trained, whatever the config said before."""
    config.problem_type = kind.problem_type
    if isinstance(kind, MultiLabel):
        config.nlptrain_threshold = kind.threshold  # saved in config.json, for predict


def _values(ids: dict[str, int]) -> list[str]:
    names = {}
    for key, i in ids.items():
        names.setdefault(i, key)  # the first key of each id: the value as written in files
    return [names[i] for i in sorted(names)]


def label_names_of(model_config: Any, kind: TaskKind | None = None) -> list[str]:
    """The label names of a transformers model's config (`id2label`), in id order; a regression
    of a model without one has its one output, the score."""
    if (model_config is None or not hasattr(model_config, "id2label")) \
            and isinstance(kind, Regression):
        return ["score"]
    if model_config is None or not hasattr(model_config, "id2label"):
        raise ConfigError("the model has no transformers config with id2label: pass "
                          "label_names=[...] (and kind=) to the trainer")
    return [model_config.id2label[i] for i in range(model_config.num_labels)]
