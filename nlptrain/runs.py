"""The run directory: what a run leaves behind, and refusing to mix two runs in one folder."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import shutil
import socket
import subprocess
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nlptrain.durable import write_text
from nlptrain.environments import Environment
from nlptrain.errors import (
    CheckpointWriteError,
    ConfigError,
    NlptrainError,
    OutOfSpace,
)
from nlptrain.resume_checks import (
    changed_settings,
    check_a_checkpoint_is_whole,
    check_resume,
    check_strategy_fits,
    data_digests,
)
from nlptrain.run_record import CONFIG_FILE, read_config, record_and_why

LOCK_FILE = ".lock"  # held by the run's main process while it runs (`RunDirLock`)
log = logging.getLogger(__name__)


class RunDirLock:
    """One running job per run directory: the main process holds an exclusive lock on
    `FOLDER/.lock` from before it reads or writes anything there until the run ends. A second
    job in the same folder (a `--resume` while the run still trains, the same `--output-dir`
    twice in a sweep) is refused instead of rewriting config.json and metrics under the first.
    The kernel drops the lock when the holder dies, however it dies: a stale lock never blocks a
    resume. A process forked while it is held (a DataLoader worker) closes its copy at once: a
    flock lasts while any copy is open, so a worker left a second or more after a SIGKILL of the
    run refused the resume that followed it."""

    def __init__(self) -> None:
        self.folder: Path | None = None
        self._file: Any = None
        self._made_file = False

    def acquire(self, folder: Path) -> None:
        self.folder, path = folder, folder / LOCK_FILE
        self._made_file = not path.exists()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            held = open(path, "a+")  # noqa: SIM115 (held open while the run runs)
        except OSError as err:
            said = "a file, not a folder" if self.folder.is_file() else err.strerror
            raise ConfigError(f"{self.folder}: cannot be written ({said}); pick another "
                              "--output-dir") from None
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            held.seek(0)
            holder = held.read().strip() or "another process"
            held.close()
            raise ConfigError(f"{self.folder}: in use by a running job ({holder}); wait for it "
                              "to end or stop it (it leaves a checkpoint to --resume from), or "
                              "pick another --output-dir") from None
        except OSError as err:  # a file system without locks (some NFS mounts): run unguarded
            held.close()
            log.warning("%s: cannot be locked (%s): a second job in this folder would not be "
                        "stopped", self.folder, err.strerror)
            return
        try:
            held.seek(0)
            held.truncate()
            held.write(f"pid {os.getpid()} on {socket.gethostname()}, since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")
            held.flush()
        except OSError as err:  # a full disk: the run could write nothing either
            with contextlib.suppress(OSError):
                held.close()
            if self._made_file:
                path.unlink(missing_ok=True)
            raise ConfigError(f"{path}: cannot be written ({err.strerror}{free_space(self.folder)});"
                              " free space, or pick another --output-dir") from None
        self._file = held
        _HELD.add(self)

    def _close_inherited(self) -> None:  # in a forked child: the parent's lock stays held
        if self._file is not None:
            self._file.close()
            self._file = None

    def release(self, refused: bool = False) -> None:
        """`refused`: the folder was refused before anything was written there: the lock file
        goes too where this job made it (a folder of someone else's files keeps none of ours)."""
        if self._file is not None:
            if refused and self._made_file and self.folder is not None:
                (self.folder / LOCK_FILE).unlink(missing_ok=True)
            self._file.close()  # closing the file drops the lock
            self._file = None
            _HELD.discard(self)


_HELD: weakref.WeakSet[RunDirLock] = weakref.WeakSet()  # the locks this process holds


def _close_inherited_locks() -> None:
    for lock in list(_HELD):
        lock._close_inherited()


os.register_at_fork(after_in_child=_close_inherited_locks)


def versions() -> dict[str, str]:
    import torch
    import transformers

    from nlptrain.version import __version__

    return {"nlptrain": __version__, "torch": torch.__version__,
            "transformers": transformers.__version__}


def git_commit() -> str | None:
    try:
        here = Path(__file__).parent
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        return out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        return None


def launch_run_dir(task_name: str, root: str = "runs", launch: Environment | None = None
                   ) -> Path | None:
    """When the launcher restarted the job (torchrun --max-restarts, a requeued SLURM job), the
    folder an earlier attempt of the same launch made, if any."""
    if launch is None or launch.restart_count == 0:
        return None
    if launch.run_id or launch.requeued:
        for folder in sorted(Path(root).glob(f"{task_name}-*"), reverse=True):
            saved = read_config(folder)
            if saved and written_by(launch, saved):
                return folder
    # Said, as a restart that starts over loses the first attempt's steps.
    log.warning("restart %d: no run directory of this launch (run id %s) in %s/: a new run starts; "
                "give --output-dir (or torchrun --rdzv-id) for a restart to resume",
                launch.restart_count, launch.run_id or "none", root)
    return None


def new_run_dir(task_name: str, root: str = "runs") -> Path:
    """A new, empty `root/<task>-<timestamp>`, made atomically: a run started in the same second
    (a sweep, a SLURM array) gets the next free `-2`, `-3`, ... instead of another run's folder."""
    Path(root).mkdir(parents=True, exist_ok=True)
    stem = f"{task_name}-{time.strftime('%Y%m%d-%H%M%S')}"
    number = 1
    while True:
        folder = Path(root) / (stem if number == 1 else f"{stem}-{number}")
        try:
            folder.mkdir()  # exist_ok=False: of two runs, one makes it, the other moves on
            return folder
        except FileExistsError:
            number += 1


def prepare_run_dir(folder: Path, task: dict[str, Any], world_size: int, *, resume: bool,
                    overwrite: bool, launch: Environment | None = None,
                    callbacks: list[str] | None = None) -> bool:
    """Make `folder` ready and write config.json (with `callbacks`, the `--callback` specs);
    returns whether there is a run to resume."""
    callbacks = callbacks or []
    saved = read_config(folder)
    if saved is not None and resume:
        check_resume(folder, task, saved)
        check_strategy_fits(folder, task["train"], world_size)  # before config.json records it
        check_a_checkpoint_is_whole(folder / "checkpoints")  # and this
        changed = changed_settings(saved["task"].get("train", {}), task["train"])
        if changed:  # said: a resume's command line may differ from the run's without meaning to
            log.info("resume with changed settings: %s", ", ".join(changed))
        had = saved.get("callbacks", [])
        if callbacks != had:  # a resume loads no code the run directory names: said instead
            dropped = [spec for spec in had if spec not in callbacks]
            (log.warning if dropped else log.info)(
                "resume with changed callbacks: %s -> %s%s", ", ".join(had) or "none",
                ", ".join(callbacks) or "none",
                "; to keep a callback, give its --callback again" if dropped else "")
        saved["callbacks"] = callbacks
        # config.json describes the run as it goes on (the next resume starts from it).
        saved_epochs = saved["task"].get("train", {}).get("epochs")
        saved["task"] = task
        saved.setdefault("resumes", []).append({
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "world_size": world_size,
            "launcher": launch.name if launch else None, "changed": changed,
            "epochs_before": saved_epochs, "launcher_run_id": launch.run_id if launch else None,
            "launcher_job_id": launch.job_id if launch else None})
        write_text(folder / CONFIG_FILE, json.dumps(saved, indent=2))
        return True
    contents = _contents(folder)
    if saved is not None or contents:
        check_free(folder, run_allowed=overwrite)
        for path in contents:  # the lock stays: this run holds it
            shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    if resume and saved is None:  # a typo in --output-dir must not pass for a first run unseen
        log.warning("%s: no run here to resume (no %s); a new run starts", folder, CONFIG_FILE)
    folder.mkdir(parents=True, exist_ok=True)
    record = {"task": task, "world_size": world_size, "versions": versions(),
              "git_commit": git_commit(), "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "launcher_run_id": launch.run_id if launch else None,
              "launcher_job_id": launch.job_id if launch else None,
              "launch": launch.record() if launch else None, "callbacks": callbacks,
              "data_digests": data_digests(task, str(folder / CONFIG_FILE))}  # (its resumes')
    write_text(folder / CONFIG_FILE, json.dumps(record, indent=2))
    return False


def _contents(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if p.name != LOCK_FILE] if folder.is_dir() else []


def forget_unstarted_run(folder: Path, made_here: bool) -> bool:
    """A new run that failed with nothing written but its config.json (a bad row found as
    training starts, e.g. in a per-rank file) has nothing to resume: its config.json goes, so
    the corrected command may start in `folder` ("already holds a run" otherwise), and the
    folder too where this run made it. Whether it went."""
    if [p.name for p in _contents(folder)] != [CONFIG_FILE]:
        return False
    (folder / CONFIG_FILE).unlink()
    if made_here:
        (folder / LOCK_FILE).unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # (something else appeared there: it stays)
            folder.rmdir()
    return True


def check_free(folder: Path, run_allowed: bool = False) -> None:
    """Refuse `folder` where it holds a run, unless `run_allowed` (--resume, --overwrite), and
    always where it holds files and no run: they are not nlptrain's to write among or replace
    (an --output-dir mistyped as a home or data folder). Also called before `--nproc` starts
    workers."""
    if read_config(folder) is not None:
        if not run_allowed:
            raise ConfigError(f"{folder}: already holds a run; use --resume to continue it, "
                              "--overwrite to replace it, or another --output-dir")
        return
    found = sorted(p.name for p in _contents(folder))
    if found:
        listed = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
        why = record_and_why(folder / CONFIG_FILE)[1]
        raise ConfigError(f"{folder}: holds {listed}, and no nlptrain run ({why}): a "
                          "run starts only in a new or empty folder (--overwrite replaces a run, "
                          "nothing else); pick another --output-dir")


def began_in_this_launch(folder: Path, launch: Environment) -> bool:
    """Whether the run in `folder` was started or resumed by this launch (its run id): what a
    launcher's restart resumes. A folder an earlier job left (which the first attempt refused to
    touch) is not; where the launch has no id of its own, it cannot be told, and counts."""
    saved = read_config(folder)
    if (launch.run_id is None and not launch.requeued) or saved is None:
        return True
    return written_by(launch, saved)


def written_by(launch: Environment, saved: dict[str, Any]) -> bool:
    """Whether a run's record was written (begun or resumed) by this launch: by its run id, or,
    in a job the scheduler requeued, by the job's id (torchrun in it starts with a new run id).
    Another launch in the same allocation has the job's id but not the run's."""
    records = [saved, *saved.get("resumes", [])]
    return (launch.run_id is not None and launch.run_id in [r.get("launcher_run_id") for r in records]) \
        or (launch.requeued and launch.job_id in [r.get("launcher_job_id") for r in records])


def disk_use_line(folder: Path) -> str:
    """What a finished run holds on disk, and how much of it is checkpoints (kept to resume or
    go back; MiniLM's default run leaves 2 of 272 MB, weights and optimizer state)."""
    def size(path: Path) -> int:
        files = path.rglob("*") if path.is_dir() else [path]
        return sum(f.stat().st_size for f in files if f.is_file() and not f.is_symlink())

    mb = 1024 * 1024
    total, checkpoints = size(folder), size(folder / "checkpoints")
    if not checkpoints:
        return f"{folder}: {total / mb:.0f} MB"
    return (f"{folder}: {total / mb:.0f} MB, of which checkpoints/ {checkpoints / mb:.0f} MB (kept "
            "to resume or go back; safe to remove once the run is done, which can then not be "
            "resumed)")


@contextlib.contextmanager
def out_of_space_said(folder: Path) -> Iterator[None]:
    """A file of the run in `folder` (config.json, results, predictions, plots, report) that a
    full disk or quota stops is one line naming it and what to do, not a traceback: the
    checkpoints are kept, and a resume writes the run's files again. A checkpoint's or model's
    own line (what was saved before it is kept) gains the resume that goes on from there."""
    try:
        yield
    except CheckpointWriteError as err:
        raise CheckpointWriteError(f"{err}: once it can be written, train --resume --output-dir "
                                   f"{folder}") from None
    except NlptrainError:  # said already
        raise
    except Exception as err:
        full = next((e for e in _chain(err) if isinstance(e, OSError)
                     and e.errno in (errno.ENOSPC, errno.EDQUOT)), None)
        if full is None:
            raise
        if [p.name for p in _contents(folder)] in ([], [CONFIG_FILE]):  # nothing to resume:
            go_on = "nothing was trained yet: free space, then run the same command again"  # (the
        else:                                                             # run's folder goes)
            go_on = f"what was trained is kept: free space, then train --resume --output-dir {folder}"
        raise OutOfSpace(f"{full.filename or folder}: cannot be written ({full.strerror}"
                         f"{free_space(folder)}); {go_on}") from None


def free_space(folder: Path) -> str:
    """", N MB free on its disk" (empty where the disk cannot be asked)."""
    try:
        return f", {shutil.disk_usage(folder).free / 2**20:.0f} MB free on its disk"
    except OSError:
        return ""


def _chain(err: BaseException | None) -> Any:
    """The error and those it was raised while handling (matplotlib's PNG writer raises an
    AttributeError of its own while handling the OSError of a full disk)."""
    while err is not None:
        yield err
        err = err.__cause__ or (None if err.__suppress_context__ else err.__context__)


class RunRecordBefore:
    """The run's record (config.json) as it was before a resume rewrote it (on rank 0), put back
    where the resume is refused before it trains a step: a checkpoint that a stream's reader
    count, per-rank files or the task does not fit. Else the refused settings stayed in it, and
    the plain `--resume` that the refusal suggests was refused too."""

    def __init__(self) -> None:
        self._kept: tuple[Path, str] | None = None

    def keep(self, folder: Path) -> None:
        path = folder / CONFIG_FILE
        self._kept = (path, path.read_text()) if path.is_file() else None

    def put_back(self) -> None:
        if self._kept is not None:
            write_text(*self._kept)
            self._kept = None


@contextlib.contextmanager
def refused_before_training(put_back: Callable[[], None], steps: Callable[[], int]) -> Iterator[None]:
    """`put_back` the run's record where the block is refused (an NlptrainError) before
    `steps()` trained any step."""
    try:
        yield
    except NlptrainError:
        if steps() == 0:
            put_back()
        raise
