"""Task kinds: what a row's target is, and everything that follows from it.

A kind owns the part of a task that depends on the shape of its target: how a label cell of a
file becomes a target array, the model's head (`problem_type`, output size), the loss, how logits
become outputs (probabilities or scores), the metrics, and which direction of each metric is
better; also its `[data]` settings, what it records in a transformers config, the checks of the
targets a user gives, which `[train]` loss options it takes, R-Drop's consistency term and the
model card's usage lines. Nothing else in nlptrain asks what kind a task is: the loop,
evaluation, reports and plots call these methods, and the help texts and choices are built from
`KINDS`. A text pair is not a kind: it is an input option of any kind (STS-B is a pair with a
regression target, MRPC a pair with a single label).

- `SingleLabel`: one class per row; softmax, cross-entropy; accuracy, macro-F1, Matthews
  correlation, binary F1 (GLUE's CoLA and MRPC metrics).
- `MultiLabel`: any number of classes per row (multi-hot); sigmoid, BCE; micro/macro-F1 and
  subset accuracy at `threshold`.
- `Regression`: one real score per row; MSE; Pearson, Spearman, MSE, MAE.

Each kind is a class in a module of its own, following `base.TaskKind`; a new kind is a new
module and an entry in `KINDS`. (A setting of its own, a `[data]` key, is a field of
`config.DataConfig` that it names in `settings`.)
"""

from __future__ import annotations

from typing import Any

from nlptrain.errors import ConfigError
from nlptrain.kinds.base import LOWER_IS_BETTER, TaskKind
from nlptrain.kinds.multi_label import MultiLabel
from nlptrain.kinds.regression import Regression
from nlptrain.kinds.single_label import SingleLabel

__all__ = ["DEFAULT", "KINDS", "LOWER_IS_BETTER", "MultiLabel", "Regression", "SingleLabel",
           "TaskKind", "from_model_config", "from_run_config", "from_task", "label_names_of",
           "record_kind"]

# Name -> kind, in the order help texts list them. Read when used (never copied): a kind
# registered later, e.g. by a test, is a choice of `[data] kind` too.
KINDS: dict[str, type[TaskKind]] = {kind.name: kind for kind in (SingleLabel, MultiLabel, Regression)}
DEFAULT = SingleLabel  # a run or a model that names no kind (older runs, a plain classifier)


def from_task(task: Any) -> TaskKind:
    """The kind a task file asks for (`[data] kind`, and the settings it reads there)."""
    return KINDS[task.data.kind].from_settings(vars(task.data))


def from_run_config(config: dict[str, Any]) -> TaskKind:
    """The kind of a finished run, from its config.json (older runs: single-label)."""
    data = config.get("task", {}).get("data", {})
    return KINDS.get(data.get("kind", DEFAULT.name), DEFAULT).from_settings(data)


def from_model_config(config: Any) -> TaskKind:
    """The kind a saved `transformers` model was trained for (its `problem_type`, and the name a
    kind that shares one records)."""
    named = getattr(config, "nlptrain_kind", None)
    if named is not None and named not in KINDS:  # else read as another kind: a softmax on its head
        raise ConfigError(f"the model was trained as a task of kind {named!r} (nlptrain_kind in "
                          "its config.json), which is not registered here: add its class to "
                          "nlptrain.kinds.KINDS before loading the model")
    for kind in KINDS.values():
        found = kind.recorded_in(config)
        if found is not None:
            return found
    return DEFAULT()


def record_kind(config: Any, kind: TaskKind) -> None:
    """Write `kind` into a transformers config (`problem_type`, a multi-label threshold, the name
    of a kind that shares its problem_type with another, `nlptrain_kind`): the export then loads
    and predicts as the model trained, whatever the config said before."""
    kind.record_into(config)


def label_names_of(model_config: Any, kind: TaskKind | None = None) -> list[str]:
    """The label names of a transformers model's config (`id2label`), in id order; a kind whose
    outputs have names of their own (a regression's score) has them without one."""
    if (model_config is None or not hasattr(model_config, "id2label")) \
            and kind is not None and kind.output_names:
        return list(kind.output_names)
    if model_config is None or not hasattr(model_config, "id2label"):
        raise ConfigError("the model has no transformers config with id2label: pass "
                          "label_names=[...] (and kind=) to the trainer")
    return [model_config.id2label[i] for i in range(model_config.num_labels)]
