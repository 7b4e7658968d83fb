"""A task's settings: `[data]`, `[model]` and `[train]`, one dataclass each (`TaskConfig` holds
them), and `fill`, which builds one from a table of its keys, refusing unknown keys and types.

Every field's `help` is what `--help` prints, so the dataclasses below are the one reference for
what a task file may say. Reading and checking a task: `nlptrain.task_files`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any

from nlptrain.errors import ConfigError
from nlptrain.kinds import DEFAULT, KINDS, LOWER_IS_BETTER


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


# What the help says of each kind, from the kinds themselves (nlptrain.kinds).
def _kinds_taking(key: str) -> str:
    """The kinds that read [data] `key`, or that take [train] `key` (`takes_<key>`)."""
    return " | ".join(k.name for k in KINDS.values()
                      if key in k.settings or getattr(k, f"takes_{key}", False))


def _metrics_help() -> str:
    per_kind = ", ".join(f"{k.name}: " + " | ".join(
        f"{m} ({k.metric_notes[m]})" if m in k.metric_notes else m for m in k.metric_names)
        for k in KINDS.values())
    lower = [*dict.fromkeys(m for k in KINDS.values() for m in k.metric_names if m in LOWER_IS_BETTER),
             "loss"]
    return (f"metric that picks the best model ('': the kind's own: "
            f"{', '.join(k.default_metric for k in KINDS.values())}); {per_kind}; any: loss. "
            f"{', '.join(lower[:-1])} and {lower[-1]} are better lower")


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
    kind: str = opt(DEFAULT.name, " | ".join(f"{k.name} ({k.described})" for k in KINDS.values()))
    label_separator: str = opt(",", f"{_kinds_taking('label_separator')}: what separates the "
                               "labels of a tsv/csv cell")
    threshold: float = opt(0.5, f"{_kinds_taking('threshold')}: a label is predicted when its "
                           "probability reaches this")
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
    grad_accum: int = opt(1, "micro-batches per optimizer step (the step's loss is the mean over "
                          "all their rows, on every rank; over each rank's own files or a stream, "
                          "the mean of their means)")
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
    padding: str = opt("dynamic", "dynamic (pad to the longest in the batch) | max_length (the "
                       "[model] max_length; a Python Trainer: collate=Collator(pad_to=N))")
    pad_to_multiple_of: int = opt(8, "dynamic padding: round each batch's length up to a multiple "
                                  "of N, not past max_length (fewer shapes for the kernels' "
                                  "per-shape caches; 1: the longest row exactly)")
    group_by_length: bool = opt(True, "batch texts of similar length together (shuffled groups; "
                                "max_tokens always does)")
    keep_freed_memory: bool = opt(True, "CPU: keep freed memory in the process for the next step's "
                                  "large buffers (glibc; no page faults each step); false: give it "
                                  "back to the system")
    cpu_dropout: bool = opt(True, "CPU: draw dropout masks from 16 random bits an element (torch "
                            "draws a bernoulli for each) and run attention dropout outside SDPA's "
                            "fp32 math path: 1.16-1.43x a bf16 MiniLM step; other masks than torch's "
                            "for a seed, at the same rate; false: torch's own")
    sync_touched_rows: bool = opt(True, "ddp on a CPU: sum only the "
                                  "word-embedding rows some rank's batch touched (the same "
                                  "result; the others are zero); false: all of them")
    shared_memory_all_reduce: bool = opt(True, "ddp on a CPU, ranks on one host: sum gradients "
                                         "in /dev/shm, not gloo's sockets (the same sums)")
    drop_last: bool = opt(False, "drop each process's last batch of an epoch when it is short of "
                          "batch_size (no effect under max_tokens: its batches are cut by tokens)")
    seed: int = opt(42, "seed for weights of new layers, shuffling and dropout")
    eval_every: int = opt(0, "also evaluate every N optimizer steps (always at each epoch end)")
    metric_for_best: str = opt("", _metrics_help())
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
    timeout: int = opt(600, "seconds a rank waits for the others in a collective (and for a "
                       "DataLoader worker's batch) before failing")
    strategy: str = opt("auto", "auto (ddp when more than one rank) | ddp (a full replica per rank) "
                        "| fsdp (FSDP2: weights, gradients, Adam state sharded across ranks)")
    reshard_after_forward: bool = opt(True, "fsdp: free each layer's gathered weights after its "
                                      "forward (like ZeRO-3; false: keep them to the backward, "
                                      "like ZeRO-2)")
    class_weights: str | list = opt(
        "", "weigh each class in the loss: 'balanced' (from the training targets) or one number "
        "per label; " + ", ".join(f"{k.name}: {k.class_weights_described}" for k in KINDS.values()
                                  if k.takes_class_weights) + " ('': off)")
    label_smoothing: float = opt(0.0, f"{_kinds_taking('label_smoothing')}: spread this much of "
                                 "each target over all classes (cross-entropy label smoothing; 0: off)")
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


def fill(cls: type, values: dict[str, Any], where: str) -> Any:
    """Build dataclass `cls` from a TOML table, refusing unknown keys and wrong types."""
    hints = typing.get_type_hints(cls)
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"{where}: unknown key '{key}'. Valid keys: {', '.join(hints)}")
        if not _type_ok(value, hints[key]):
            wanted = getattr(hints[key], "__name__", str(hints[key]))
            listed = ""
            if isinstance(value, str) and "," in value and _type_ok([], hints[key]):
                # `--set data.labels=neg,pos`: words are no TOML values, as numbers are (the
                # shell has taken the quotes off ["neg","pos"]: [neg,pos])
                words = ",".join(f'"{word.strip()}"' for word in value.strip("[]").split(","))
                listed = (f"; quote the list for the shell: --set '{where.split('=')[0][6:]}"
                          f"=[{words}]'" if where.startswith("--set ")
                          else f"; a list of words is written with quotes: {key} = [{words}]")
            raise ConfigError(
                f"{where}: '{key}' must be {wanted}, got {type(value).__name__} {value!r}{listed}"
            )
    return cls(**values)


FILES = ("train", "valid", "test")  # [data] entries that may be a table of their own (FileSpec)


# What orders and cuts an epoch's batches: a resume skips the rows done in that order, so with
# another order it would train some rows twice and others never (checked by the CLI against
# config.json and by load_checkpoint against the checkpoint). grad_accum too: its windows are
# counted from the epoch's start, so another one cut the first after a resume short. Batches of
# batch_size rows are grouped by the rows' own lengths; a token budget's are planned on the
# padded widths, and take neither batch_size nor group_by_length.
DATA_ORDER_KEYS = ("seed", "max_tokens", "grad_accum")
ROW_BATCH_KEYS = ("batch_size", "group_by_length")
TOKEN_BUDGET_KEYS = ("padding", "pad_to_multiple_of")


def data_order_harm(changed: list[str]) -> str:
    """Why a resume with these DATA_ORDER_KEYS changed would train wrongly, in a few words."""
    harms = []
    if set(changed) - {"grad_accum"}:
        harms.append("some rows would be trained twice, others never")
    if "grad_accum" in changed:
        harms.append("the first step after it would sum another count of micro-batches than it "
                     "divides by")
    return "; ".join(harms)


def data_order_keys(max_tokens: int) -> tuple[str, ...]:
    """The settings that order an epoch's batches, with a token budget (`max_tokens`) or not."""
    return DATA_ORDER_KEYS + (TOKEN_BUDGET_KEYS if max_tokens else ROW_BATCH_KEYS)


def file_spec(task: TaskConfig, which: str) -> FileSpec | None:
    """The [data] entry `which` (train/valid/test) as a FileSpec, or None when not given."""
    entry = getattr(task.data, which)
    if not entry:
        return None
    defaults = {f.name: getattr(task.data, f.name) for f in dataclasses.fields(FileSpec)
                if f.name != "path"}
    values = {"path": entry} if isinstance(entry, str) else entry
    return fill(FileSpec, {**defaults, **values}, f"[data] {which}")
