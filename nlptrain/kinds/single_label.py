"""One class per row: softmax, cross-entropy; accuracy, macro-F1, Matthews correlation, binary F1."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds.base import TaskKind, Where, per_class_scores, unknown_label

if TYPE_CHECKING:
    import torch



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
                not_one_of, cure = unknown_label(ids)
                fix = ("the file quotes its cells as CSV does: give --quoted (quoted = true in the "
                       "task's [data])") if quoted else cure
                raise DataError(f"{path}:{line}: label {cell!r} {not_one_of}; {fix}")
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

