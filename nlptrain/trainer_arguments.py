"""A Trainer's arguments that Python would take wrong without a word, or fail on later with a
message about something else: a task kind's class for an instance, one function for a list of
metrics, a string for a list of label names (a list of its characters); and the defaults that
depend on the model: its kind and labels, its collate, the step that "auto" precision times;
and a fit() again, or an lr, that trains nothing."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from nlptrain import kinds
from nlptrain.config import TrainConfig
from nlptrain.data.hf_datasets import RowList
from nlptrain.data.tokenized import Collator
from nlptrain.errors import ConfigError
from nlptrain.evaluate import compute_metrics, logits_of, model_inputs, predict
from nlptrain.kinds import TaskKind
from nlptrain.loaders import typical_batch
from nlptrain.model_head import fit_head_to_labels
from nlptrain.models import usable_positions
from nlptrain.precision import JobStep
from nlptrain.progress import Progress
from nlptrain.scores import scalar_metrics

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)


def checked_kind(kind: Any) -> Any:
    if isinstance(kind, type):  # TaskKind.check() then lacked an argument
        raise ConfigError(f"kind={kind.__name__} is a class: pass an instance, "
                          f"kind={kind.__name__}()")
    if isinstance(kind, str):  # a task file's spelling: the kind of that name, with its defaults
        name = kind.strip().lower().replace("-", "_")
        if name not in kinds.KINDS:
            raise ConfigError(f"kind={kind!r}: no such kind; give one of {', '.join(kinds.KINDS)}, "
                              "or an instance (e.g. kind=MultiLabel(threshold=0.4))")
        return kinds.KINDS[name]()
    return kind


def listed_metrics(metrics: Any) -> list[Any]:
    if callable(metrics) or not isinstance(metrics, Iterable):
        name = getattr(metrics, "__name__", type(metrics).__name__)
        raise ConfigError(f"metrics= takes a list of functions: metrics=[{name}]")
    return list(metrics)


def listed_label_names(names: Sequence[str] | None) -> list[str] | None:
    if isinstance(names, str):  # list("neg,pos") is 7 labels of one character
        raise ConfigError(f"label_names= takes a list of names, not the string {names!r}: "
                          f"label_names={[n.strip() for n in names.split(',')]}")
    return list(names) if names else None


def default_collate(model: Any, config: TrainConfig) -> Collator:
    """Pads each batch to its longest row (a multiple of `pad_to_multiple_of`), with the model's
    pad id, cut at the positions the model has."""
    if config.padding == "max_length":  # else padded as dynamic, unsaid
        raise ConfigError("padding='max_length' pads to the task's max_length, which a Trainer "
                          "is not given: pass collate=Collator(pad_id, pad_to=MAX_LENGTH)")
    pad_id = getattr(getattr(model, "config", None), "pad_token_id", None) or 0
    return Collator(pad_id, multiple=config.pad_to_multiple_of, limit=usable_positions(model))


def task_of(model: Any, kind: TaskKind | str | None, label_names: Sequence[str] | None
            ) -> tuple[TaskKind, list[str]]:
    """The kind and label names given, else the model's (a transformers config's `problem_type`,
    `id2label`); a kind and names given are written into the model's config: an export predicts
    as it trained, with the names the data's ids meant."""
    model_config = getattr(model, "config", None)
    kind = checked_kind(kind)
    found = kind or kinds.from_model_config(model_config)
    if kind is not None and model_config is not None:
        kinds.record_kind(model_config, kind)
    names = listed_label_names(label_names)
    if names and len(names) == getattr(model_config, "num_labels", None):  # (else the first step
        had = [model_config.id2label[i] for i in range(model_config.num_labels)]  # refuses it)
        fit_head_to_labels(model, had, names)  # its head's rows, in the order of the names
        model_config.id2label = dict(enumerate(names))
        model_config.label2id = {name: i for i, name in enumerate(names)}
    return found, names or kinds.label_names_of(model_config, found)


def job_step_of(model: Any, train_data: Any, collate: Any, config: TrainConfig
                ) -> Callable[[], JobStep | None]:
    """What "auto" precision times on a GPU: the model's forward on a typical batch of the data
    (`batch_size` rows, or as many as `max_tokens` holds)."""
    def job_step() -> JobStep | None:
        batch = typical_batch(train_data, collate, config.batch_size, config.max_tokens)
        forward = lambda b: logits_of(model(**model_inputs(b)))  # noqa: E731
        return None if batch is None else JobStep(model, batch, forward)
    return job_step


def warn_if_the_lr_is_zero(optimizer: Any) -> None:
    """An lr of 0 (`--lr 0`, or an optimizer of the user's made so) changes no weight: a run that
    goes on for hours and ends where it began, unsaid, reads as a model that learned nothing."""
    peaks = [group.get("initial_lr", group.get("lr")) for group in optimizer.param_groups]
    if all(isinstance(lr, int | float) and lr == 0 for lr in peaks):  # (Adafactor's may be None)
        log.warning("lr 0: the optimizer's every parameter group has lr 0, so no weight will "
                    "change; to score a model without training it, use `nlptrain eval` (from "
                    "Python: Trainer.evaluate)")


def warn_if_nothing_to_train(progress: Progress, epochs: int, stopped: bool) -> None:
    """A fit() after one that trained every epoch, or that a callback stopped, trains nothing."""
    if progress.epoch >= epochs:
        log.warning("fit(): this trainer has trained its %d epoch(s) already (step %d); "
                    "nothing to train: give config.epochs more to train on", epochs, progress.global_step)
    elif stopped:  # (a callback's stop)
        log.warning("fit(): this trainer's run was stopped at step %d (should_stop); nothing "
                    "to train", progress.global_step)


SAMPLE_ROWS = 8  # the evaluation rows a user's metrics are first computed on


def check_metric_for_best_given(trainer: Trainer) -> None:
    """A metric_for_best that the kind does not give may be a user's metric (`metrics=`), known
    once computed: computed now on the evaluation set's first rows, so that a misspelt name is
    said before an epoch's training rather than after it (and before any checkpoint). Said, not
    refused: a metric's keys may depend on the rows (a recall of each class present). A metric
    that cannot be computed on so few rows is left to the first evaluation."""
    if trainer.metric_for_best in trainer.kind.metric_names:
        return
    data = trainer._as_dataset(trainer.eval_data, "eval")
    first = range(min(len(data), SAMPLE_ROWS))
    sample = data.select(first) if hasattr(data, "select") else RowList([data[i] for i in first], "eval")
    with trainer.strategy.evaluating(trainer.model):
        found = predict(trainer.unwrapped_model, sample, trainer.dist, trainer.collate,
                        trainer.config.eval_batch_size, trainer.config.precision, trainer.kind,
                        trainer.strategy.eval_needs_equal_steps, trainer.label_names)
    try:
        metrics = compute_metrics(found, trainer.label_names, trainer.kind, trainer.metric_fns,
                                  warn=False)
    except Exception:  # noqa: BLE001 (a metric of the whole set's; said at the first evaluation)
        return
    if trainer.metric_for_best not in metrics and trainer.is_main:
        log.warning("metric_for_best = %r is not among the metrics of the evaluation set's first "
                    "%d rows (%s): if it is misspelt, the first evaluation will fail on it, "
                    "after training its epoch", trainer.metric_for_best, len(first),
                    ", ".join(scalar_metrics(metrics)))
