"""A task kind defined outside nlptrain, to prove the kind seam (tests/test_new_kind.py): ordered
classes (a rating: low < mid < high) as cumulative decisions. Output k is the logit of
P(class > k), trained with BCE on [class > k] (the last output's target is always 0: one output
a label, as nlptrain's heads and exports have); the predicted class is the number of outputs whose
probability reaches `threshold`. Its metrics: accuracy, and the mean absolute error in classes.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from nlptrain.errors import ConfigError, DataError
from nlptrain.kinds import TaskKind
from nlptrain.kinds.base import (
    Where,
    bernoulli_logs,
    check_class_targets,
    per_class_scores,
    symmetric_kl,
    unknown_label,
)

LEVELS = ["low", "mid", "high"]
WORDS = {"low": ["awful", "terrible", "dreadful"], "mid": ["fine", "okay", "average"],
         "high": ["superb", "wonderful", "excellent"]}


class Ordinal(TaskKind):
    name = "ordinal"
    # transformers knows three problem_types: this head is one sigmoid an output, as multi-label's,
    # so the config also records the kind's name (`names_itself`).
    problem_type = "multi_label_classification"
    names_itself = True
    default_metric = "accuracy"
    metric_names = ("accuracy", "mae")
    headline = ("accuracy", "mae")
    described = "ordered classes, the lowest first"
    metrics_described = "accuracy, MAE in classes"
    settings = ("threshold",)

    def __init__(self, threshold: float = 0.5) -> None:
        self.threshold = threshold

    @classmethod
    def from_settings(cls, data: Mapping[str, Any]) -> Ordinal:
        return cls(data.get("threshold", 0.5))

    @classmethod
    def recorded_in(cls, config: Any) -> Ordinal | None:
        if super().recorded_in(config) is None:
            return None
        return cls(float(getattr(config, "nlptrain_threshold", 0.5)))

    def record_into(self, config: Any) -> None:
        super().record_into(config)
        config.nlptrain_threshold = self.threshold

    def label_values(self, cell: str | list[str]) -> list[str]:
        return [cell] if isinstance(cell, str) else list(cell)

    def encode(self, cells: Sequence[str | list[str]], ids: dict[str, int], where: Where) -> np.ndarray:
        out = np.empty(len(cells), dtype=np.int64)
        for i, cell in enumerate(cells):
            if not isinstance(cell, str) or cell not in ids:
                path, line = where(i)
                not_one_of, cure = unknown_label(ids)
                raise DataError(f"{path}:{line}: level {cell!r} {not_one_of}; {cure}")
            out[i] = ids[cell]
        return out

    def check_labels(self, label_names: Sequence[str], source: str) -> None:
        if len(label_names) < 2:
            raise ConfigError(f"{source}: an ordinal task needs two levels or more")

    def check_targets(self, targets: np.ndarray, label_names: Sequence[str], where: str) -> None:
        if targets.ndim != 1 or targets.dtype.kind == "f":
            raise DataError(f"{where}: an ordinal task takes one level id (an int) a row")
        if label_names:
            check_class_targets(targets, label_names, where)

    def batch_targets_problem(self, targets: torch.Tensor, rows: torch.Tensor,
                              label_names: Sequence[str]) -> str | None:
        bad = ((rows < 0) | (rows >= len(label_names))).any(dim=1).nonzero()
        return None if not len(bad) else f"row index {int(bad[0])} has no level of {list(label_names)}"

    def loss(self, logits: torch.Tensor, targets: torch.Tensor, class_weights: torch.Tensor | None = None,
             label_smoothing: float = 0.0) -> torch.Tensor:
        self.check_fine_tuning(class_weights is not None, label_smoothing)
        levels = torch.arange(logits.shape[-1], device=logits.device)
        above = (targets.view(-1, 1).long() > levels).float()  # [class > k] for each output k
        return F.binary_cross_entropy_with_logits(logits.float(), above)

    def outputs(self, logits: torch.Tensor) -> torch.Tensor:
        return logits.float().sigmoid()

    def consistency_loss(self, first: torch.Tensor, second: torch.Tensor) -> torch.Tensor:
        return symmetric_kl(bernoulli_logs(first.float()), bernoulli_logs(second.float()))

    def level(self, outputs: np.ndarray) -> np.ndarray:
        """The predicted level of each row: how many of its outputs reach the threshold."""
        return np.minimum((outputs >= self.threshold).sum(axis=-1), outputs.shape[-1] - 1)

    def metrics(self, outputs: np.ndarray, targets: np.ndarray, label_names: Sequence[str]) -> dict:
        truth, guess = targets.astype(np.int64), self.level(outputs)
        above = truth[:, None] > np.arange(outputs.shape[1])
        p = np.clip(outputs, 1e-7, 1 - 1e-7)
        return {"rows": int(len(truth)),
                "accuracy": float((truth == guess).mean()),
                "mae": float(np.abs(truth - guess).mean()),
                "loss": float(-(above * np.log(p) + (~above) * np.log(1 - p)).mean()),
                "per_class": per_class_scores(truth, guess, label_names)}

    def predicted(self, output: np.ndarray, label_names: Sequence[str]) -> dict[str, Any]:
        return {"label": label_names[int(self.level(output))], "score": float(output[:-1].sum())}

    def usage(self, text: str, pairs: bool, label_names: Sequence[str]) -> list[str]:
        return [f'classify({text}, top_k=None, function_to_apply="sigmoid", truncation=True)',
                f"# the level: how many of the first {len(label_names) - 1} scores are >= "
                f"{self.threshold:g}, in the order {', '.join(label_names)}"]


def rating_rows(rows: int, seed: int) -> list[tuple[str, str]]:
    """(text, level): a learnable rating, one level's word in each text."""
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        level = rng.choice(LEVELS)
        filler = " ".join(rng.choice(["very", "so", "truly"]) for _ in range(rng.randint(0, 4)))
        out.append((f"row {i} was {filler} {rng.choice(WORDS[level])}", level))
    return out


def write_ordinal_task(folder: Path, model_dir: Path) -> Path:
    """ordinal.toml over toy train/valid/test TSV files of ratings, with the tiny model."""
    for name, rows, seed in (("train", 120, 1), ("valid", 30, 2), ("test", 30, 3)):
        lines = ["text\tlevel", *(f"{text}\t{level}" for text, level in rating_rows(rows, seed))]
        (folder / f"{name}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    task = folder / "ordinal.toml"
    task.write_text(f"""
name = "ordinal"
data_dir = "."
[data]
kind = "ordinal"
label_column = "level"
labels = {LEVELS}
threshold = 0.5
train = "train.tsv"
valid = "valid.tsv"
test = "test.tsv"
cache_dir = "{folder / 'cache'}"
[model]
name = "{model_dir}"
max_length = 32
[train]
epochs = 3
batch_size = 8
lr = 1e-3
metric_for_best = "mae"
""")
    return task
