"""Distributed evaluation that equals single-process evaluation exactly.

Each rank scores a disjoint share of batches (`EvalBatches`: the same batches for any world size,
no padding duplicates) on the unwrapped model, so uneven shares touch no DDP collective; under
FSDP2 (every forward a collective) the short shares add uncounted batches so that all ranks take
the same number. `(row index, outputs, label)` are gathered from every rank and put back in row
order before any metric is computed, so every metric of the task's kind (accuracy, F1,
correlations, ...) is that of one process on the whole set, for any world size. Training and
evaluation give the model the same inputs (`model_inputs`).
"""

from __future__ import annotations

import itertools
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from nlptrain.data.tokenized import TokenizedDataset, loss_targets
from nlptrain.distributed import Backend
from nlptrain.errors import ConfigError, DataError, TrainingError, every_rank
from nlptrain.kinds import SingleLabel, TaskKind
from nlptrain.loaders import check_batch
from nlptrain.precision import autocast, logits_in_fp32
from nlptrain.samplers import EvalBatches

log = logging.getLogger(__name__)
TRAINERS_KEYS = ("epoch", "step")  # added to an evaluation's metrics by the trainer
PROGRESS_EVERY_S = 30.0  # a long scoring (predict on a big file, eval of a big set) says how far


@dataclass
class Predictions:
    """Every row of the set, in row order."""

    outputs: np.ndarray  # (rows, outputs) float32: probabilities, or scores (regression)
    labels: np.ndarray   # targets, first dimension the row (class ids: -1 where unknown)

    @property
    def predicted(self) -> np.ndarray:
        return self.outputs.argmax(axis=1)


