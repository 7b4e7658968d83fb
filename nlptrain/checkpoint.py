"""Checkpoints: written atomically by rank 0, loaded without unpickling code, resumable exactly.

A checkpoint is a folder `step-NNNNNNNN/` holding `model.safetensors` (weights; under FSDP2
`shards/` instead, model and optimizer, see sharded_checkpoint.py), `state.pt`
(optimizer, scaler, progress, every rank's RNG states, callback states; tensors and plain values
only, read with `torch.load(weights_only=True)`) and `meta.json` (with the size and checksum of
each file, see integrity.py). It is written under a temporary name, fsynced and renamed, so a
crash or power loss mid-write leaves the previous checkpoint whole; a resume takes the newest
checkpoint whose files all match their checksums.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from safetensors import SafetensorError
from torch.utils.data import IterableDataset

from nlptrain import optim
from nlptrain.config import data_order_harm, data_order_keys
from nlptrain.distributed import Backend
from nlptrain.durable import staged_folder
from nlptrain.errors import CheckpointError, CheckpointWriteError, dataloader_worker_death, every_rank
from nlptrain.integrity import (
    PREFIX,
    file_checksums,
    no_whole_checkpoint,
    pick_checkpoint,
    read_meta,
    step_folders,
    verify_checkpoint,
)
from nlptrain.random_state import rng_state, set_rng_state

log = logging.getLogger(__name__)


def identity(trainer: Any) -> dict[str, Any]:
    """What a checkpoint must match to be loaded into this trainer."""
    model = trainer.unwrapped_model
    config = getattr(model, "config", None)  # a user's own module may have none
    return {"model_type": getattr(config, "model_type", type(model).__name__),
            "labels": trainer.label_names, "kind": trainer.kind.name,
            "hidden_size": getattr(config, "hidden_size", None),
            "num_hidden_layers": getattr(config, "num_hidden_layers", None)}


def save_checkpoint(trainer: Any, folder: Path, keep: int = 0) -> None:
    """Every rank calls this; rank 0 writes `folder` (and prunes to the last `keep`)."""
    trainer.settle()  # the latest step's flags first: nothing is saved after a non-finite step
    # Every rank's random state now, and where its epoch's batches began (`_read_past`).
    began = trainer.train_batches.epoch_random
    rngs, epoch_rngs = zip(*trainer.dist.gather_objects((rng_state(), began)), strict=True)
    callbacks = trainer.callback_states()
    # The strategy's part: whole weights from rank 0, or (FSDP2) every rank's shard, written now.
    weights = trainer.strategy.checkpoint_weights(trainer.model, trainer.optimizer, folder)
    state = {"progress": trainer.progress.state_dict(), "latest": _latest_of(trainer),
             "optimizer": weights.optimizer_state,
             "scaler": trainer.scaler.state_dict(), "rng": list(rngs),
             "epoch_rng": list(epoch_rngs), "callbacks": callbacks}
    meta = {**identity(trainer), "global_step": trainer.global_step, "epoch": trainer.epoch,
            "world_size": trainer.dist.world_size, "precision": trainer.config.precision,
            "metric_for_best": trainer.metric_for_best, "best_is": trainer.config.best_is,
            "num_workers": trainer.config.num_workers,
            "data_order": {key: getattr(trainer.config, key)
                           for key in data_order_keys(trainer.config.max_tokens)}}

    def write() -> None:
        with writing(folder) as staging:
            weights.write(staging)
            torch.save(state, staging / "state.pt")
            files = file_checksums(staging)  # meta.json last: its presence means "complete"
            (staging / "meta.json").write_text(json.dumps({**meta, "files": files}, indent=1))
        if keep:
            prune_checkpoints(folder, keep)
        log.debug("checkpoint written: %s", folder)

    trainer.dist.on_main(write)


# What a write reports when the disk is full or the folder read-only: torch.save says
# "[enforce fail at inline_container.cc] unexpected pos", safetensors a SafetensorError.
WRITE_ERRORS = (OSError, RuntimeError, SafetensorError)


@contextlib.contextmanager
def writing(folder: Path) -> Iterator[Path]:
    """Fill a staging folder that then replaces `folder` whole (durable.staged_folder); a write
    that fails is one line naming the folder and the space left, and removes the staging
    folder: `folder` and the checkpoints written before it stay as they were."""
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        with staged_folder(folder) as staging:
            yield staging
    except WRITE_ERRORS as err:
        if dataloader_worker_death(err):  # raised into the write, not by it
            raise
        reason = (err.strerror if isinstance(err, OSError) and err.strerror  # not the staging path
                  else (str(err).strip().splitlines() or [type(err).__name__])[0][:200])
        if isinstance(err, RuntimeError) and "unexpected pos" in reason:  # torch.save's, on ENOSPC
            reason = "torch.save wrote it short: the disk or quota is full"
        try:
            space = f"; {shutil.disk_usage(folder.parent).free / 2**20:.0f} MB free on its disk"
        except OSError:
            space = ""
        raise CheckpointWriteError(f"{folder}: cannot be written ({reason}){space}; what was saved "
                              "before it is kept") from None


def prune_checkpoints(newest: Path, keep: int) -> None:
    """Leave `keep` checkpoints beside `newest`, the one just written among them: the others
    go, oldest first. (The Checkpointer has set aside any numbered past where the run began.)"""
    others = [p for p in list_checkpoints(newest.parent) if p != newest]
    for old in others[: max(len(others) - (keep - 1), 0)]:
        # Renamed first (at once): a kill inside rmtree left a folder without its meta.json,
        # no checkpoint any more, kept for ever; a `.tmp-` one is cleared at the next start.
        doomed = old.with_name(f".tmp-{old.name}")
        shutil.rmtree(doomed, ignore_errors=True)
        os.replace(old, doomed)
        shutil.rmtree(doomed, ignore_errors=True)


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints in `folder`, oldest first (temporary folders are not complete)."""
    return [p for p in step_folders(folder) if (p / "meta.json").is_file()]


