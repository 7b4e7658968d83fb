"""One class per row: softmax, cross-entropy; accuracy, macro-F1, Matthews correlation, binary F1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds.base import (
    IGNORED_TARGET,
    TaskKind,
    Where,
    check_class_targets,
    per_class_scores,
    symmetric_kl,
    unknown_label,
    unseen_labels_error,
)

if TYPE_CHECKING:
    import numpy as np
    import torch


class SingleLabel(TaskKind):
    name = "single_label"
    problem_type = "single_label_classification"
    default_metric = "accuracy"
    metric_names = ("accuracy", "macro_f1", "mcc", "f1")
    headline = ("accuracy", "macro_f1")
    described = "one class a row"
    metrics_described = "accuracy, macro-F1, per-class precision/recall and the confusion matrix"
    class_weights_described = "cross-entropy weights"
    metric_notes = {"f1": "two labels"}
    takes_class_weights = True
    takes_label_smoothing = True

    def label_values(self, cell: str | list[str]) -> list[str]:
        return [cell] if isinstance(cell, str) else list(cell)

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        import numpy as np

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
                not_one_of, cure = unknown_label(ids)
                fix = ("the file quotes its cells as CSV does: give --quoted (quoted = true in the "
                       "task's [data])") if quoted else cure
                raise DataError(f"{path}:{line}: label {cell!r} {not_one_of}; {fix}")
            out[i] = ids[cell]
        return out

    def check_targets(self, targets: np.ndarray, label_names: Sequence[str], where: str) -> None:
        if targets.ndim != 1:
            raise DataError(f"{where}: its targets are {targets.ndim}-D ({targets.shape}); a "
                            "single-label task takes one class id a row")
        if targets.dtype.kind == "f":  # (cross-entropy takes ints)
            raise DataError(f"{where}: its class ids are floats ({targets[0]}, ...); a "
                            "single-label task takes ints 0 to n-1 (e.g. labels.astype(int))")
        if label_names:
            check_class_targets(targets, label_names, where)

    def batch_targets_problem(self, targets: torch.Tensor, rows: torch.Tensor,
                              label_names: Sequence[str]) -> str | None:
        count = len(label_names)
        if targets.is_floating_point():  # class probabilities: the loss's
            return None
        ids = rows.long()  # (uint8 would wrap a count of 256)
        if len(ids) and (ids == IGNORED_TARGET).all():  # cross-entropy's mean over no rows: NaN
            return f"every row's class id is {IGNORED_TARGET} (ignored): the loss has no row to learn from"
        bad = ((ids >= count) | ((ids < 0) & (ids != IGNORED_TARGET))).any(dim=1).nonzero()
        if not len(bad):
            return None
        row = int(bad[0])
        value = next(int(v) for v in ids[row] if v >= count or (v < 0 and v != IGNORED_TARGET))
        return (f"row index {row} has class id {value}, but the model has {count} labels "
                f"({', '.join(map(str, label_names))}): ids 0 to {count - 1}")

    def balanced_weights(self, targets: np.ndarray, label_names: Sequence[str]) -> np.ndarray:
        """scikit-learn's compute_class_weight("balanced"): n_rows / (n_classes * rows of the class)."""
        import numpy as np
        from sklearn.utils.class_weight import compute_class_weight

        classes = np.arange(len(label_names))
        targets = targets[targets >= 0]  # -1: a row without a known label
        missing = [label_names[i] for i in classes if not (targets == i).any()]
        if missing:
            raise unseen_labels_error(missing)
        return np.asarray(compute_class_weight("balanced", classes=classes, y=targets), dtype=np.float32)

    def check_class_weights(self, weights: Sequence[float], label_names: Sequence[str]) -> None:
        # Cross-entropy's mean divides by the batch's weights: a batch of a weight-0 class alone
        # is 0/0, and the run stopped on a "non-finite loss" that no lr or precision cures.
        zero = [name for name, weight in zip(label_names, weights, strict=True) if weight == 0]
        if zero:
            raise ConfigError(f"[train] class_weights = {list(weights)}: weight 0 for "
                              f"{', '.join(map(repr, zero))} makes the loss of a batch of only those "
                              "rows 0/0 (not a number); give a small weight (e.g. 0.01), or leave "
                              "those rows out of the training file")

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

    def consistency_loss(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The symmetric KL divergence of the two softmaxes, summed over classes."""
        return symmetric_kl(first.float().log_softmax(dim=-1), second.float().log_softmax(dim=-1))

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        # Imported here: scikit-learn costs ~1 s at start-up, before the first training step.
        import numpy as np
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
        found["per_class"] = per_class_scores(truth, guess, label_names)
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

    def usage(self, text: str, pairs: bool, label_names: Sequence[str]) -> list[str]:
        # A pair (a dict) gives one dict, a text a list of one.
        found = f'{{"label": "{label_names[0] if label_names else "..."}", "score": ...}}'
        return [f'classify({text}, truncation=True)   # {found if pairs else f"[{found}]"}']

