"""Task files: TOML with `[data]`, `[model]` and `[train]` sections, checked against dataclasses.

Every field's `help` is what `--help` prints, so the dataclasses below are the one reference for
what a task file may say. Unknown keys and wrong types are errors that name the file and key.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nlptrain.errors import ConfigError


def opt(default: Any, help: str, **extra: Any) -> Any:
    """A dataclass field with its help text (shown by `--help`)."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help, **extra})
    return field(default=default, metadata={"help": help, **extra})


@dataclass
class FileSpec:
    """One data file. A plain string in a task file sets `path`; the rest come from [data]."""

    path: str = opt("", "file path, relative to --data-dir")
    format: str = opt("auto", "tsv | csv | jsonl | parquet | lines (one text a line, a file per label)")
    header: bool = opt(True, "tsv/csv: the first row names the columns")
    quoted: bool = opt(False, "tsv: a cell may be CSV-quoted (\"...\" with \"\" inside), as "
                       "GoEmotions' files are; else quotes are plain text")
    text_column: str | int = opt("text", "column (name, or 0-based index) holding the text")
    text_pair_column: str | int = opt("", "column holding a pair's second text ('': one text a row)")
    label_column: str | int = opt("label", "column (name, or 0-based index) holding the label")


@dataclass
class DataConfig:
    train: str | dict = opt("", "training file; for format 'lines' a path with {label}")
    valid: str | dict = opt("", "validation file (optional; else valid_size of train, if > 0)")
    test: str | dict = opt("", "test file (optional; else a stratified split of train)")
    format: str = opt("auto", "default format: tsv | csv | jsonl | parquet | lines | auto (by extension)")
    header: bool = opt(True, "tsv/csv files start with a header row")
    quoted: bool = opt(False, "tsv: cells may be CSV-quoted (else quotes are plain text)")
    text_column: str | int = opt("text", "default text column (name or 0-based index)")
    text_pair_column: str | int = opt(
        "", "second text column of a sentence-pair task (name or index; '': one text a row); "
        "encoded as a real pair, with token_type_ids")
    label_column: str | int = opt("label", "default label column (name or 0-based index)")
    kind: str = opt("single_label", "single_label (one class a row) | multi_label (any number of "
                    "classes: a JSON list, or a string split on label_separator) | regression "
                    "(a number)")
    label_separator: str = opt(",", "multi_label: what separates the labels of a tsv/csv cell")
    threshold: float = opt(0.5, "multi_label: a label is predicted when its probability reaches this")
    labels: list | dict = opt(
        [], "label names in id order, or a table {value in file = name}; empty: from train data"
    )
    test_size: float = opt(0.1, "fraction of train held out as test when there is no test file")
    valid_size: float = opt(0.0, "fraction of train held out for validation when there is no valid file")
    split_seed: int = opt(42, "seed of the stratified train/valid/test split")
    cache_dir: str = opt("", "token cache folder ('': next to the data if writable, else "
                         "~/.cache/nlptrain)")
    train_shards: str = opt("", "folder from `nlptrain split` (manifest + one file per rank); each "
                            "rank then reads only its own file instead of [data] train")
    shard_shuffle: bool = opt(False, "train_shards: reshuffle each rank's rows every epoch (seed + "
                              "epoch); else read them in file order")
    uneven_shards: str = opt("drop", "train_shards of different sizes: drop (every rank takes the "
                             "shortest's batch count) | wrap (short ranks repeat rows up to the longest)")
    streaming: bool = opt(False, "read [data] train lazily, sharded by rank and DataLoader worker "
                          "(for files too big to load); needs [data] labels")
    shuffle_buffer: int = opt(10000, "streaming: rows held in the shuffle buffer (0: file order)")


@dataclass
class ModelConfig:
    name: str = opt("minilm", "a short name (minilm) or a local model directory", flag="--model")
    max_length: int = opt(128, "truncate texts to this many tokens")
    num_hidden_layers: int = opt(0, "keep only the first N encoder layers (0: all); faster")