def model_inputs(batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """What the model is given, in training and evaluation alike: everything but the targets
    and row numbers (input_ids, attention_mask, and token_type_ids for pairs)."""
    return {k: v for k, v in batch.items() if k not in ("labels", "index")}


def logits_of(outputs: Any) -> torch.Tensor:
    """The logits of a model's output: a `transformers` output, a dict or any object with
    `logits`, or a tensor (a user's own module may return any of them)."""
    if isinstance(outputs, torch.Tensor):
        return outputs
    if isinstance(getattr(outputs, "logits", None), torch.Tensor):  # a dataclass, a NamedTuple
        return outputs.logits
    if isinstance(outputs, tuple | list):  # (logits, ...), as return_dict=False gives it
        return outputs[0]
    if (isinstance(outputs, dict) or hasattr(outputs, "keys")) and "logits" in outputs:
        return outputs["logits"]
    raise TrainingError(f"the model returned a {type(outputs).__name__}: return the logits (a "
                        "tensor), a tuple that starts with them, or an object/dict with 'logits'")


EVAL_KEYS = ("input_ids", "attention_mask", "labels", "index")  # index: rows are gathered by it


def check_eval_batch(dataset: Any, collate: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
    """An evaluation batch as `collate` makes it, checked before training: a collate of a user's
    that drops a key (`index`, which training does not read) then fails at once, not after
    an epoch's training."""
    if len(dataset):
        check_batch(collate([dataset[0]]), EVAL_KEYS, "an evaluation batch")


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: TokenizedDataset, dist: Backend,
            collate: Callable[[list[dict[str, Any]]], dict[str, torch.Tensor]],
            batch_size: int = 64, precision: str = "fp32",
            kind: TaskKind | None = None, equal_steps: bool = False,
            label_names: Sequence[str] | None = None) -> Predictions:
    """Score this rank's share of `dataset`, gather all shares, return them in row order.

    `model` unwrapped (a DDP wrapper's module; an FSDP2 model as it is). `equal_steps`: every
    forward is a collective (FSDP2), so every rank takes as many batches as the longest share.
    `label_names`: the task's, to refuse a model whose outputs are not as many (a model of the
    user's, scored without training: its metrics would be wrong, or fail in numpy).
    """
    kind = kind or SingleLabel()
    logits_in_fp32(model, getattr(getattr(model, "config", None), "num_labels", None))  # (a loaded one)
    was_training = model.training
    model.eval()
    batches = EvalBatches(len(dataset), dist.rank, dist.world_size, batch_size, dataset.lengths)
    # Its own generator: making the iterator then draws nothing from the global RNG, so an
    # evaluation (one more at a stop, or another eval_every on resume) leaves dropout's as it was.
    loader = DataLoader(dataset, batch_sampler=batches, collate_fn=collate,
                        generator=torch.Generator())
    counted = len(loader)  # the short shares then pad with batches that are not counted
    sizes = dist.gather_objects((len(dataset), counted))  # (one process: no collective)
    if len({rows for rows, _ in sizes}) > 1:  # each rank would score its share of another set
        held = ", ".join(f"{rows} rows on rank {rank}" for rank, (rows, _) in enumerate(sizes))
        raise every_rank(DataError(f"the evaluation set holds {held}: give every rank the same "
                                   "evaluation set (each scores its share of it)"))
    padding = max(batches for _, batches in sizes) - counted if equal_steps else 0
    filler = (collate([dataset[0]]) for _ in range(padding))
    # The work left in padded tokens, not batches: the longest come first, so a time per batch
    # from the first ones said 2-4x too long.
    work = np.cumsum([len(rows) * int(dataset.lengths[rows].max()) for rows in batches.batches])
    index, outputs, labels = [], [], []
    began = said = time.perf_counter()
    for step, batch in enumerate(itertools.chain(loader, filler)):
        if step == 0:
            check_batch(batch, EVAL_KEYS, "an evaluation batch")
        inputs = {k: v.to(dist.device, non_blocking=True) for k, v in model_inputs(batch).items()}
        with autocast(dist.device, precision):
            logits = logits_of(model(**inputs))
        if step == 0 and label_names is not None:
            try:
                kind.check_logits(logits, label_names)
            except ConfigError as error:
                raise every_rank(error) from None
        if step >= counted:
            continue
        outputs.append(kind.outputs(logits).cpu())
        index.append(batch["index"])
        labels.append(batch["labels"])
        if time.perf_counter() - said >= PROGRESS_EVERY_S:  # (logged by rank 0, for its share)
            said = time.perf_counter()
            left = (said - began) / work[step] * (work[-1] - work[step])
            log.info("scoring: batch %d/%d (%.0f%%), about %.0f s left", step + 1, counted,
                     100 * (step + 1) / counted, left)
    model.train(was_training)
    # (An empty share's labels: a copy, as the set's may be a read-only memmap.)
    local = (torch.cat(index) if index else torch.zeros(0, dtype=torch.long),
             torch.cat(outputs) if outputs else torch.zeros(0, _output_width(model, kind)),
             torch.cat(labels) if labels else torch.from_numpy(loss_targets(np.array(dataset.labels[:0]))))
    every_index, every_output, every_label = (dist.gather(t) for t in local)
    order = torch.argsort(every_index)
    if not torch.equal(every_index[order], torch.arange(len(dataset))):
        raise RuntimeError("evaluation shards do not cover the set exactly once")
    return Predictions(every_output[order].numpy(), every_label[order].numpy())


def _output_width(model: torch.nn.Module, kind: TaskKind) -> int:
    """Outputs per row, for a rank whose share is empty (its gather still sends a 0-row block)."""
    config = getattr(model, "config", None)
    labels = getattr(config, "num_labels", None)
    return 1 if not kind.has_classes else int(labels or 0)


def compute_metrics(predictions: Predictions, label_names: Sequence[str],
                    kind: TaskKind | None = None,
                    metric_fns: Sequence[Callable[[Predictions], dict[str, Any]]] = (),
                    warn: bool = True) -> dict[str, Any]:
    """The kind's metrics (single-label by default: accuracy, macro-F1, MCC, per class, the
    confusion matrix) of gathered predictions, computed with scikit-learn / scipy, then those of
    a user's `metric_fns`, made plain Python values: a numpy or torch number (scikit-learn's
    np.float64) in a checkpoint's state would be refused when it is loaded. `warn=False` (every
    rank but the main one): the libraries' warnings are the main rank's, on the same numbers."""
    if len(predictions.labels) == 0:  # on every rank alike: the predictions are gathered
        raise DataError("the evaluation set holds no rows; give it rows, or no evaluation set "
                        "(eval_data=None)")
    with warnings.catch_warnings():
        if not warn:
            warnings.simplefilter("ignore")
        metrics = (kind or SingleLabel()).metrics(predictions.outputs, predictions.labels,
                                                  label_names)
        for metric_fn in metric_fns:
            metrics.update(_user_metrics(metric_fn, predictions, taken=metrics))
    return metrics


def _user_metrics(metric_fn: Callable[[Predictions], dict[str, Any]], predictions: Predictions,
                  taken: dict[str, Any]) -> dict[str, Any]:
    """`metric_fn`'s dict, as plain numbers (or lists of them); refused, naming the function,
    if it is no dict, holds something that is no number (a string or None would be logged,
    compared for the best model and saved as if it were one), or reuses a name already taken:
    replacing the kind's `accuracy` without a word would change what every log means."""
    name = getattr(metric_fn, "__name__", repr(metric_fn))
    found = metric_fn(predictions)
    if not isinstance(found, dict):
        raise ConfigError(f"metrics= function {name} returned a {type(found).__name__} "
                          f"({str(found)[:40]}): return a dict of name -> number, "
                          "e.g. {'rmse': 0.41}")
    plain = {key: value.tolist() if hasattr(value, "tolist") else value
             for key, value in found.items()}
    for key, value in plain.items():
        if key in TRAINERS_KEYS:
            raise ConfigError(f"metrics= function {name} returned '{key}', which the trainer adds "
                              f"to every evaluation's metrics; give yours another name, e.g. "
                              f"'{name}_{key}'")
        if key in taken:
            raise ConfigError(f"metrics= function {name} returned '{key}', a metric this task "
                              f"already reports; give yours another name, e.g. '{name}_{key}'")
        if not _is_numeric(value):
            raise ConfigError(f"metrics= function {name} returned '{key}': "
                              f"{type(value).__name__} ({str(value)[:40]}), not a number or a "
                              "list of numbers")
    return plain


def _is_numeric(value: Any) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_is_numeric(item) for item in value)
    return isinstance(value, (int, float)) and not isinstance(value, bool)
