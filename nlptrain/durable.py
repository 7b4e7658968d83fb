"""Durable writes: stage under a temporary name, fsync, rename into place, fsync the folder.

A rename alone is atomic but not durable: after a power loss the new name can point at empty
files, because the data were still in the page cache. So the staged files are fsynced before the
rename, and the folder holding the new name after it. A crash at any point leaves either the old
file (or folder) whole or the new one whole, never a mix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO


def fsync_file(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(folder: Path) -> None:
    """fsync a folder, so that the names in it (a rename, a new file) survive a power loss."""
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # a platform without directory handles (Windows): nothing more to do
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """fsync every file under `folder`, then every folder, deepest first."""
    folders = []
    for root, _, files in os.walk(folder):
        for name in files:
            fsync_file(Path(root) / name)
        folders.append(Path(root))
    for path in reversed(folders):
        fsync_dir(path)


def replace_file(staging: Path, target: Path) -> None:
    """Move the finished file `staging` onto `target`, durably."""
    fsync_file(staging)
    os.replace(staging, target)
    fsync_dir(target.parent)


@contextlib.contextmanager
def staged_folder(target: Path) -> Iterator[Path]:
    """A new, empty folder beside `target` to fill; moved onto `target` durably when the block
    ends. After an error the staging folder is removed (a full disk gets its space back) and
    `target` stays as it was."""
    staging = target.parent / f".tmp-{target.name}"
    shutil.rmtree(staging, ignore_errors=True)
    try:
        staging.mkdir(parents=True)
        yield staging
        replace_folder(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def new_staging_folder(parent: Path, prefix: str) -> Path:
    """A new folder of a unique name in `parent`, to fill and rename into place, with the
    umask's mode: mkdtemp makes it private (0700), and a shared folder's users could not read
    what it becomes."""
    staging = Path(tempfile.mkdtemp(prefix=prefix, dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(staging, 0o777 & ~umask)
    return staging


def clear_leftovers(folder: Path) -> list[str]:
    """Undo what writers that died mid-write left in `folder` (`staged_folder`, `replace_folder`,
    `open_durably`), for a caller that knows no writer is at work there now: half-written
    staging (`.tmp-NAME`, `.NAME.tmp`) is removed; a folder moved aside (`.old-NAME`) is removed
    where its replacement is in place, else put back. Returns the names it removed or put back."""
    done = []
    for path in sorted(folder.iterdir()) if folder.is_dir() else []:
        name = path.name
        if name.startswith(".tmp-") or (name.startswith(".") and name.endswith(".tmp")):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        elif name.startswith(".old-") and path.is_dir():
            target = path.with_name(name[len(".old-"):])
            shutil.rmtree(path) if target.exists() else os.replace(path, target)
        else:
            continue
        done.append(name)
    return done


def replace_folder(staging: Path, target: Path, *, replace_existing: bool = True) -> None:
    """Move the finished folder `staging` onto `target`, durably.

    An existing `target` is moved aside first and removed only once the new one is in place, so
    a crash in between leaves the old folder whole (as `.old-NAME`). With
    `replace_existing=False` an existing non-empty `target` makes the rename fail (OSError), for
    callers that keep the first of two concurrent writers.
    """
    fsync_tree(staging)
    old = None
    if replace_existing and target.exists():
        old = target.parent / f".old-{target.name}"
        shutil.rmtree(old, ignore_errors=True)
        os.replace(target, old)
    try:
        os.replace(staging, target)
    except BaseException:
        if old is not None:
            os.replace(old, target)
        raise
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def open_durably(path: Path, mode: str = "w", **kwargs: object) -> Iterator[IO]:
    """`open(path, mode)` for writing a whole file: readers see the old file or the finished new
    one, never half a file; after an error the old file stays and the staging file is removed."""
    path = Path(path)
    staging = path.parent / f".{path.name}.tmp"
    try:
        with open(staging, mode, **kwargs) as handle:  # type: ignore[call-overload]
            yield handle
        replace_file(staging, path)
    finally:
        staging.unlink(missing_ok=True)


def write_text(path: Path, text: str) -> None:
    """`path.write_text(text)` (UTF-8), durably."""
    with open_durably(path, "w", encoding="utf-8") as handle:
        handle.write(text)