@dataclass
class TrainConfig:
    epochs: int = opt(3, "passes over the training data")
    batch_size: int = opt(16, "examples per micro-batch on each process (global batch = this x "
                          "grad_accum x world size)")
    eval_batch_size: int = opt(64, "examples per evaluation batch on each process")
    lr: float = opt(5e-5, "peak learning rate (AdamW)")
    scale_lr: bool = opt(False, "multiply lr by the world size (linear scaling rule)")
    weight_decay: float = opt(0.01, "AdamW weight decay (not on biases and LayerNorm)")
    scheduler: str = opt("linear", "learning-rate schedule: linear | cosine | constant | "
                         "constant_with_warmup (transformers)")
    warmup_ratio: float = opt(0.1, "fraction of all steps spent warming the lr up from 0")
    warmup_steps: int = opt(0, "warm the lr up over this many optimizer steps instead (0: "
                            "warmup_ratio)")
    max_grad_norm: float = opt(1.0, "clip the gradient norm to this (0: off)")
    grad_accum: int = opt(1, "micro-batches per optimizer step")
    precision: str = opt("auto", "auto (bf16 where this device runs it measurably faster, else "
                         "fp32; logged; NLPTRAIN_AUTO_PRECISION=fp32|bf16 pins it) | fp32 | "
                         "bf16 (autocast, CPU or GPU) | fp16 (autocast + "
                         "scaler, GPU)")
    max_tokens: int = opt(0, "build batches by a token budget instead of batch_size rows: as many "
                          "rows as fit in N padded tokens (rows x longest), length-grouped, "
                          "shuffled (0: off)")
    compile: bool = opt(False, "torch.compile the model (GPU: fuses the small ops between the "
                        "matmuls; the first steps of each new shape wait for the compiler; on "
                        "CPUs measured slower, bench/README.md)")
    activation_checkpointing: bool = opt(
        False, "keep only each encoder layer's input and run the layer again in the backward "
        "(transformers' gradient checkpointing): far less activation memory, for longer rows or "
        "bigger batches, at about one more forward of compute")
    padding: str = opt("dynamic", "dynamic (pad to the longest in the batch) | max_length")
    pad_to_multiple_of: int = opt(8, "dynamic padding: round each batch's length up to a multiple "
                                  "of N, not past max_length (fewer shapes for the kernels' "
                                  "per-shape caches; 1: the longest row exactly)")
    group_by_length: bool = opt(True, "batch texts of similar length together (shuffled groups)")
    keep_freed_memory: bool = opt(True, "CPU: keep freed memory in the process for the next step's "
                                  "large buffers (glibc; no page faults each step); false: give it "
                                  "back to the system")
    cpu_dropout: bool = opt(True, "CPU: draw dropout masks from 16 random bits an element (torch "
                            "draws a bernoulli for each) and run attention dropout outside SDPA's "
                            "fp32 math path: 1.15x a bf16 MiniLM step; other masks than torch's "
                            "for a seed, at the same rate; false: torch's own")
    sync_touched_rows: bool = opt(True, "ddp on a CPU over gloo's sockets: all-reduce only the "
                                  "word-embedding rows some rank's batch touched (the same "
                                  "result; the others are zero); false: all of them")
    shared_memory_all_reduce: bool = opt(True, "ddp on a CPU, ranks on one host: sum gradients "
                                         "in /dev/shm, not gloo's sockets (the same sums)")
    drop_last: bool = opt(False, "drop each process's last batch of an epoch when it is short of "
                          "batch_size (no effect under max_tokens: its batches are cut by tokens)")
    seed: int = opt(42, "seed for weights of new layers, shuffling and dropout")
    eval_every: int = opt(0, "also evaluate every N optimizer steps (always at each epoch end)")
    metric_for_best: str = opt(
        "", "metric that picks the best model ('': the kind's own: accuracy, micro_f1, pearson); "
        "single_label: accuracy | macro_f1 | mcc | f1 (two labels), multi_label: micro_f1 | "
        "macro_f1 | subset_accuracy, regression: pearson | spearman | mse | mae; any: loss. mse, "
        "mae and loss are better lower")
    best_is: str = opt("auto", "which way metric_for_best improves: higher | lower | auto (lower "
                       "for loss, mse and mae, higher for the rest; give lower for your own "
                       "error metric, e.g. rmse)")
    early_stopping: int = opt(0, "stop after N evaluations without improvement (0: off)")
    checkpoint_every: int = opt(0, "write a checkpoint every N optimizer steps (0: epoch ends only)")
    checkpoint_minutes: float = opt(30.0, "also write one when this many minutes have passed since "
                                    "the last, so a hard crash loses no more (0: off)")
    keep_checkpoints: int = opt(2, "how many recent checkpoints to keep (0: all)")
    log_every: int = opt(10, "log loss and lr every N optimizer steps")
    steps_per_epoch: int = opt(0, "steps per epoch: at most one pass of a dataset; exactly this "
                               "many of a stream or an iterable without a length, which need it "
                               "(0: one pass)")
    max_steps: int = opt(0, "stop after at most this many optimizer steps in all, even inside an "
                         "epoch, the lr schedule ending there; the epochs may end the run sooner "
                         "(0: epochs decide)")
    num_workers: int = opt(0, "DataLoader worker processes per rank")
    timeout: int = opt(600, "seconds a rank waits for the others in a collective before failing")
    strategy: str = opt("auto", "auto (ddp when more than one rank) | ddp (a full replica per rank) "
                        "| fsdp (FSDP2: weights, gradients, Adam state sharded across ranks)")
    reshard_after_forward: bool = opt(True, "fsdp: free each layer's gathered weights after its "
                                      "forward (like ZeRO-3; false: keep them to the backward, "
                                      "like ZeRO-2)")
    class_weights: str | list = opt(
        "", "weigh each class in the loss: 'balanced' (from the training targets) or one number "
        "per label; single_label: cross-entropy weights, multi_label: BCE pos_weight ('': off)")
    label_smoothing: float = opt(0.0, "single_label: spread this much of each target over all "
                                 "classes (cross-entropy label smoothing; 0: off)")
    layer_lr_decay: float = opt(1.0, "layer-wise lr decay: the head at lr, each lower encoder layer "
                                "times this, the embeddings last (1: off)")
    ema_decay: float = opt(0.0, "keep an exponential moving average of the weights with this decay "
                           "(e.g. 0.999) and evaluate and export it (0: off)")


