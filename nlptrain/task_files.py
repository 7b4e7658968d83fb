"""Reading and checking a task: a TOML file, a dict of its keys, the command line's overrides,
the Python API's TrainConfig. Unknown keys and wrong types are errors that name the file, the
line and the key; the choices and ranges are checked before anything is read or written.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
import tomllib
from pathlib import Path
from typing import Any

from nlptrain.config import FILES, SECTIONS, DataConfig, FileSpec, TaskConfig, TrainConfig, fill
from nlptrain.errors import ConfigError
from nlptrain.kinds import KINDS, TaskKind
from nlptrain.option_types import MAX_WAIT_S


def train_config(config: TrainConfig | dict[str, Any] | None,
                 where: str = "Trainer(config=...)") -> TrainConfig:
    """The Python API's config: a TrainConfig, or a dict of its keys, checked as a task file's
    [train] is (unknown keys, types), so that lr="3e-5" is refused here, not inside a step."""
    if config is None:
        return TrainConfig()
    if isinstance(config, dict):
        config = fill(TrainConfig, config, where)
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"{where}: give a TrainConfig, or a dict of its keys, not "
                          f"{type(config).__name__}")
    fill(TrainConfig, dataclasses.asdict(config), where)
    validate(TaskConfig(train=config), where, sections=("train",))
    return config


def task_from_dict(raw: dict[str, Any], source: str) -> TaskConfig:
    top = {k: v for k, v in raw.items() if k not in SECTIONS}
    task = fill(TaskConfig, top, source)
    for name, cls in SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: '{name}' must be a [{name}] table")
        setattr(task, name, fill(cls, table, f"{source} [{name}]"))
    validate(task, source)
    return task


def load_task(path: str | Path) -> TaskConfig:
    """Read a task file. Relative `data_dir` is taken relative to the file itself."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")  # (Notepad's BOM: no TOML)
        raw = tomllib.loads(text)
    except FileNotFoundError:
        raise ConfigError(f"{path}: task file not found (see the files in tasks/)") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except UnicodeDecodeError as err:  # TOML is UTF-8 by its spec
        line = err.object[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: byte {err.object[err.start]:#04x} is not UTF-8 (a TOML "
                          "file must be UTF-8); save it as UTF-8") from None
    try:
        task = task_from_dict(raw, str(path))
    except ConfigError as err:
        raise ConfigError(with_line(str(err), str(path), text)) from None
    if "name" not in raw:  # runs/<file's stem>-<time>, not runs/task-<time> for every such file
        task.name = path.stem
    if task.data_dir and not Path(task.data_dir).is_absolute():
        task.data_dir = str((path.parent / task.data_dir).resolve())
    return task


def apply_override(task: TaskConfig, dotted: str, value: Any, source: str = "override") -> None:
    """Set `section.key`, `data.FILE.key` (FILE: train, valid, test) or a top-level key to `value`,
    with the task file's type checks. Call `validate` once all overrides are set: one at a time,
    a valid combination (another kind and its metric) would be refused half-way."""
    section, _, key = dotted.rpartition(".")
    if section.startswith("data.") and section[5:] in FILES:
        _set_file_key(task, section[5:], key, value, source)
    elif section and section not in SECTIONS:  # before getattr: a typo is a one-line error
        valid = ", ".join([*SECTIONS, *(f"data.{name}" for name in FILES)])
        raise ConfigError(f"{source}: unknown section '{section}'. Valid: {valid}; or no section "
                          "for a top-level key (name, description, data_dir)")
    else:
        target = getattr(task, section) if section else task
        fill(type(target), {key: value}, source)  # type and name check only
        setattr(target, key, value)


def _set_file_key(task: TaskConfig, which: str, key: str, value: Any, source: str) -> None:
    """`data.test.header=false`: one key of one file's own table (a path alone becomes one)."""
    fill(FileSpec, {key: value}, source)
    entry = getattr(task.data, which)
    table = dict(entry) if isinstance(entry, dict) else {"path": entry} if entry else {}
    setattr(task.data, which, {**table, key: value})


CHOICES = {
    ("data", "format"): {"auto", "tsv", "csv", "jsonl", "parquet", "lines"},
    ("data", "uneven_shards"): {"drop", "wrap"},
    ("train", "precision"): {"auto", "fp32", "bf16", "fp16"},
    ("train", "padding"): {"dynamic", "max_length"},
    ("train", "scheduler"): {"linear", "cosine", "constant", "constant_with_warmup"},
    ("data", "kind"): KINDS.keys(),  # (a view: a kind registered later is a choice too)
    ("train", "strategy"): {"auto", "ddp", "fsdp"},
    ("train", "best_is"): {"auto", "higher", "lower"},
}


# Negative, these fail late with a raw traceback (lr, num_workers) or quietly misbehave (eval_every
# -5 still evaluates, keep_checkpoints -1 prunes the oldest checkpoint alone).
NOT_NEGATIVE = [("train", key) for key in (
    "lr", "weight_decay", "max_grad_norm", "max_tokens", "eval_every", "early_stopping",
    "checkpoint_every", "checkpoint_minutes", "keep_checkpoints", "steps_per_epoch",
    "max_steps", "warmup_steps", "num_workers")] + [
    ("model", "num_hidden_layers"), ("data", "shuffle_buffer")]


def validate(task: TaskConfig, source: str, sections: tuple[str, ...] = ("data", "model", "train")
             ) -> None:
    """`task`'s choices and ranges, of `sections` only where given (the Python API's TrainConfig:
    "train" alone), then, for a whole task, how its sections fit together."""
    def value(section: str, key: str) -> Any:
        return getattr(getattr(task, section), key)

    for (section, key), allowed in CHOICES.items():
        if section in sections and value(section, key) not in allowed:
            raise ConfigError(f"{source}: [{section}] {key} = {value(section, key)!r}; choose one "
                              f"of {', '.join(sorted(allowed))}")
    positive = [("train", "epochs"), ("train", "batch_size"), ("train", "eval_batch_size"),
                ("train", "grad_accum"), ("train", "log_every"), ("model", "max_length"),
                ("train", "timeout"), ("train", "pad_to_multiple_of")]
    for section in sections:  # NaN passes every comparison below (lr = nan: a torch traceback)
        for key, number in vars(getattr(task, section)).items():
            if isinstance(number, float) and not math.isfinite(number):
                raise ConfigError(f"{source}: [{section}] {key} = {number}; give a finite number")
            if section == "train" and isinstance(number, int) and abs(number) > sys.maxsize:  # (a
                # loader's traceback; [model] max_length says the model's positions)
                raise ConfigError(f"{source}: [{section}] {key} = {number} is too large (at most "
                                  f"{sys.maxsize})")
    for section, key in positive:
        if section in sections and value(section, key) < 1:
            raise ConfigError(f"{source}: [{section}] {key} must be at least 1")
    for section, key in NOT_NEGATIVE:
        if section in sections and value(section, key) < 0:
            raise ConfigError(f"{source}: [{section}] {key} must be at least 0")
    for section, key in (("train", "seed"), ("data", "split_seed")):  # numpy's and sklearn's range
        if section in sections and not 0 <= value(section, key) < 2**32:
            raise ConfigError(f"{source}: [{section}] {key} must be in [0, 4294967295]")
    if "train" in sections and task.train.timeout > MAX_WAIT_S:  # (more overflows in torch)
        raise ConfigError(f"{source}: [train] timeout must be at most {MAX_WAIT_S:,} seconds")
    if "train" in sections and not 0 <= task.train.warmup_ratio <= 1:
        raise ConfigError(f"{source}: [train] warmup_ratio must be in [0, 1]")
    if "train" in sections and task.train.max_tokens and not task.train.group_by_length:
        raise ConfigError(f"{source}: [train] group_by_length = false has no effect under "
                          "max_tokens, whose batches are of rows of like length (what fills them); "
                          "drop one of the two")
    whole = set(sections) == set(SECTIONS)
    if "train" in sections:  # (the kinds they fit: only where the task's is known)
        validate_finetuning(task.train, KINDS[task.data.kind] if whole else None, source)
    if not whole:  # one section alone: nothing else to fit it to
        return
    if not task.name or task.name in (".", "..") or any(c in task.name for c in "/\\"):
        raise ConfigError(f"{source}: name = {task.name!r} names the run's folder (runs/<name>-"
                          "<time>): give a name without / or \\")
    if task.train.max_tokens and (task.data.streaming or task.data.train_shards):
        # Batches by a token budget need every row's length up front, in one in-memory set.
        raise ConfigError(f"{source}: [train] max_tokens needs the train set in memory; it cannot "
                          "batch " + ("a stream ([data] streaming)" if task.data.streaming else
                                      "per-rank files ([data] train_shards)") + ": use batch_size")
    if not 0 < task.data.threshold < 1:  # a probability: 0 predicts every label, 1 none
        raise ConfigError(f"{source}: [data] threshold {task.data.threshold:g} must be strictly "
                          "between 0 and 1 (a probability: 0 predicts every label, 1 none)")
    kind = KINDS[task.data.kind]
    for key in dict.fromkeys(k for other in KINDS.values() for k in other.settings):
        # Another kind's setting, set away from its default: meant to act, and would not.
        if key not in kind.settings and getattr(task.data, key) != getattr(DataConfig, key):
            owners = " or ".join(other.name for other in KINDS.values() if key in other.settings)
            raise ConfigError(f"{source}: [data] {key} is for {owners} tasks; this one is "
                              f"{task.data.kind} ([data] kind)")
    if task.train.metric_for_best:
        from nlptrain.kinds import from_task

        from_task(task).check_metric(task.train.metric_for_best, source, task.data.labels or ())
    if not kind.has_classes and task.data.labels:  # else dropped without a word
        raise ConfigError(f"{source}: [data] labels name classes; a {kind.name} task has none: "
                          "leave them out (data.labels=[])")
    for which in FILES:  # a file's own table: its keys now, not when the file is read
        entry = getattr(task.data, which)
        if not isinstance(entry, dict):
            continue
        spec = fill(FileSpec, entry, f"{source} [data] {which}")
        if not spec.path:
            raise ConfigError(f"{source}: [data] {which} has no path (set data.{which}.path)")
        if spec.format not in CHOICES["data", "format"]:
            raise ConfigError(f"{source}: [data] {which}.format = {spec.format!r}; choose one of "
                              f"{', '.join(sorted(CHOICES['data', 'format']))}")
    # Each label is one output of the model: a name twice would train two outputs for one class
    # and fail at the end of the run (plots, the confusion matrix, the export's label2id).
    labels = task.data.labels
    given = list(labels.values() if isinstance(labels, dict) else labels)
    nested = [v for v in given if isinstance(v, list | dict)]
    if nested:  # else a class named "['x']", exported so
        raise ConfigError(f"{source}: [data] labels: {nested[0]!r} is not a label's name; give each "
                          "label a name (a string)")
    names = [str(v) for v in given]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{source}: [data] labels: {', '.join(map(repr, twice))} named more than "
                          "once; give each label one name of its own")
    for key in ("test_size", "valid_size"):
        if not 0 <= getattr(task.data, key) < 1:
            raise ConfigError(f"{source}: [data] {key} must be in [0, 1)")


