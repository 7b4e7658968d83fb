"""Any number of classes per row (multi-hot): sigmoid, BCE; micro/macro-F1, subset accuracy at a threshold."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds.base import TaskKind, Where, per_class_scores, unknown_label

if TYPE_CHECKING:
    import torch



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
                    not_one_of, cure = unknown_label(ids)
                    raise DataError(f"{path}:{line}: label {value!r} (in {cell!r}) {not_one_of}; {cure}")
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
        found["per_class"] = per_class_scores(truth, guess, label_names)
        # Per label [[TN, FP], [FN, TP]]: what a confusion matrix means for independent labels.
        found["label_confusion"] = multilabel_confusion_matrix(truth, guess, labels=ids).tolist()
        return found

    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        chosen = [i for i in np.argsort(-output) if output[i] >= self.threshold]
        return {"labels": [label_names[i] for i in chosen],
                "label_probabilities": [float(output[i]) for i in chosen]}

