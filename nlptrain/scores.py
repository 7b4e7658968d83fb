"""The numbers an evaluation gives: which are scores, how they are named on screen, and the one
that picks the best model."""

from __future__ import annotations

import math
import numbers
from typing import Any

from nlptrain.errors import ConfigError


def strict_json(value: Any) -> Any:
    """`value` with each non-finite float (an undefined correlation, a diverged loss) as None:
    strict JSON, which every parser reads (Python's json writes NaN, which most refuse)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [strict_json(item) for item in value]
    return value


def scalar_metrics(metrics: dict[str, Any] | None) -> dict[str, float | None]:
    """The numbers among `metrics` (not counts, per-class tables or matrices), in their order;
    an undefined score (NaN, read back from JSON as None) too: a table shows it as such."""
    return {k: v for k, v in (metrics or {}).items() if (v is None or isinstance(v, int | float))
            and not isinstance(v, bool)
            and k not in ("rows", "correct", "step", "epoch", "threshold")}


def shown_score(value: float | None) -> str:
    """A score as the reports show it: 4 decimals, a count as it is, an undefined one (NaN; null
    in JSON, a correlation of constant predictions) "n/a"."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def best_score(metrics: dict[str, Any], metric: str) -> float:
    """`metrics[metric]`: the score that picks the best model, or an error naming those there are
    (a user's metric misspelt, say)."""
    value = metrics.get(metric)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # a list orders nothing
        said = "is not a number" if metric in metrics else "is not among the evaluation's metrics"
        raise ConfigError(f"metric_for_best = {metric!r} {said}: pick one of "
                          f"{', '.join(scalar_metrics(metrics))}")
    return value


def metric_label(key: str) -> str:
    return {"macro_f1": "macro-F1", "micro_f1": "micro-F1", "f1": "F1", "mcc": "MCC",
            "subset_accuracy": "subset accuracy", "mse": "MSE", "mae": "MAE", "pearson": "Pearson",
            "spearman": "Spearman"}.get(key, key)