def latest_whole_checkpoint(folder: Path, dist: Backend) -> Path | None:
    """The checkpoint to resume from: rank 0 checks the files of each, newest first, and every
    rank gets its choice. Damaged ones are named and skipped; none whole left is an error."""

    def pick() -> str | None:
        candidates = step_folders(folder)
        chosen, problems = pick_checkpoint(candidates)
        for problem in problems:
            log.warning("%s: checkpoint skipped", problem)
        if candidates and chosen is None:
            raise CheckpointError(no_whole_checkpoint(folder, problems))
        if problems:
            log.warning("resuming from %s, the newest whole checkpoint", chosen)
        return None if chosen is None else str(chosen)

    found = dist.on_main(pick)
    return None if found is None else Path(found)


def checkpoint_to_resume(path: str | Path | None, dist: Backend) -> Path | None:
    """What `Trainer(resume_from=path)` loads: `path` itself when it is one checkpoint (a
    `step-N` folder, its files checked first), else the newest whole checkpoint in it (a
    Checkpointer's folder); None when that holds none yet, so a first run starts afresh."""
    if path is None:
        return None
    path = Path(path)
    if path.exists() and not path.is_dir():  # a file never becomes a checkpoint: a wrong path
        raise CheckpointError(f"{path}: a file; resume_from takes a Checkpointer's folder or one "
                              "step-N folder")
    if not re.fullmatch(rf"{PREFIX}\d+", path.name):
        found = latest_whole_checkpoint(path, dist)
        other = sorted(p.name for p in path.iterdir() if not p.name.startswith((PREFIX, "."))
                       and "-set-aside-" not in p.name) if path.is_dir() else []
        if found is None and other:  # e.g. a saved model: its weights are no checkpoint
            raise CheckpointError(f"{path}: holds no checkpoint but other files ({', '.join(other[:3])}"
                                  f"{', ...' if len(other) > 3 else ''}): resume_from takes a "
                                  "Checkpointer's folder or one step-N folder; to start from a "
                                  "saved model, load it as the model")
        if found is None and dist.is_main:  # a first run: said, as a wrong path reads the same
            log.warning("%s: no checkpoint yet (%s), training starts from the beginning", path,
                        "an empty folder" if path.is_dir() else "no such folder")
        return found
    if not path.is_dir():  # pruned (keep_checkpoints), or mistyped: not a damaged checkpoint
        there = sorted(p.name for p in path.parent.glob(f"{PREFIX}*")) if path.parent.is_dir() else []
        raise CheckpointError(f"{path}: no such checkpoint" + (
            f"; {path.parent} holds {', '.join(there[-3:])}" if there else ""))
    problem = dist.on_main(lambda: verify_checkpoint(path))
    if problem is not None:
        raise CheckpointError(f"{problem}: cannot resume from {path}")
    return path


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:08d}"


class StepTotals(NamedTuple):
    """A step's mean loss by row and its rows, all ranks, on the device (`step_agreement.AgreedStep`'s),
    as a checkpoint gives them back to a resumed run."""

    loss: torch.Tensor
    rows: torch.Tensor