@dataclass
class TaskConfig:
    name: str = opt("task", "task name, used for the run directory (a task file without one: its file name)")
    description: str = opt("", "one line about the task")
    data_dir: str = opt("", "where data paths start; relative to the task file (--data-dir wins)")
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


SECTIONS = {"data": DataConfig, "model": ModelConfig, "train": TrainConfig}


def _type_ok(value: Any, hint: Any) -> bool:
    options = hint.__args__ if isinstance(hint, types.UnionType) else (hint,)
    for kind in options:
        if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return True
        if kind is int and isinstance(value, bool):
            continue
        if isinstance(value, kind):
            return True
    return False


def _fill(cls: type, values: dict[str, Any], where: str) -> Any:
    """Build dataclass `cls` from a TOML table, refusing unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"{where}: unknown key '{key}'. Valid keys: {', '.join(hints)}")
        if not _type_ok(value, hints[key]):
            wanted = getattr(hints[key], "__name__", str(hints[key]))
            raise ConfigError(
                f"{where}: '{key}' must be {wanted}, got {type(value).__name__} {value!r}"
            )
    return cls(**values)


def train_config(config: TrainConfig | dict[str, Any] | None,
                 where: str = "Trainer(config=...)") -> TrainConfig:
    """The Python API's config: a TrainConfig, or a dict of its keys, checked as a task file's
    [train] is (unknown keys, types), so that lr="3e-5" is refused here, not inside a step."""
    if config is None:
        return TrainConfig()
    if isinstance(config, dict):
        config = _fill(TrainConfig, config, where)
    if not isinstance(config, TrainConfig):
        raise ConfigError(f"{where}: give a TrainConfig, or a dict of its keys, not "
                          f"{type(config).__name__}")
    _fill(TrainConfig, dataclasses.asdict(config), where)
    validate(TaskConfig(train=config), where, sections=("train",))
    return config


def task_from_dict(raw: dict[str, Any], source: str) -> TaskConfig:
    top = {k: v for k, v in raw.items() if k not in SECTIONS}
    task = _fill(TaskConfig, top, source)
    for name, cls in SECTIONS.items():
        table = raw.get(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{source}: '{name}' must be a [{name}] table")
        setattr(task, name, _fill(cls, table, f"{source} [{name}]"))
    validate(task, source)
    return task


def load_task(path: str | Path) -> TaskConfig:
    """Read a task file. Relative `data_dir` is taken relative to the file itself."""
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8-sig"))  # (Notepad's BOM: no TOML)
    except FileNotFoundError:
        raise ConfigError(f"{path}: task file not found (see the files in tasks/)") from None
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except UnicodeDecodeError as err:  # TOML is UTF-8 by its spec
        line = err.object[:err.start].count(b"\n") + 1
        raise ConfigError(f"{path}:{line}: byte {err.object[err.start]:#04x} is not UTF-8 (a TOML "
                          "file must be UTF-8); save it as UTF-8") from None
    task = task_from_dict(raw, str(path))
    if "name" not in raw:  # runs/<file's stem>-<time>, not runs/task-<time> for every such file
        task.name = path.stem
    if task.data_dir and not Path(task.data_dir).is_absolute():
        task.data_dir = str((path.parent / task.data_dir).resolve())
    return task


FILES = ("train", "valid", "test")  # [data] entries that may be a table of their own (FileSpec)


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
        _fill(type(target), {key: value}, source)  # type and name check only
        setattr(target, key, value)


def _set_file_key(task: TaskConfig, which: str, key: str, value: Any, source: str) -> None:
    """`data.test.header=false`: one key of one file's own table (a path alone becomes one)."""
    _fill(FileSpec, {key: value}, source)
    entry = getattr(task.data, which)
    table = dict(entry) if isinstance(entry, dict) else {"path": entry} if entry else {}
    setattr(task.data, which, {**table, key: value})