def validate_finetuning(train: TrainConfig, kind: TaskKind | type[TaskKind] | None,
                        source: str) -> None:
    """class_weights, label_smoothing, layer_lr_decay, ema_decay: values, and the kinds they fit
    where the kind is known (a Trainer checks it again with its own)."""
    weights = train.class_weights
    if isinstance(weights, str) and weights not in ("", "balanced"):
        raise ConfigError(f"{source}: [train] class_weights = {weights!r}; give 'balanced' or a list "
                          "of numbers, one per label (--class-weights 1,3 or [1, 3])")
    if isinstance(weights, list) and not all(
            isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights):
        raise ConfigError(f"{source}: [train] class_weights = {weights!r}: each weight must be a "
                          "number >= 0")
    if not 0 <= train.label_smoothing < 1:
        raise ConfigError(f"{source}: [train] label_smoothing must be in [0, 1)")
    if not 0 < train.layer_lr_decay <= 1:
        raise ConfigError(f"{source}: [train] layer_lr_decay must be in (0, 1] (1: off)")
    if not 0 <= train.ema_decay < 1:
        raise ConfigError(f"{source}: [train] ema_decay must be in [0, 1) (0: off)")
    if kind is None:
        return
    kind.check_fine_tuning(weights not in ("", []), train.label_smoothing, source)


