"""A DataLoader worker of the run's own that dies (the out-of-memory killer's SIGKILL, a crash):
torch reports it from its SIGCHLD handler wherever the main process is, so it is told apart from
another rank's failure and from a checkpoint's write failure, and the run ends with its resume."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, child_env

from nlptrain.checkpoint import list_checkpoints
from nlptrain.cli import main
from nlptrain.command_end import resume_said
from nlptrain.distributed import PeerFailed, as_peer_failure, peer_failure_in
from nlptrain.errors import NlptrainError, WorkerDied, WorkerStuck, dataloader_worker_death

SCAFFOLD = str(REPO / "tests" / "scaffold_callbacks.py")


def test_a_dataloader_workers_death_is_its_own_not_another_ranks_failure():
    """A worker of this process killed (the out-of-memory killer): torch raises "is killed by
    signal" over the "[Errno 104] Connection reset by peer" of the worker's socket. A run of one
    process was told "another rank failed (see its error)", and no error said the worker."""
    try:
        try:
            raise ConnectionResetError(104, "Connection reset by peer")
        except ConnectionResetError:
            raise RuntimeError("DataLoader worker (pid 4242) is killed by signal: Killed. ")  # noqa: B904 (as torch raises it)
    except RuntimeError as error:
        outer = error
    assert as_peer_failure(outer, 0, 15) is None and peer_failure_in(outer) is None
    assert dataloader_worker_death(outer) == "DataLoader worker (pid 4242) is killed by signal: Killed."
    assert dataloader_worker_death(RuntimeError("a step failed")) is None


@pytest.mark.parametrize("death, said", [
    ("DataLoader worker (pid 42) is killed by signal: Killed. ",
     "DataLoader worker (pid 42) is killed by signal: Killed. (the kernel's out-of-memory killer? "
     "dmesg names it); what was saved before it is kept: train --resume --output-dir run, with "
     "fewer --num-workers (0 reads in this process)"),
    ("DataLoader worker (pid 42) exited unexpectedly with exit code 1. Details are lost due to "
     "multiprocessing.",  # its own end: no memory to blame
     "DataLoader worker (pid 42) exited unexpectedly with exit code 1. Details are lost due to "
     "multiprocessing.; what was saved before it is kept: train --resume --output-dir run"),
    ("DataLoader worker (pid(s) 42) exited unexpectedly",  # found gone, how not seen (a SIGKILL too)
     "DataLoader worker (pid(s) 42) exited unexpectedly (how is not known here: the kernel's "
     "out-of-memory killer, if dmesg names it); what was saved before it is kept: train --resume "
     "--output-dir run, with fewer --num-workers (0 reads in this process)"),
])
def test_a_workers_death_ends_a_run_with_its_resume_and_its_likely_cause(death, said, tmp_path,
                                                                         monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run" / "checkpoints" / "step-00000003").mkdir(parents=True)
    (tmp_path / "run" / "checkpoints" / "step-00000003" / "meta.json").write_text("{}")
    with pytest.raises(WorkerDied) as ended, resume_said(Path("run")):
        raise RuntimeError(death)
    assert str(ended.value) == said
    (tmp_path / "run" / "checkpoints" / "step-00000003" / "meta.json").unlink()  # none whole
    with pytest.raises(WorkerDied) as ended, resume_said(Path("run")):
        raise RuntimeError(death)
    assert str(ended.value) == said.replace("what was saved before it is kept: train --resume "
                                            "--output-dir run", "no checkpoint was written before "
                                            "it: run the command again")


def test_a_workers_death_over_a_peers_failure_is_said_as_the_peers():
    """A rank unwinding another rank's failure, its worker ended meanwhile: the peer's failure
    is what happened (said as such by the command line), not a worker killed for memory."""
    with pytest.raises(RuntimeError) as ended, resume_said(Path("run")):
        try:
            raise PeerFailed("another rank failed (see its error); rank 0 stopped at step 3")
        except PeerFailed:
            raise RuntimeError("DataLoader worker (pid 42) is killed by signal: Terminated. ")  # noqa: B904 (as torch raises it)
    assert "DataLoader worker" in str(ended.value) and not isinstance(ended.value, NlptrainError)


def test_a_dataloader_worker_killed_is_said_as_such_and_the_run_resumes(toy_task, tmp_path):
    """A worker killed as the out-of-memory killer kills: one line naming the worker, its signal
    and the resume; not another rank's failure (one process), nor a checkpoint's write failure
    with the disk's free space (where the signal lands in a write)."""
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "nlptrain", "train", "--task", str(toy_task), "--output-dir", str(run),
         "--set", "train.num_workers=1", "--set", "train.checkpoint_every=1",
         "--callback", f"{SCAFFOLD}:KillDataLoaderWorker"],
        env=child_env(AT_STEP="3"), capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: DataLoader worker (pid ") and "is killed by signal: Killed." \
        in last and last.endswith(f"train --resume --output-dir {run}, with fewer --num-workers "
                                  "(0 reads in this process)"), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "another rank" not in done.stderr
    # (the kill precedes the Checkpointer in on_step_end: step 3's checkpoint is not begun)
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000002"
    assert main(["train", "--resume", "--output-dir", str(run)]) == 0


@pytest.mark.parametrize(("stuck", "more"), [("StuckDataLoaderWorker", []),
                                             ("StuckStreamWorker", ["--steps-per-epoch", "3"])])
def test_a_stuck_dataloader_worker_ends_its_run_after_the_timeout(toy_task, tmp_path, stuck, more):
    """A worker whose dataset never answers (a deadlocked reader), of a Dataset or of a stream
    read pass after pass: the run ends after --timeout with a line that says so, not a hang (in
    the loop, or at exit joining a worker that ignores SIGTERM); stuck before any checkpoint,
    the command is to run again (the new run's folder is removed: no --resume)."""
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "nlptrain", "train", "--task", str(toy_task), "--output-dir", str(run),
         "--set", "train.num_workers=1", "--timeout", "2", *more,
         "--callback", f"{SCAFFOLD}:{stuck}"],
        env=child_env(), capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, done.stderr[-3000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("error: DataLoader timed out after 2 seconds: a DataLoader worker gave no "
                    "batch in --timeout seconds (its dataset waiting on a lock, a file or the "
                    "network?); no checkpoint was written before it: run the command again"), \
        done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not run.exists()


def test_a_worker_ended_after_a_checkpoint_says_the_resume(tmp_path):
    """A checkpoint written: the line says the --resume that goes on from it."""
    (tmp_path / "checkpoints" / "step-00000002").mkdir(parents=True)
    (tmp_path / "checkpoints" / "step-00000002" / "meta.json").write_text("{}")
    with pytest.raises(WorkerStuck) as ended, resume_said(tmp_path):
        raise RuntimeError("DataLoader timed out after 5 seconds")
    assert str(ended.value).endswith(f"; what was saved before it is kept: train --resume "
                                     f"--output-dir {tmp_path}")
