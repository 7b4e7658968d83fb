"""A 🤗 `datasets.Dataset` as training or evaluation data; `as_dataset` is where the trainer takes
any data it is given, tokenized if it is such a dataset, and checked for plain mistakes.

Its columns are named like a task file's ("text", "label", and "text_pair" for a pair task), and
its rows are checked by the same code as a file's rows, so a bad cell gives the same message,
with the dataset's 1-based row number in place of a line. Targets are encoded by the task kind;
a `ClassLabel` column is read by its names. `datasets` is imported by the caller: nothing here
needs it installed.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from nlptrain.data.datasets import LabelVocab
from nlptrain.data.readers import Examples
from nlptrain.data.rows import checked_row
from nlptrain.data.tokenized import TokenizedDataset, not_ids
from nlptrain.errors import DataError
from nlptrain.kinds import SingleLabel, TaskKind

MAX_LENGTH = 128  # as a task file's [model] max_length
FIX = "name it with {role}_column= (nlptrain.data.hf_datasets.from_hf_dataset)"


def is_hf_dataset(data: Any) -> bool:
    """A `datasets.Dataset` (an Arrow table with named columns), without importing `datasets`."""
    return type(data).__module__.startswith("datasets.") and hasattr(data, "column_names") \
        and hasattr(data, "iter")


def as_dataset(data: Any, tokenizer: Any, label_names: Sequence[str], kind: TaskKind,
               what: str, like: Any = None, positions: int | None = None) -> Any:
    """`data` tokenized when it is a `datasets.Dataset` (default columns), else as it is; what is
    plainly wrong is refused now, not as a torch error inside the first step (or after the
    epoch, in its evaluation): texts not yet tokenized, no rows, class ids beyond the labels,
    single texts to score a model trained on pairs (`like` is the train set), rows longer than
    the model's `positions`."""
    if is_hf_dataset(data):
        data = from_hf_dataset(data, tokenizer, label_names, kind, what=what)
        return _same_inputs(_within_positions(data, positions, what), like, what)
    refusal = _not_yet_a_dataset(data)
    if refusal:
        raise DataError(f"{what} data is {refusal}")
    if isinstance(data, list | tuple) and data and isinstance(data[0], str):
        raise DataError(f"{what} data is a list of texts: tokenize it first, with "
                        "TokenizedDataset.from_texts(texts, labels, tokenizer, max_length) "
                        "(nlptrain.data), or give a datasets.Dataset and tokenizer=")
    if isinstance(data, list | tuple) and data and isinstance(data[0], dict) \
            and np.ndim(data[0].get("input_ids", [[]])) == 1:  # a batch's ids are 2-D
        data = RowList(data, what)  # rows: a dataset, not ready-made batches
    scored = what in ("eval", "valid")  # an evaluation set (the trainer's, or one it is given)
    if isinstance(data, TokenizedDataset | list | tuple) and len(data) == 0:
        raise DataError("the evaluation set holds no rows; give it rows, or no evaluation set "
                        "(eval_data=None)" if scored else f"the {what} set holds no rows")
    if scored and data is not None and not hasattr(data, "lengths"):
        raise DataError(f"the evaluation set is a {type(data).__name__}: give a TokenizedDataset "
                        "(nlptrain.data), a list of its rows, or a datasets.Dataset and "
                        "tokenizer=; the evaluation shards its rows over the ranks by length "
                        "itself, each row once")
    if isinstance(data, TokenizedDataset | RowList):
        check_targets(np.asarray(data.labels), kind, label_names, f"{what} data")
    return _same_inputs(_within_positions(data, positions, what), like, what)


def _within_positions(data: Any, positions: int | None, what: str) -> Any:
    """`data`, refused where a row is longer than the model's positions: the forward pass would
    fail on it, for an evaluation set after a whole epoch's training."""
    lengths = getattr(data, "lengths", None)
    if positions and lengths is not None and len(lengths):
        longest = int(np.argmax(lengths))
        if lengths[longest] > positions:
            raise DataError(f"the {what} set's row index {longest} has {int(lengths[longest])} "
                            f"tokens, more than the model's {positions} positions: tokenize it with "
                            f"max_length at most {positions}")
    return data


def _same_inputs(data: Any, like: Any, what: str) -> Any:
    """`data`, refused where it holds pairs and `like` single texts, or the other way round."""
    shape, trained = _inputs_of(data), _inputs_of(like)
    typed_pairs = ("text pairs", True)  # pairs whose second text the type ids mark
    if {shape[0], trained[0]} == {"text pairs", "single texts"} or (
            UNTYPED in (shape[0], trained[0]) and typed_pairs in (shape, trained)):
        raise DataError(f"the {what} set holds {shape[0]}, the train set {trained[0]}: "
                        "the model would score other inputs than it learnt from")
    return data


