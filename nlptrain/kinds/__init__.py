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

Each kind is a class in a module of its own, following `base.TaskKind`; a new kind is a new
module and an entry in `KINDS` (and `from_task`, `from_model_config` where it has settings).
"""

from __future__ import annotations

from typing import Any

from nlptrain.errors import ConfigError
from nlptrain.kinds.base import LOWER_IS_BETTER, TaskKind
from nlptrain.kinds.multi_label import MultiLabel
from nlptrain.kinds.regression import Regression
from nlptrain.kinds.single_label import SingleLabel

__all__ = ["KINDS", "LOWER_IS_BETTER", "MultiLabel", "Regression", "SingleLabel", "TaskKind",
           "from_model_config", "from_run_config", "from_task", "label_names_of", "record_kind"]

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
