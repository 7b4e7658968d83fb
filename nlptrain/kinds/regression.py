"""One real score per row: MSE loss; Pearson, Spearman, MSE, MAE."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds.base import FLOAT32_MAX, TaskKind, Where

if TYPE_CHECKING:
    import torch



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