# What orders and cuts an epoch's batches: a resume skips the rows done in that order, so with
# another order it would train some rows twice and others never (checked by the CLI against
# config.json and by load_checkpoint against the checkpoint).
DATA_ORDER_KEYS = ("seed", "batch_size", "max_tokens", "padding", "group_by_length")


CHOICES = {
    ("data", "format"): {"auto", "tsv", "csv", "jsonl", "parquet", "lines"},
    ("data", "uneven_shards"): {"drop", "wrap"},
    ("train", "precision"): {"auto", "fp32", "bf16", "fp16"},
    ("train", "padding"): {"dynamic", "max_length"},
    ("train", "scheduler"): {"linear", "cosine", "constant", "constant_with_warmup"},
    ("data", "kind"): {"single_label", "multi_label", "regression"},
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
    for section, key in positive:
        if section in sections and value(section, key) < 1:
            raise ConfigError(f"{source}: [{section}] {key} must be at least 1")
    for section, key in NOT_NEGATIVE:
        if section in sections and value(section, key) < 0:
            raise ConfigError(f"{source}: [{section}] {key} must be at least 0")
    for section, key in (("train", "seed"), ("data", "split_seed")):  # numpy's and sklearn's range
        if section in sections and not 0 <= value(section, key) < 2**32:
            raise ConfigError(f"{source}: [{section}] {key} must be in [0, 4294967295]")
    if "train" in sections and not 0 <= task.train.warmup_ratio <= 1:
        raise ConfigError(f"{source}: [train] warmup_ratio must be in [0, 1]")
    if set(sections) != set(SECTIONS):  # one section alone: nothing else to fit it to
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
    for key in ("threshold", "label_separator"):  # set away from its default: meant to act
        if task.data.kind != "multi_label" and getattr(task.data, key) != getattr(DataConfig, key):
            raise ConfigError(f"{source}: [data] {key} is for multi_label tasks; this one is "
                              f"{task.data.kind} ([data] kind)")
    if task.train.metric_for_best:
        from nlptrain.kinds import from_task

        from_task(task).check_metric(task.train.metric_for_best, source, task.data.labels or ())
    validate_finetuning(task.train, task.data.kind, source)
    if task.data.kind == "regression" and task.data.labels:  # else dropped without a word
        raise ConfigError(f"{source}: [data] labels name classes; a regression task has none: "
                          "leave them out (data.labels=[])")
    for which in FILES:  # a file's own table: its keys now, not when the file is read
        entry = getattr(task.data, which)
        if isinstance(entry, dict) and not _fill(FileSpec, entry, f"{source} [data] {which}").path:
            raise ConfigError(f"{source}: [data] {which} has no path (set data.{which}.path)")
    # Each label is one output of the model: a name twice would train two outputs for one class
    # and fail at the end of the run (plots, the confusion matrix, the export's label2id).
    labels = task.data.labels
    names = [str(v) for v in (labels.values() if isinstance(labels, dict) else labels)]
    twice = sorted({name for name in names if names.count(name) > 1})
    if twice:
        raise ConfigError(f"{source}: [data] labels: {', '.join(map(repr, twice))} named more than "
                          "once; give each label one name of its own")
    for key in ("test_size", "valid_size"):
        if not 0 <= getattr(task.data, key) < 1:
            raise ConfigError(f"{source}: [data] {key} must be in [0, 1)")


def validate_finetuning(train: TrainConfig, kind: str, source: str) -> None:
    """class_weights, label_smoothing, layer_lr_decay, ema_decay: values, and the kinds they fit."""
    weights = train.class_weights
    if isinstance(weights, str) and weights not in ("", "balanced"):
        raise ConfigError(f"{source}: [train] class_weights = {weights!r}; give 'balanced' or a list "
                          "of numbers, one per label (--class-weights 1,3 or [1, 3])")
    if isinstance(weights, list) and not all(
            isinstance(w, int | float) and not isinstance(w, bool) and w >= 0 for w in weights):
        raise ConfigError(f"{source}: [train] class_weights = {weights!r}: each weight must be a "
                          "number >= 0")
    if weights not in ("", []) and kind == "regression":
        raise ConfigError(f"{source}: [train] class_weights is for classes; a regression task has none")
    if not 0 <= train.label_smoothing < 1:
        raise ConfigError(f"{source}: [train] label_smoothing must be in [0, 1)")
    if train.label_smoothing and kind != "single_label":
        raise ConfigError(f"{source}: [train] label_smoothing is for single_label tasks, not {kind}")
    if not 0 < train.layer_lr_decay <= 1:
        raise ConfigError(f"{source}: [train] layer_lr_decay must be in (0, 1] (1: off)")
    if not 0 <= train.ema_decay < 1:
        raise ConfigError(f"{source}: [train] ema_decay must be in [0, 1) (0: off)")


def file_spec(task: TaskConfig, which: str) -> FileSpec | None:
    """The [data] entry `which` (train/valid/test) as a FileSpec, or None when not given."""
    entry = getattr(task.data, which)
    if not entry:
        return None
    defaults = {f.name: getattr(task.data, f.name) for f in dataclasses.fields(FileSpec)
                if f.name != "path"}
    values = {"path": entry} if isinstance(entry, str) else entry
    return _fill(FileSpec, {**defaults, **values}, f"[data] {which}")