def with_line(message: str, path: str, text: str) -> str:
    """`message` about a key of the task file at `path`, with the key's line: "FILE:12: ..."
    (tomllib gives lines for syntax errors alone)."""
    if not message.startswith(path):
        return message
    rest = message[len(path):]
    found = re.match(r" \[(?P<table>[\w.]+)\](?: (?P<file>\w+))?: (?:unknown key '(?P<unknown>\w+)'"
                     r"|'(?P<typed>\w+)' must be)|: \[(?P<checked>\w+)\] (?P<key>\w+)"
                     r"(?:\.(?P<file_key>\w+))?\b"
                     r"|: (?:unknown key '(?P<top>\w+)'|'(?P<top_typed>\w+)' must be)", rest)
    if not found:
        return message
    table = found["table"] or found["checked"] or ""
    key = found["unknown"] or found["typed"] or found["key"] or found["top"] or found["top_typed"]
    file = found["file"]
    if found["file_key"]:  # "[data] test.format = ...": a file's own key, checked
        file, key = key, found["file_key"]
    if file:  # a file's own table: [data.test], or an inline table in [data]
        table = f"{table}.{file}"
    line = _line_of(text, table, key) or (_line_of(text, table.rpartition(".")[0], file)
                                          if file else None)
    return f"{path}:{line}{rest}" if line else message


