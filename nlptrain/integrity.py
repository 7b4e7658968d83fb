"""Is a checkpoint whole? Sizes and checksums of its files, checked before anything is loaded.

At save, `meta.json` records the size and SHA-256 of every other file in the checkpoint folder
(whatever files a checkpoint format writes, in subfolders too). On resume, the newest checkpoint
whose files all match is taken; a damaged one (a full disk, a copy cut short, a bad sector) is
named in one line and skipped.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from pathlib import Path

META = "meta.json"
SHARDS = "shards"  # the folder of a sharded (FSDP2) checkpoint's state: sharded_checkpoint.py


def whole_weights_refusal(folder: Path, world_size: int) -> str | None:
    """Why FSDP2 on `world_size` processes cannot resume checkpoint `folder`, or None: it loads
    its shards alone, and a checkpoint written by one process or under DDP holds whole weights."""
    if (folder / SHARDS).is_dir():
        return None
    return (f"{folder}: holds whole weights (written by one process, or under ddp), which fsdp on "
            f"{world_size} processes cannot load; resume it with [train] strategy = ddp, or in "
            "one process")


def _sha256(path: Path) -> str:
    with open(path, "rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def file_checksums(folder: Path) -> dict[str, dict[str, int | str]]:
    """{relative path: {"bytes", "sha256"}} of every file under `folder` but meta.json."""
    found = sorted(p for p in Path(folder).rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
            for p in found if p.relative_to(folder).as_posix() != META}


def read_meta(folder: Path) -> dict:
    """meta.json of a checkpoint (ValueError when it is not a JSON object)."""
    meta = json.loads((Path(folder) / META).read_text(encoding="utf-8"))
    if not isinstance(meta, dict):
        raise ValueError("not a JSON object")
    return meta


def verify_checkpoint(folder: Path) -> str | None:
    """None when every file of the checkpoint is whole, else one line naming the first damage.

    Checkpoints written before checksums were recorded have only their meta.json checked."""
    folder = Path(folder)
    if not (folder / META).is_file():
        return f"{folder / META}: missing (an incomplete checkpoint)"
    try:
        meta = read_meta(folder)
    except (ValueError, UnicodeDecodeError) as err:
        return f"{folder / META}: damaged (not valid JSON: {str(err)[:80]})"
    files = meta.get("files", {})
    # The files as they are now: a resume checks its checkpoint before its run's record changes
    # and again as it loads it, but reads each file once.
    stamp = (str(folder.resolve()), tuple((name, _stamp(folder / name)) for name in files))
    if stamp not in _verified:
        _verified[stamp] = damage(folder, files)
    return _verified[stamp]


_verified: dict[tuple, str | None] = {}  # (folder, its files' mtime and size) -> verify's answer


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        info = path.stat()
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def damage(folder: Path, files: dict[str, dict]) -> str | None:
    """The first of `files` (as `file_checksums` recorded them) missing or changed under
    `folder`, in one line; None when all are whole."""
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            return f"{path}: missing"
        size = path.stat().st_size
        if size != expected["bytes"]:
            return f"{path}: damaged (size {size} of {expected['bytes']} bytes)"
        if _sha256(path) != expected["sha256"]:
            return f"{path}: damaged (checksum mismatch)"
    return None


def no_whole_checkpoint(folder: Path, problems: list[str]) -> str:
    """The error of a resume whose checkpoints are all damaged."""
    return (f"{folder}: no whole checkpoint left to resume from ({len(problems)} damaged; the "
            f"newest: {problems[0]}); start again with --overwrite")


PREFIX = "step-"


def step_folders(folder: Path) -> list[Path]:
    """Every `step-N` folder in `folder`, complete or not, oldest first; a copy of one under
    another name (`step-00000300-backup`, a set-aside branch) is none to resume, and left alone."""
    found = [p for p in folder.glob(f"{PREFIX}*") if p.is_dir()
             and re.fullmatch(rf"{PREFIX}\d+", p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))


def pick_checkpoint(folders: Sequence[Path]) -> tuple[Path | None, list[str]]:
    """The newest whole checkpoint of `folders` (oldest first), and the damage found in newer ones."""
    problems = []
    for folder in reversed(folders):
        problem = verify_checkpoint(folder)
        if problem is None:
            return folder, problems
        problems.append(problem)
    return None, problems