def _latest_of(trainer: Any) -> dict[str, Any]:
    """What callbacks read of the run so far, for a resume to give back: the latest step's loss,
    rows and lr, the latest evaluation's metrics. A user's metric that a checkpoint cannot hold
    is left out of them, rather than refusing the checkpoint."""
    step = trainer.latest_step
    metrics = {}
    for name, value in trainer.metrics.items():
        with contextlib.suppress(CheckpointError):
            metrics[name] = plain_state(value)
    return {"step_totals": None if step is None else [step.loss.cpu(), step.rows.cpu()],
            "step_lr": trainer.step_lr, "metrics": metrics}


def _give_back_latest(trainer: Any, latest: dict[str, Any]) -> None:
    trainer.step_lr, trainer.metrics = latest["step_lr"], dict(latest["metrics"])
    if latest["step_totals"] is not None:
        trainer.latest_step = StepTotals(*(v.to(trainer.device) for v in latest["step_totals"]))


def plain_state(value: Any, where: str = "state") -> Any:
    """A callback's checkpoint state as what `torch.load(weights_only=True)` reads back: numpy
    numbers and arrays as Python numbers and tensors, paths as strings; anything else is refused
    now, naming its key, not at the resume, where every checkpoint of the run would fail."""
    if isinstance(value, dict):
        return {k: plain_state(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain_state(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.array(value))
    if isinstance(value, Path):
        return str(value)
    if value is None or isinstance(value, bool | int | float | str | torch.Tensor | torch.dtype):
        return value
    raise CheckpointError(f"callback {where} is a {type(value).__name__}, which a checkpoint "
                          "cannot hold safely (it is read with torch.load(weights_only=True)): "
                          "store numbers, strings, lists, dicts or tensors")


def read_state(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(err))
        raise CheckpointError(f"{path}: refused: it holds Python objects that could run code when "
                              f"loaded{f' ({found.group(1)})' if found else ''}; a callback's "
                              "state should hold numbers, strings, lists, dicts or tensors") from None
    except (OSError, RuntimeError, EOFError) as err:
        raise CheckpointError(f"{path}: cannot be read ({err})") from None


def saved_precision(folder: Path) -> str | None:
    """The precision a checkpoint was trained in (a resume under "auto" keeps it)."""
    try:
        return read_meta(folder).get("precision")
    except (OSError, ValueError, UnicodeDecodeError):
        return None


def _check_stream_readers(trainer: Any, folder: Path, meta: dict[str, Any], progress: dict) -> None:
    """A stream deals its rows to its readers (ranks x DataLoader workers) by their count, and a
    resume mid-epoch skips the batches each reader had read: with another count it would skip
    other rows, training some twice and others never. Refused; at an epoch's end any count goes."""
    done, planned = int(progress.get("batch_in_epoch", 0)), int(progress.get("batches_per_epoch", 0))
    if not isinstance(trainer.train_data, IterableDataset) or not 0 < done < planned:
        return
    then = (meta["world_size"], max(int(meta.get("num_workers", trainer.config.num_workers)), 1))
    now = (trainer.dist.world_size, max(trainer.config.num_workers, 1))
    if then != now:  # (the checkpoint's and the job's facts: alike on every rank, said once)
        raise every_rank(CheckpointError(
            f"{folder}: a stream stopped mid-epoch resumes only as it was read, by {then[0]} "
            f"rank(s) x {then[1]} DataLoader worker(s) (this job: {now[0]} x {now[1]}), since its "
            "rows are dealt by that count; resume with those, or from a checkpoint at an epoch's end"))


def load_checkpoint(trainer: Any, folder: Path) -> None:
    """Restore weights, optimizer, progress, this rank's RNG and callback states."""
    warn = log.warning if trainer.is_main else log.debug  # said once, not by every rank
    if not (folder / "meta.json").is_file():
        raise CheckpointError(f"{folder}: not a complete checkpoint (no meta.json)")
    try:
        meta = read_meta(folder)
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{folder / 'meta.json'}: damaged ({err})") from None
    for key, value in identity(trainer).items():
        if meta.get(key, "single_label" if key == "kind" else None) != value:  # older: single
            raise CheckpointError(f"{folder}: made for another model or task ({key} is "
                                  f"{meta.get(key)!r} there, {value!r} here)")
    if meta.get("metric_for_best", trainer.metric_for_best) != trainer.metric_for_best:
        raise CheckpointError(f"{folder}: its best model so far was picked by "
                              f"{meta['metric_for_best']!r}; resume with that metric_for_best, not "
                              f"{trainer.metric_for_best!r} (its scores would be compared with the "
                              "other metric's)")
    if meta.get("best_is", trainer.config.best_is) != trainer.config.best_is:
        raise CheckpointError(f"{folder}: its best model so far was picked with best_is = "
                              f"{meta['best_is']!r}; resume with that, not {trainer.config.best_is!r} "
                              "(every later score would be judged the other way round)")
    changed = {key: f"{key} {value!r} -> {getattr(trainer.config, key)!r}"
               for key, value in meta.get("data_order", {}).items()
               if getattr(trainer.config, key) != value}
    if changed:
        raise CheckpointError(f"{folder}: the resume would skip the rows done in another data "
                              f"order ({', '.join(changed.values())}): "
                              f"{data_order_harm(list(changed))}; resume with the run's values")
    if meta.get("precision", trainer.config.precision) != trainer.config.precision:
        warn("%s was trained in %s; it goes on in %s, as asked", folder, meta["precision"],
             trainer.config.precision)
    state = read_state(folder / "state.pt")
    _check_stream_readers(trainer, folder, meta, state["progress"])
    configured = optim.group_settings(trainer.optimizer)
    trainer.strategy.load_checkpoint_weights(trainer.model, trainer.optimizer, folder,
                                             state["optimizer"])
    changed = optim.keep_group_settings(trainer.optimizer, configured)
    if changed:
        warn("%s: the optimizer goes on with this run's settings: %s", folder, ", ".join(changed))
    if state["scaler"] or not trainer.scaler.is_enabled():
        trainer.scaler.load_state_dict(state["scaler"])
    else:  # trained without fp16's scaler (its state is {}): torch refuses to load that
        warn("%s has no loss-scaler state (not trained in fp16): fp16's loss scaler starts at "
             "its initial scale", folder)
    # Where the epoch's sampler starts: past the samples done in it.
    trainer.train_batches.resume_samples = trainer.progress.load_state_dict(state["progress"])
    if "latest" in state:  # (not in a checkpoint written before it was kept)
        _give_back_latest(trainer, state["latest"])
    rngs = state["rng"]
    if trainer.dist.world_size == meta["world_size"]:
        set_rng_state(rngs[trainer.dist.rank])
        began = state.get("epoch_rng", [None] * len(rngs))
        trainer.train_batches.epoch_random = began[trainer.dist.rank]
    else:
        warn("%s was written by %d ranks, this job has %d: data order resumes exactly, dropout "
             "randomness does not", folder, meta["world_size"], trainer.dist.world_size)
    trainer.load_callback_states(state["callbacks"])
    if trainer.epoch >= trainer.config.epochs and trainer.batch_in_epoch:  # epochs lowered
        warn("resumed from %s: the run stopped inside epoch %d (step %d), past the %d epoch(s) "
             "asked for now: nothing more is trained, and it ends as it stopped, mid-epoch",
             folder, trainer.epoch + 1, trainer.global_step, trainer.config.epochs)
    elif trainer.epoch >= trainer.config.epochs:  # the run trained all it asked for (e.g. a
        # crash in the final test or export): nothing is trained again; raise `epochs` to train on
        log.info("resumed from %s: the run had finished %d epoch(s) (step %d)%s; nothing left "
                 "to train", folder, trainer.epoch, trainer.global_step,
                 f", past the {trainer.config.epochs} asked for now"
                 if trainer.epoch > trainer.config.epochs else "")
    else:
        log.info("resumed from %s (epoch %d, step %d)", folder, trainer.epoch + 1,
                 trainer.global_step)


def export_model(model: torch.nn.Module, tokenizer: Any, folder: str | Path,
                 state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """`save_pretrained` of model and tokenizer (label names in config), replaced atomically;
    `state_dict`: whole weights gathered from a sharded model."""
    with writing(Path(folder)) as staging:
        if hasattr(model, "save_pretrained"):
            model.save_pretrained(staging, state_dict=state_dict)
        else:  # a user's own module: its weights; it is rebuilt by the user's code
            from safetensors.torch import save_file, save_model

            if state_dict is None:
                save_model(model, str(staging / "model.safetensors"))
            else:
                save_file(state_dict, str(staging / "model.safetensors"))
        if tokenizer is not None:
            save_tokenizer(tokenizer, staging, getattr(getattr(model, "config", None),
                                                       "nlptrain_max_length", None))


def save_tokenizer(tokenizer: Any, folder: Path, max_length: int | None) -> None:
    """`save_pretrained`, with `model_max_length` the length the rows were truncated at in
    training, where known: `pipeline(..., truncation=True)` then truncates the export's input as
    training did (not at the tokenizer's own 512). The caller's tokenizer is left as it was."""
    own = getattr(tokenizer, "model_max_length", None)
    changed = bool(max_length) and own is not None
    if changed:
        tokenizer.model_max_length = max_length
    try:
        tokenizer.save_pretrained(folder)
    finally:
        if changed:
            tokenizer.model_max_length = own