UNTYPED = "rows without token_type_ids"


def _inputs_of(data: Any) -> tuple[str | None, bool]:
    """What a set's rows are ("text pairs", "single texts"; a list of rows without type ids:
    either, as a tokenizer without them (RoBERTa) makes them), and whether they have type ids.
    None: not known (a user's dataset)."""
    pairs = getattr(data, "pairs", None)
    typed = getattr(data, "type_ids", None) is not None or getattr(data, "typed", False) is True
    if isinstance(pairs, bool):
        return ("text pairs" if pairs else "single texts"), typed
    return (UNTYPED if isinstance(data, RowList) else None), typed


def _not_yet_a_dataset(data: Any) -> str:
    """What a common container of texts is, and how it becomes a dataset; "" for any other."""
    name = type(data).__name__
    tokenize = "or tokenize it (TokenizedDataset.from_texts(texts, labels, tokenizer, max_length))"
    if type(data).__module__.split(".")[0] == "pandas":  # (pandas 3: "pandas", before "pandas.core...")
        return f"a pandas {name}: give datasets.Dataset.from_pandas(df) and tokenizer=, {tokenize}"
    if name in ("DatasetDict", "IterableDatasetDict"):
        return f"a {name} of the splits {list(data)}: give one split, e.g. data['train']"
    if isinstance(data, list | tuple) and data and isinstance(data[0], dict) \
            and "input_ids" not in data[0]:
        return (f"a list of rows with the keys {sorted(data[0])}, not yet tokenized: give "
                f"datasets.Dataset.from_list(rows) and tokenizer=, {tokenize}")
    if isinstance(data, tuple) and len(data) in (2, 3) and all(
            isinstance(part, list | tuple) or hasattr(part, "__array__") for part in data):
        return f"a tuple of {len(data)} columns: {tokenize}"
    return ""


def check_targets(targets: np.ndarray, kind: TaskKind, label_names: Sequence[str],
                  where: str) -> None:
    """Targets of the kind's shape, checked now, not as a torch error in the first step: one
    whole class id a row (single-label), a 0/1 row (multi-label), a finite score (regression);
    the kind's `check_targets` says which."""
    if not targets.size:
        return
    names = not_ids(targets)
    if names:
        raise DataError(f"{where}: {names}")
    kind.check_targets(targets, label_names, where)


class RowList(Dataset):
    """A list of rows, each a dict as `TokenizedDataset[i]` gives it (input_ids, labels[,
    token_type_ids]), as a dataset that knows its rows' lengths and labels: it batches, groups
    by length and shards for evaluation like a TokenizedDataset."""

    def __init__(self, rows: Sequence[dict[str, Any]], what: str = "train") -> None:
        missing = [i for i, row in enumerate(rows) if "input_ids" not in row or "labels" not in row]
        if missing:
            raise DataError(f"{what} data: row {missing[0]} of the list has no "
                            f"{'input_ids' if 'input_ids' not in rows[missing[0]] else 'labels'}; "
                            "each row needs input_ids and labels")
        self.rows = list(rows)
        typed = ["token_type_ids" in row for row in self.rows]
        # Type id 1 marks a pair's second text (Funnel's and XLNet's CLS is 2); without type ids
        # (RoBERTa) the rows do not say.
        pair = next((i for i, row in enumerate(self.rows) if typed[i]
                     and np.any(np.asarray(row["token_type_ids"]) == 1)), None)
        if pair is not None and not all(typed):  # (the collate read the first row's keys: a KeyError)
            raise DataError(f"{what} data: row {pair} of the list is a text pair (type ids), row "
                            f"{typed.index(False)} has no token_type_ids: give rows of one kind, "
                            "all text pairs or all single texts")
        # Single texts' all-zero type ids, on some rows: what the model takes without them.
        self._drop_types = any(typed) and not all(typed)
        self.typed = all(typed)
        self.pairs = pair is not None if self.typed else None
        self.lengths = np.array([len(row["input_ids"]) for row in self.rows], dtype=np.int64)
        self.labels = np.stack([np.asarray(row["labels"]) for row in self.rows])

    @property
    def label_ids(self) -> np.ndarray:  # as a TokenizedDataset's (class weights read them)
        return self.labels

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Any]:
        row = {**self.rows[i], "index": i}  # the row's place, which evaluation gathers by
        if self._drop_types:
            row.pop("token_type_ids", None)
        return row


