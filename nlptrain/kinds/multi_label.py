"""Any number of classes per row (multi-hot): sigmoid, BCE; micro/macro-F1, subset accuracy at a threshold."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds.base import (
    TaskKind,
    Where,
    bernoulli_logs,
    check_class_targets,
    per_class_scores,
    symmetric_kl,
    unknown_label,
    unseen_labels_error,
)

if TYPE_CHECKING:
    import numpy as np
    import torch


class MultiLabel(TaskKind):
    name = "multi_label"
    problem_type = "multi_label_classification"
    empty_label_ok = True  # a row may have none of the labels (e.g. a comment not toxic at all)
    multi_hot = True
    default_metric = "micro_f1"
    metric_names = ("micro_f1", "macro_f1", "subset_accuracy")
    headline = ("micro_f1", "macro_f1", "subset_accuracy")
    described = "any number of classes: a JSON list, or a string split on label_separator"
    metrics_described = "micro/macro-F1 and per label"
    class_weights_described = "BCE pos_weight"
    settings = ("threshold", "label_separator")  # (in the order a task's are checked)
    takes_class_weights = True

    def __init__(self, separator: str = ",", threshold: float = 0.5) -> None:
        self.separator, self.threshold = separator, threshold
        self.decision_rule = (f"a label is predicted where its probability is at least {threshold:g}"
                              " (`[data] threshold`); the metrics are at that threshold")

    @classmethod
    def from_settings(cls, data: Mapping[str, Any]) -> MultiLabel:
        return cls(data.get("label_separator", ","), data.get("threshold", 0.5))

    @classmethod
    def recorded_in(cls, config: Any) -> MultiLabel | None:
        if super().recorded_in(config) is None:
            return None
        return cls(threshold=float(getattr(config, "nlptrain_threshold", 0.5)))

    def record_into(self, config: Any) -> None:
        super().record_into(config)
        config.nlptrain_threshold = self.threshold  # saved in config.json, for predict

    def cache_key(self) -> list[Any]:
        return [self.name, self.separator]

    def scoring_change(self, trained: TaskKind) -> str:
        was = getattr(trained, "threshold", None)
        if was == self.threshold:
            return ""
        return (f"scoring at threshold {self.threshold:g}; the model was trained and tested at "
                f"{was:g} (--threshold {was:g} scores as its run did)")

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
        import numpy as np

        out = np.zeros((len(cells), len(set(ids.values()))), dtype=np.float32)
        for i, cell in enumerate(cells):
            self._check_pieces(cell, where, i)
            named: dict[int, str] = {}  # label id -> how this cell named it
            for value in self.label_values(cell):
                if value not in ids:
                    path, line = where(i)
                    not_one_of, cure = unknown_label(ids)
                    raise DataError(f"{path}:{line}: label {value!r} (in {cell!r}) {not_one_of}; {cure}")
                if ids[value] in named:  # "2,2", or a name and its value ("joy,0"): a typo, unsaid
                    path, line = where(i)
                    again = repr(value) if named[ids[value]] == value else \
                        f"{named[ids[value]]!r} and {value!r}, one label,"
                    raise DataError(f"{path}:{line}: the labels {cell!r} name {again} twice; "
                                    "name each of the row's labels once")
                named[ids[value]] = value
                out[i, ids[value]] = 1.0
        return out

    def _check_pieces(self, cell: str | list[str], where: Where, row: int) -> None:
        """"0,,2", "0," or ",": a label left out between separators (or the cell's separators
        alone) reads as fewer labels, or none, without a word. A wholly empty cell is a row with
        none of the labels."""
        if isinstance(cell, list) or not self.separator.strip() or not cell.strip():
            return  # (with a space for separator, a run of spaces is one)
        if any(not piece.strip() for piece in cell.split(self.separator)):
            path, line = where(row)
            raise DataError(f"{path}:{line}: the labels {cell!r} hold an empty one (a separator "
                            f"{self.separator!r} at an end or twice in a row); list the row's "
                            f"labels as 'a{self.separator}b', or leave the cell empty for none")

    def check_targets(self, targets: np.ndarray, label_names: Sequence[str], where: str) -> None:
        import numpy as np

        if targets.ndim != 2:
            raise DataError(f"{where}: its targets are {targets.ndim}-D ({targets.shape}); a "
                            "multi-label task takes a 0/1 row, one column a label")
        if not np.isin(targets, (0, 1)).all():  # e.g. a -1/+1 encoding
            row = int(np.flatnonzero(~np.isin(targets, (0, 1)).all(axis=1))[0])
            raise DataError(f"{where}: row index {row} has the targets {targets[row].tolist()}; a "
                            "multi-label task takes 0/1 rows (1: the row has that label)")
        if label_names:
            check_class_targets(targets, label_names, where)

    def batch_targets_problem(self, targets: torch.Tensor, rows: torch.Tensor,
                              label_names: Sequence[str]) -> str | None:
        """Multi-hot rows (soft ones too): a column a label, each in [0, 1]."""
        count = len(label_names)
        if targets.ndim != 2 or targets.shape[1] != count:
            return (f"its targets are of shape {tuple(targets.shape)}; the model has {count} "
                    f"labels: one row of {count} a row")
        values = rows.float()
        bad = ((values < 0) | (values > 1)).any(dim=1).nonzero()
        return None if not len(bad) else (
            f"row index {int(bad[0])} has the targets {values[int(bad[0])].tolist()}; a multi-label "
            "target is in [0, 1] (1: the row has that label)")

    def balanced_weights(self, targets: np.ndarray, label_names: Sequence[str]) -> np.ndarray:
        """Each label's negatives / positives: both then weigh the same (BCE's pos_weight)."""
        import numpy as np

        positives = targets.sum(axis=0)
        missing = [label_names[i] for i in np.flatnonzero(positives == 0)]
        if missing:
            raise unseen_labels_error(missing)
        weights = (len(targets) - positives) / np.maximum(positives, 1)
        # A label of every row has no negatives: 0 would weigh its every target 0, and it would
        # never be learned. It keeps weight 1, as without class_weights.
        return np.asarray(np.where(weights == 0, 1.0, weights), dtype=np.float32)

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        """BCE; `class_weights` are BCE's `pos_weight`: the weight of each label's positives."""
        import torch.nn.functional as F

        self.check_fine_tuning(class_weights is not None, label_smoothing)
        return F.binary_cross_entropy_with_logits(logits, targets.to(logits.dtype), pos_weight=class_weights)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().sigmoid()

    def consistency_loss(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The symmetric KL divergence of each label's Bernoulli, summed over labels."""
        return symmetric_kl(bernoulli_logs(first.float()), bernoulli_logs(second.float()))

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        import numpy as np
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
        found["per_class"] = per_class_scores(truth, guess, label_names)
        # Per label [[TN, FP], [FN, TP]]: what a confusion matrix means for independent labels.
        found["label_confusion"] = multilabel_confusion_matrix(truth, guess, labels=ids).tolist()
        return found

    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        import numpy as np

        chosen = [i for i in np.argsort(-output) if output[i] >= self.threshold]
        return {"labels": [label_names[i] for i in chosen],
                "label_probabilities": [float(output[i]) for i in chosen]}

    def usage(self, text: str, pairs: bool, label_names: Sequence[str]) -> list[str]:
        # Independent labels: a sigmoid each, those over the threshold.
        return [f'classify({text}, top_k=None, function_to_apply="sigmoid", truncation=True)',
                "# [{'label': ..., 'score': ...}, ...] for every label; the predicted ones are "
                f"those with score >= {self.threshold:g}"]

