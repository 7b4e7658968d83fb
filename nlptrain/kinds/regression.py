"""One real score per row: MSE loss; Pearson, Spearman, MSE, MAE."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from nlptrain.errors import DataError
from nlptrain.kinds.base import FLOAT32_MAX, TaskKind, Where

if TYPE_CHECKING:
    import numpy as np
    import torch


class Regression(TaskKind):
    name = "regression"
    problem_type = "regression"
    default_metric = "pearson"
    metric_names = ("pearson", "spearman", "mse", "mae")
    headline = ("pearson", "spearman", "mse")
    has_classes = False
    output_names = ("score",)
    described = "a number"
    metrics_described = "Pearson, Spearman, MSE, MAE"

    @classmethod
    def recorded_in(cls, config: Any) -> Regression | None:
        if getattr(config, "nlptrain_kind", cls.name) != cls.name:
            return None
        problem = getattr(config, "problem_type", None)
        # No problem_type: transformers' own rule (a classifier's forward): one output is a regression.
        if problem == cls.problem_type or (problem is None and getattr(config, "num_labels", 2) == 1):
            return cls()
        return None

    def label_values(self, cell: str | list[str]) -> list[str]:
        return []

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        import numpy as np

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

    def check_targets(self, targets: np.ndarray, label_names: Sequence[str], where: str) -> None:
        import numpy as np

        bad = np.flatnonzero(~np.isfinite(targets.astype(np.float64)).reshape(len(targets), -1)
                             .all(axis=1))
        if bad.size:
            raise DataError(f"{where}: row index {bad[0]} has the score {targets[bad[0]]}, "
                            "not a finite number; drop the row or give it its score")

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        import torch.nn.functional as F

        self.check_fine_tuning(class_weights is not None, label_smoothing)
        # In float32: bf16 targets would train 3.8 as 3.796875 (autocast computes it in fp32).
        return F.mse_loss(logits.float().view(-1), targets.float().view(-1))

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().view(-1, 1)

    def consistency_loss(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        """The mean squared difference of the two scores."""
        import torch.nn.functional as F

        return F.mse_loss(first.float(), second.float())

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        import numpy as np
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

    def usage(self, text: str, pairs: bool, label_names: Sequence[str]) -> list[str]:
        # One output, the score itself; a pair (a dict) gives one dict, a text a list of one.
        found = '{"label": "score", "score": 3.8}'
        return [f'classify({text}, function_to_apply="none", truncation=True)   '
                f'# {found if pairs else f"[{found}]"}']