def batch_targets_problem(targets: Any, kind: TaskKind, label_names: Sequence[str]) -> str | None:
    """What the kind's loss would fail on, or train on wrongly, in a batch's targets (a tensor)
    from a loader of the user's; None where nothing is. Soft targets, ignored rows (-100) and
    scores of any float type are the loss's to take."""
    rows = targets.detach().reshape(len(targets), -1) if targets.ndim else targets.detach().view(1, 1)
    if targets.is_floating_point() and not torch.isfinite(rows.float()).all():
        row = int((~torch.isfinite(rows.float())).any(dim=1).nonzero()[0])
        return (f"row index {row} has the target(s) {rows[row].float().tolist()}, not finite; drop "
                "the row or give it its target")
    return kind.batch_targets_problem(targets, rows, label_names)


def from_hf_dataset(data: Any, tokenizer: Any, label_names: Sequence[str],
                    kind: TaskKind | None = None, *, text_column: str = "text",
                    label_column: str = "label", text_pair_column: str | None = None,
                    max_length: int = MAX_LENGTH, what: str = "train") -> TokenizedDataset:
    """Tokenize a `datasets.Dataset` into the trainer's flat token arrays, each row cut to
    `max_length` tokens (128 by default, as a task file's). `text_pair_column`
    None: "text_pair" when the dataset has that column, else one text a row. A label is a name
    of `label_names` (text), an id (an int, or a `ClassLabel` value), a list of either
    (multi-label; or a 0/1 row, one column a label), or a number (regression)."""
    if tokenizer is None:
        raise DataError(f"{what} data is a datasets.Dataset: pass tokenizer= to tokenize it")
    kind = kind or SingleLabel()
    names = list(data.column_names)
    if text_pair_column is None:
        text_pair_column = "text_pair" if "text_pair" in names else ""
    roles = {"text": text_column, "label": label_column}
    if text_pair_column:
        roles["pair"] = text_pair_column
    where = f"{what} dataset"
    for role, column in roles.items():
        if column not in names:
            raise DataError(f"{where}: no {role} column '{column}' in the columns {names}; "
                            f"{FIX.format(role=role if role != 'pair' else 'text_pair')}")
    feature = data.features.get(label_column)
    feature = getattr(feature, "feature", feature)  # a list column's items
    class_names = getattr(feature, "names", None)  # a ClassLabel's
    names = [str(n) for n in label_names]
    multi_hot = kind.multi_hot and not class_names and _is_multi_hot(data[label_column], names)
    examples = Examples()
    number = 0
    for batch in data.select_columns(list(roles.values())).iter(batch_size=4096):
        for i in range(len(batch[text_column])):
            number += 1
            cells = {role: batch[column][i] for role, column in roles.items()}
            if multi_hot:  # a 0/1 column per label, as TokenizedDataset.from_texts takes them
                row = _plain(cells["label"])
                cells["label"] = [name for name, on in zip(names, row, strict=True) if on]
            elif kind.has_classes:
                cells["label"] = _named(cells["label"], class_names or names, f"{where}:{number}")
            examples.add(checked_row(cells, where, number,  # type: ignore[arg-type]
                                     kind.empty_label_ok))
    if not examples:
        raise DataError(f"{where}: holds no rows")
    # Every id is a name by now, so a text cell is only ever a name: with star ratings "1".."5",
    # the text "1" is the first label and the id 1 the second, never both.
    vocab = LabelVocab(names, names) if kind.has_classes else LabelVocab([], [])
    targets = vocab.encode(examples, kind)
    return TokenizedDataset.from_texts(examples.texts, targets, tokenizer, max_length,
                                       pairs=examples.pairs)


def _plain(value: Any) -> Any:
    """A cell as Python values: a numpy or torch value (`with_format("numpy"/"torch")`) as its
    number or list."""
    return value.tolist() if hasattr(value, "tolist") else value


def _is_multi_hot(labels: Sequence[Any], names: Sequence[str]) -> bool:
    """Whether multi-label cells are 0/1 rows, one column a label, not lists of label ids: each
    row as long as the labels and only 0s and 1s, and some row repeats a value (a list of ids
    names each label once; with 3 or more labels every 0/1 row repeats one). With 2 labels,
    [1, 0] and [0, 1] alone are 0/1 rows too: as ids, every row would hold both labels."""
    rows = [_plain(row) for row in labels]
    return bool(rows) and all(
        isinstance(row, list) and len(row) == len(names) and set(row) <= {0, 1} for row in rows
    ) and (len(names) == 2 or any(len(set(row)) < len(row) for row in rows))


def _named(value: Any, names: Sequence[str], where: str) -> Any:
    """A label cell with each id (an int: a ClassLabel's value, else a position in the label
    names) as its name; text is a name already."""
    value = _plain(value)
    if isinstance(value, list):
        return [_named(v, names, where) for v in value]
    if not isinstance(value, numbers.Integral) or isinstance(value, bool):
        return value
    if not 0 <= value < len(names):
        raise DataError(f"{where}: label id {value} is not an id of the labels {list(names)} "
                        f"(0 to {len(names) - 1})")
    return names[value]
