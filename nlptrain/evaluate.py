"""Distributed evaluation that equals single-process evaluation exactly.

Each rank scores a disjoint share (`EvalSampler`: no padding duplicates) on the unwrapped model,
so uneven shares touch no DDP collective; under FSDP2 (every forward a collective) the short
shares add uncounted batches so that all ranks take the same number. `(row index, probabilities,
label)` are gathered from every rank and put back in row order before any metric is computed, so
accuracy, macro-F1 and the confusion matrix are those of one process on the whole set, for any
world size.
"""

from __future__ import annotations

import contextlib
import itertools
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader

from nlptrain.data.tokenized import Collator, TokenizedDataset
from nlptrain.distributed import SingleProcess
from nlptrain.samplers import EvalSampler


@dataclass
class Predictions:
    """Every row of the set, in row order."""

    probs: np.ndarray   # (rows, labels) float32
    labels: np.ndarray  # (rows,) label ids, -1 where unknown

    @property
    def predicted(self) -> np.ndarray:
        return self.probs.argmax(axis=1)


def autocast(device: torch.device, precision: str) -> contextlib.AbstractContextManager:
    if precision == "fp32":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: TokenizedDataset, dist: SingleProcess,
            collate: Collator, batch_size: int = 64, precision: str = "fp32",
            equal_steps: bool = False) -> Predictions:
    """Score this rank's share of `dataset`, gather all shares, return them in row order.

    `model` unwrapped (a DDP wrapper's module; an FSDP2 model as it is). `equal_steps`: every
    forward is a collective (FSDP2), so every rank takes as many batches as the longest share.
    """
    was_training = model.training
    model.eval()
    sampler = EvalSampler(len(dataset), dist.rank, dist.world_size, dataset.lengths)
    loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate)
    counted = len(loader)  # the short shares then pad with batches that are not counted
    padding = max(dist.gather_objects(counted)) - counted if equal_steps else 0
    index, probs, labels = [], [], []
    for step, batch in enumerate(itertools.chain(loader, (collate([dataset[0]]) for _ in range(padding)))):
        inputs = {k: v.to(dist.device, non_blocking=True) for k, v in batch.items()
                  if k in ("input_ids", "attention_mask")}
        with autocast(dist.device, precision):
            logits = model(**inputs).logits
        if step >= counted:
            continue
        probs.append(torch.softmax(logits.float(), dim=-1).cpu())
        index.append(batch["index"])
        labels.append(batch["labels"])
    model.train(was_training)
    num_labels = model.config.num_labels
    local = (torch.cat(index) if index else torch.zeros(0, dtype=torch.long),
             torch.cat(probs) if probs else torch.zeros(0, num_labels),
             torch.cat(labels) if labels else torch.zeros(0, dtype=torch.long))
    every_index, every_prob, every_label = (dist.gather(t) for t in local)
    order = torch.argsort(every_index)
    if not torch.equal(every_index[order], torch.arange(len(dataset))):
        raise RuntimeError("evaluation shards do not cover the set exactly once")
    return Predictions(every_prob[order].numpy(), every_label[order].numpy())


def compute_metrics(predictions: Predictions, label_names: list[str]) -> dict[str, Any]:
    """Accuracy, macro-F1, per-class precision/recall/F1 and the confusion matrix (sklearn)."""
    # Imported here: scikit-learn costs ~1 s at start-up, before the first training step.
    from sklearn.metrics import (
        accuracy_score,
        confusion_matrix,
        f1_score,
        precision_recall_fscore_support,
    )

    ids = list(range(len(label_names)))
    truth, guess = predictions.labels, predictions.predicted
    precision, recall, f1, support = precision_recall_fscore_support(
        truth, guess, labels=ids, zero_division=0)
    picked = np.clip(truth, 0, None)
    loss = -np.log(np.clip(predictions.probs[np.arange(len(truth)), picked], 1e-12, None)).mean()
    return {
        "rows": int(len(truth)),
        "correct": int((truth == guess).sum()),
        "accuracy": float(accuracy_score(truth, guess)),
        "macro_f1": float(f1_score(truth, guess, labels=ids, average="macro", zero_division=0)),
        "loss": float(loss),
        "per_class": {name: {"precision": float(p), "recall": float(r), "f1": float(f),
                             "support": int(s)}
                      for name, p, r, f, s in zip(label_names, precision, recall, f1, support,
                                                  strict=True)},
        "confusion_matrix": confusion_matrix(truth, guess, labels=ids).tolist(),
    }
