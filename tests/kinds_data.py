"""Toy data and task files for each task kind: sentence pairs, multi-label, regression."""

from __future__ import annotations

import json
import random
from pathlib import Path

POSITIVE = ["good", "great", "lovely", "excellent"]
NEGATIVE = ["bad", "awful", "poor", "terrible"]
TAGS = {"food": ["pizza", "bread", "soup"], "music": ["guitar", "song", "drums"],
        "sport": ["football", "tennis", "race"]}


def write_pairs(path: Path, rows: int, seed: int = 0) -> Path:
    """premise/hypothesis TSV: 'same' when both sides have the same sentiment."""
    rng = random.Random(seed)
    lines = ["id\tpremise\thypothesis\tlabel"]
    for i in range(rows):
        a, b = rng.random() < 0.5, rng.random() < 0.5
        left = f"row {i} was {rng.choice(POSITIVE if a else NEGATIVE)}"
        right = f"it felt {'very ' * rng.randint(0, 4)}{rng.choice(POSITIVE if b else NEGATIVE)}"
        lines.append(f"{i}\t{left}\t{right}\t{'same' if a == b else 'differ'}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def multi_label_rows(rows: int, seed: int) -> list[tuple[str, list[str]]]:
    rng = random.Random(seed)
    out = []
    for i in range(rows):
        tags = [t for t in TAGS if rng.random() < 0.4]
        words = [rng.choice(TAGS[t]) for t in tags] + ["and"] * rng.randint(0, 3)
        rng.shuffle(words)
        out.append((f"post {i} about " + " ".join(words), tags))
    return out


def write_multi_label_jsonl(path: Path, rows: int, seed: int = 0) -> Path:
    """{"text": ..., "tags": [...]}: a JSON list of labels, possibly empty."""
    lines = [json.dumps({"text": text, "tags": tags}) for text, tags in multi_label_rows(rows, seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_multi_label_tsv(path: Path, rows: int, seed: int = 0, separator: str = "|") -> Path:
    """text<TAB>tags with the labels joined by `separator`; a row without a tag has an empty cell."""
    lines = ["text\ttags"] + [f"{text}\t{separator.join(tags)}"
                              for text, tags in multi_label_rows(rows, seed)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_scores(path: Path, rows: int, seed: int = 0) -> Path:
    """sentence pairs scored 0-5 by how many positive words the second side repeats."""
    rng = random.Random(seed)
    lines = ["first\tsecond\tscore"]
    for i in range(rows):
        k = rng.randint(0, 5)
        words = [rng.choice(POSITIVE) for _ in range(k)] + [rng.choice(NEGATIVE) for _ in range(5 - k)]
        lines.append(f"sentence {i}\tit was {' '.join(words)}\t{k + rng.random() * 0.1:.3f}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_kind_task(folder: Path, model_dir: Path, kind: str, epochs: int = 2) -> Path:
    """A task file of the given kind ('pair', 'multi_label', 'multi_label_tsv' or 'regression')
    over toy files in `folder`, with a validation file (so best/ is kept) and a test file."""
    # kind -> (file writer, suffix, [data] keys besides the files, metric_for_best)
    writer, suffix, keys, best = {
        "pair": (write_pairs, "tsv", 'kind = "single_label"\ntext_column = "premise"\n'
                 'text_pair_column = "hypothesis"\nlabels = ["differ", "same"]', "f1"),
        "multi_label": (write_multi_label_jsonl, "jsonl", 'kind = "multi_label"\n'
                        'label_column = "tags"\nlabels = ["food", "music", "sport"]', "macro_f1"),
        "multi_label_tsv": (write_multi_label_tsv, "tsv", 'kind = "multi_label"\n'
                            'label_column = "tags"\nlabel_separator = "|"\n'
                            'labels = ["food", "music", "sport"]', "macro_f1"),
        "regression": (write_scores, "tsv", 'kind = "regression"\ntext_column = "first"\n'
                       'text_pair_column = "second"\nlabel_column = "score"', "mse"),
    }[kind]
    for name, rows, seed in (("train", 120, 1), ("valid", 30, 2), ("test", 30, 3)):
        writer(folder / f"{name}.{suffix}", rows, seed)
    data = keys + "".join(f'\n{name} = "{name}.{suffix}"' for name in ("train", "valid", "test"))
    task = folder / f"{kind}.toml"
    task.write_text(f"""
name = "{kind}"
data_dir = "."
[data]
{data}
cache_dir = "{folder / 'cache'}"
[model]
name = "{model_dir}"
max_length = 32
[train]
epochs = {epochs}
batch_size = 8
lr = 1e-3
metric_for_best = "{best}"
""")
    return task
