"""The recipe of `nlptrain eval`: a saved model scored on one split of a task, in one process or
many, with the checks that its outputs mean what the task's labels say (its kind, labels, text
pairs, threshold and max_length against the run that trained it)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from nlptrain import distributed, kinds, precision
from nlptrain.config import TaskConfig
from nlptrain.data import build_datasets
from nlptrain.errors import ConfigError, DataError, every_rank
from nlptrain.evaluate import compute_metrics, predict
from nlptrain.models import check_max_length, load_saved_model, load_tokenizer
from nlptrain.recipe import collator
from nlptrain.task_files import validate

log = logging.getLogger("nlptrain")


def evaluate(task: TaskConfig, model_dir: str, split: str, dist: distributed.Backend,
             use_cache: bool = True) -> dict[str, Any]:
    """Metrics of a saved model on one split of the task, single or multi-process alike."""
    validate(task, f"task {task.name}")
    tokenizer = load_tokenizer(model_dir)
    model = load_saved_model(model_dir)
    check_max_length(model, task.model.max_length, f"task {task.name} [model]")
    names = [model.config.id2label[i] for i in range(model.config.num_labels)]
    kind = kinds.from_task(task)
    try:  # facts of the model, the task and their files, alike on every rank: said once
        trained = kinds.from_model_config(model.config)
        if kind.name != trained.name:
            raise ConfigError(f"{model_dir}: the model was trained for {trained.name}, the task is "
                              f"{kind.name}")
        change = kind.scoring_change(trained)  # e.g. another multi-label threshold
        if change and dist.is_main:
            log.warning("%s", change)
        trained_length = getattr(model.config, "nlptrain_max_length", None)
        if trained_length and trained_length != task.model.max_length and dist.is_main:
            log.warning("scoring at max_length %d (task %s); the model was trained at %d (--set "
                        "model.max_length=%d scores as its run did)", task.model.max_length, task.name,
                        trained_length, trained_length)
        if task.data.labels and kind.has_classes:  # before any row is read
            from nlptrain.data import LabelVocab

            _check_model_labels(model_dir, names, LabelVocab.from_config(task.data.labels).names)
        model_labels = kind.has_classes and not task.data.labels
        if model_labels:  # the model's, in its order: no train file is read for them (its
            # format is not the scored file's, which eval's --data-format etc. describe)
            task = dataclasses.replace(task, data=dataclasses.replace(task.data, labels=list(names)))
        try:
            sets = build_datasets(task, tokenizer, dist, use_cache=use_cache, only=split)
        except DataError as error:  # a label the model does not name: not the row's fault alone
            if not (model_labels and "is not one of the task's labels" in str(error)):
                raise
            found = str(error).split("; fix the row")[0]
            raise every_rank(DataError(
                f"{found}; the task names no labels, so they are the model's ({model_dir}): if "
                "the file writes them otherwise, give the task the model's table, e.g. --set "
                f"data.labels='{{0 = \"{names[0]}\", ...}}'")) from None
        if kind.has_classes:  # also the labels found in the train rows: targets are ids in their order
            _check_model_labels(model_dir, names, sets.vocab.names)
        dataset = getattr(sets, split)
        if dataset is None:
            held_out = f" (or {split}_size)" if split != "train" else ""
            raise ConfigError(f"task '{task.name}' has no {split} set; choose another --split, or give "
                              f"the task a [data] {split} file{held_out}")
        _check_pairs(model_dir, model.config, dataset, split)
    except ConfigError as error:
        raise every_rank(error) from None
    model.to(dist.device)
    chosen = precision.for_scoring(task.train.precision,
                                   getattr(model.config, "nlptrain_precision", None), dist.device, dist)
    found = predict(model, dataset, dist, collator(tokenizer, task), task.train.eval_batch_size,
                    chosen, kind)
    return compute_metrics(found, names, kind, warn=dist.is_main)


def _check_pairs(model_dir: str, model_config: Any, dataset: Any, split: str) -> None:
    """A model trained on text pairs scores pairs, one on single texts single texts (as predict
    checks): the other input scores without meaning, and without an error of its own."""
    trained = getattr(model_config, "nlptrain_text_pair", None)  # None: not trained by nlptrain
    given = getattr(dataset, "pairs", None)
    if trained is None or given is None or bool(given) == trained:
        return
    if trained:
        raise ConfigError(f"{model_dir} was trained on text pairs, and the {split} set holds single "
                          "texts: name the column of each pair's second text with --text-pair-column")
    raise ConfigError(f"{model_dir} was trained on single texts, and the {split} set holds pairs: "
                      "score its first texts alone with --text-pair-column ''")


def _check_model_labels(model_dir: str, names: list[str], task_names: list[str]) -> None:
    """The model's output i is the task's label i: else every metric compares other labels."""
    if task_names != names:
        raise ConfigError(f"{model_dir}: the model's labels {names} are not the task's "
                          f"{task_names}; use a model trained on this task (or give the task "
                          "[data] labels in the model's order)")
