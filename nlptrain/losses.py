"""The training loss a config asks for: the kind's loss with class weights and label smoothing.

Which kinds take them is the kind's to say (`TaskKind.takes_class_weights`,
`takes_label_smoothing`; `check_fine_tuning` refuses the rest), and so is what they mean to its loss.
`[train] class_weights` weighs each class's examples in single-label cross-entropy, and is BCE's
`pos_weight` (the weight of each label's positive examples) for multi-label tasks:
- `"balanced"`: computed from the training targets by the kind (`balanced_weights`). Single-label:
  scikit-learn's `compute_class_weight("balanced")`, n_rows / (n_classes * rows of the class).
  Multi-label: negatives / positives of each label, so that both weigh the same.
- `[w, ...]`: one weight per label, in the order of the task's labels.
`[train] label_smoothing = x` (single-label only) spreads x of each target's mass over all classes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset

from nlptrain.errors import ConfigError, every_local_rank
from nlptrain.kinds import TaskKind

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def training_targets(data: Any) -> np.ndarray | None:
    """The targets of a training set (a TokenizedDataset, or a DataLoader over one), if known."""
    data = getattr(data, "dataset", data)
    if isinstance(data, IterableDataset):
        return None  # a stream's rows are read later (its `label_ids` maps labels to ids)
    targets = getattr(data, "label_ids", None)
    return None if targets is None else np.asarray(targets)


def balanced_weights(kind: TaskKind, targets: np.ndarray, label_names: Sequence[str]) -> np.ndarray:
    """Class weights that make every class (or every label's positives) weigh the same."""
    return kind.balanced_weights(targets, label_names)


def class_weights(kind: TaskKind, spec: str | list, train_data: Any,
                  label_names: Sequence[str]) -> np.ndarray | None:
    """The weights `[train] class_weights` means for this kind and training set (None: off)."""
    if spec in ("", []):
        return None
    kind.check_fine_tuning(True, 0.0)
    if spec == "balanced":
        targets = training_targets(train_data)
        if targets is None:
            raise ConfigError("[train] class_weights = 'balanced' needs the training targets, which "
                              "this training data does not give (streaming or a custom loader); "
                              "give the weights as a list")
        return balanced_weights(kind, targets, label_names)
    if isinstance(spec, str) or len(spec) != len(label_names):
        raise every_local_rank(ConfigError(
            f"[train] class_weights = {spec!r}: give 'balanced' or one number per "
            f"label ({len(label_names)}: {', '.join(label_names)})"))
    try:
        kind.check_class_weights(spec, label_names)
    except ConfigError as error:  # every rank finds it: said once
        raise every_local_rank(error) from None
    return np.asarray(spec, dtype=np.float32)


def weighted_loss(kind: TaskKind, weights: np.ndarray | None, label_smoothing: float) -> LossFn:
    """kind.loss with these weights (moved to the logits' device once) and smoothing."""
    held: dict[torch.device, torch.Tensor] = {}

    def loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        on_device = None
        if weights is not None:
            on_device = held.get(logits.device)
            if on_device is None:
                on_device = held[logits.device] = torch.from_numpy(weights).to(logits.device)
        return kind.loss(logits, targets, class_weights=on_device, label_smoothing=label_smoothing)

    return loss


def task_loss(kind: TaskKind, config: Any, train_data: Any, label_names: Sequence[str]) -> LossFn:
    """The trainer's default `loss_fn`: (logits, targets) -> loss, per `config`, refusing logits
    of another width than the kind's output size (a user's own model, built for another task)."""
    weights = class_weights(kind, config.class_weights, train_data, label_names)
    kind.check_fine_tuning(False, config.label_smoothing)
    if weights is not None:
        loss = weighted_loss(kind, weights, config.label_smoothing)
    else:
        loss = partial(kind.loss, label_smoothing=config.label_smoothing) \
            if config.label_smoothing else kind.loss

    def checked(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        kind.check_logits(logits, label_names)
        return loss(logits, targets)

    return checked