def _line_of(text: str, table: str, key: str) -> int | None:
    """The line (from 1) where `key = ...` stands in `[table]`, or a table `[table.key]` (a
    misspelt `[dta]`) begins; None where it is not found once (a line of a multi-line string's
    text is no TOML line)."""
    current, found = "", []
    whole = f"{table}.{key}" if table else key
    for number, line in _lines_outside_strings(text):
        header = re.match(r"\s*\[\s*([\w.]+)\s*\]", line)
        if header:
            current = header.group(1)
            if current == whole:
                found.append(number)
        elif current == table and re.match(rf"\s*{re.escape(key)}\s*=", line):
            found.append(number)
    return found[0] if len(found) == 1 else None


def _lines_outside_strings(text: str) -> list[tuple[int, str]]:
    """The lines (numbered from 1, split at \\n alone, as TOML counts them) that do not begin
    inside a multi-line string: scanned as TOML reads them, comments and escapes included."""
    lines, open_quote = [], None  # the quotes of a multi-line string still open, if one is
    for number, line in enumerate(text.split("\n"), 1):
        if open_quote is None:
            lines.append((number, line))
        at = 0
        while at < len(line):
            if open_quote:
                if open_quote == '"""' and line[at] == "\\":  # an escape (a literal string has none)
                    at += 2
                elif line.startswith(open_quote, at):  # up to two more quotes are its text
                    at += 3
                    while at < len(line) and line[at] == open_quote[0]:
                        at += 1
                    open_quote = None
                else:
                    at += 1
            elif line[at] == "#":  # a comment: the rest of the line
                break
            elif line.startswith('"""', at) or line.startswith("'''", at):
                open_quote, at = line[at:at + 3], at + 3
            elif line[at] in "\"'":  # a one-line string: to its closing quote
                quote, at = line[at], at + 1
                while at < len(line) and line[at] != quote:
                    at += 2 if quote == '"' and line[at] == "\\" else 1
                at += 1
            else:
                at += 1
    return lines
