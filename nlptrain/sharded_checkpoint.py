"""Sharded model + optimizer state with `torch.distributed.checkpoint` (DCP), for FSDP2.

Each rank writes its own shard (`__<rank>_0.distcp`), rank 0 the `.metadata` that says which
slice of which tensor lies where; a job of another world size reads the slices its shards need
(DCP reshards on load). The shards go to a temporary folder beside the checkpoint first; rank 0
moves that folder into the checkpoint's staging folder, which `checkpoint.py` renames into place
as it does for whole weights, so a crash mid-write leaves the previous checkpoint whole.
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from nlptrain.distributed import Backend
from nlptrain.errors import CheckpointError
from nlptrain.integrity import SHARDS


def save_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, folder: Path,
                dist: Backend) -> Path:
    """Every rank: write its shard of model and optimizer state for checkpoint `folder` into a
    temporary folder beside it, and return that folder (complete on return, on every rank)."""
    shards = folder.parent / f".tmp-{folder.name}.{SHARDS}"

    def clear() -> None:
        folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(shards, ignore_errors=True)

    dist.on_main(clear)  # also the barrier: nobody writes before the old files are gone
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # DCP's collectives in the file-work group: a slow disk is not a hang (distributed.py).
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(shards),
             process_group=getattr(dist, "main_work_group", None))
    dist.barrier()  # rank 0 wrote .metadata after every rank reported its shard
    return shards


def load_shards(model: torch.nn.Module, optimizer: torch.optim.Optimizer, shards: Path,
                dist: Backend | None = None) -> None:
    """Every rank: read the slices of its own shards (any world size wrote them) and set them."""
    from torch.distributed.checkpoint.api import CheckpointException

    # The optimizer's state is made (zero steps) so that DCP knows the shapes to read into.
    model_state, optimizer_state = get_state_dict(model, optimizer)
    # A parameter frozen when the checkpoint was written (Freeze) had no optimizer state: it
    # gets none now either, as in the run that never stopped.
    saved = dcp.FileSystemReader(str(shards)).read_metadata().state_dict_metadata
    stateless = [name for name in optimizer_state["state"]
                 if not any(key.startswith(f"optimizer.state.{name}.") for key in saved)]
    for name in stateless:
        del optimizer_state["state"][name]
    # A schedule's base lr (`initial_lr`, put in the groups by the scheduler, which a resume
    # makes only later) is read only where the template has the key; without it the resumed
    # run took the lr of the checkpoint's step for its base, and said the lr had changed.
    for i, group in enumerate(optimizer_state["param_groups"]):
        if f"optimizer.param_groups.{i}.initial_lr" in saved:
            group.setdefault("initial_lr", group["lr"])
    try:
        with warnings.catch_warnings():
            # One process reads every shard itself, as meant; DCP warns of it even when told.
            warnings.filterwarnings("ignore", "torch.distributed is disabled, unavailable")
            dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(shards),
                     process_group=getattr(dist, "main_work_group", None),
                     no_dist=not torch.distributed.is_initialized())
    except (Exception, CheckpointException) as err:  # a rank's failure, wrapped by DCP
        raise CheckpointError(f"{shards}: sharded state cannot be read "
                              f"({str(err).splitlines()[0][:200]})") from None
    # Not strict: the stateless parameters above are meant to have no optimizer state (every
    # key DCP was given, it read, so nothing else is missing).
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state,
                   options=StateDictOptions(strict=not stateless))
    params = dict(model.named_parameters())
    for name in stateless:
        optimizer.state.pop(params[name], None)
