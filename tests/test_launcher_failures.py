"""What a 2-rank job says and leaves when it goes wrong outside nlptrain's own code: a rank that
hangs, a launcher killed with SIGKILL, a worker killed without a word (real launches of the toy
task, gloo on loopback)."""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, TWO_RANK_TRAIN, child_env, free_port, run_cli

from nlptrain.checkpoint import step_folders
from nlptrain.launch import failure_summary
from nlptrain.signals import stopped_message

SCAFFOLD = str(REPO / "tests" / "scaffold_callbacks.py")


@pytest.mark.distributed
def test_a_stuck_rank_is_named_as_no_answer_in_one_line(toy_folder, tmp_path):
    """Rank 1 sleeps at step 2; rank 0's next collective (the gradient all-reduce in DDP's comm
    hook, the default sparse embedding sync: gloo then says "Application timeout caused pair
    closure") gives up after --timeout: the one line that says so, no traceback."""
    out = run_cli([*TWO_RANK_TRAIN, "--output-dir", str(tmp_path / "run"), "--timeout", "4",
                   "--callback", f"{SCAFFOLD}:StallRank1"], toy_folder, nproc=2,
                  AT_STEP="2", STALL_S="10")
    assert out.returncode != 0
    assert "error: no answer from the other rank(s) in time (" in out.stderr, out.stderr[-3000:]
    assert "[rank0]: Traceback" not in out.stderr, out.stderr[-3000:]


def _workers_of(folder: Path) -> list[str]:
    found = subprocess.run(["pgrep", "-f", f"--output-dir {folder}"], capture_output=True, text=True)
    return found.stdout.split()


@pytest.mark.distributed
def test_workers_stop_with_a_checkpoint_when_their_launcher_is_killed(toy_folder, tmp_path):
    """SIGKILL to `--nproc 2`'s own process at step 3 (it cannot pass that on): the kernel's
    parent-death signal stops the workers after their step, with a checkpoint, instead of
    leaving them to train on unwatched."""
    out = tmp_path / "orphaned"
    launcher = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--epochs", "50",
                               "--nproc", "2", "--output-dir", str(out),
                               "--callback", f"{SCAFFOLD}:SignalTheLauncher"], cwd=toy_folder,
                              env=child_env(AT_STEP="3", SIGNAL="SIGKILL"), capture_output=True,
                              text=True, timeout=240)
    assert launcher.returncode == -signal.SIGKILL
    deadline = time.monotonic() + 90
    while _workers_of(out) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _workers_of(out), "the workers outlived their launcher"
    steps = [int(p.name.split("-")[1]) for p in step_folders(out / "checkpoints")]
    assert steps and 3 <= max(steps) <= 5, steps  # stopped right after the kill, not at the end
    assert not (out / "results.json").exists()


def test_a_worker_killed_without_a_word_is_named_as_such():
    assert failure_summary(1, 2, 1, "Traceback ...") == ("rank 1 of 2 failed (exit code 1); its "
                                                         "error is above")
    # No record (os._exit(3) in a user's code): nothing of it above to point at.
    assert failure_summary(1, 2, 3) == ("rank 1 of 2 failed (exit code 3) without reporting an "
                                        "error; any output of its own is above")
    killed = failure_summary(1, 2, -signal.SIGKILL)
    assert killed.startswith("rank 1 of 2 was killed by SIGKILL, with no error of its own")
    assert "out-of-memory" in killed and "its error is above" not in killed
    assert failure_summary(0, 2, -signal.SIGTERM) == ("rank 0 of 2 was ended by SIGTERM; any "
                                                      "error of its own is above")
    # A signal to one worker (a scheduler's, a kill of one pid) stops every rank, checkpointed:
    # exit code 130 is that, not a failure of the first rank the launcher hears of.
    stopped = failure_summary(0, 2, 130)
    assert stopped.startswith("the 2 workers stopped after the same step, on a signal sent to a "
                              "worker") and "failed" not in stopped


def test_more_processes_than_cores_is_said_before_they_start(monkeypatch, caplog):
    import logging
    import os

    from nlptrain.launch import warn_more_processes_than_cores

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    with caplog.at_level(logging.WARNING, logger="nlptrain"):
        warn_more_processes_than_cores(2)
        assert not caplog.records
        warn_more_processes_than_cores(64)
    assert "--nproc 64 on 2 CPU core(s): more processes than cores take turns" in caplog.text
    assert "--nproc 2 trains faster" in caplog.text


@pytest.mark.distributed
def test_a_failed_worker_under_nproc_is_said_by_nlptrain_alone(toy_folder, tmp_path):
    """The workers' error, then the launcher's one summary line: none of torch's agent's own
    W/E log lines (the worker it stops, the exit code it saw) in between."""
    import re

    out = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--nproc", "2",
                          "--output-dir", str(tmp_path / "run"), "--callback",
                          f"{SCAFFOLD}:RaiseAtStep"], cwd=toy_folder, env=child_env(AT_STEP="2"),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 1 and "injected crash at step 2" in out.stderr
    assert re.search(r"^error: rank \d of 2 failed \(exit code 1\); its error is above$",
                     out.stderr, flags=re.MULTILINE), out.stderr[-3000:]
    assert not re.search(r"^[IWE]\d{4} ", out.stderr, flags=re.MULTILINE), out.stderr[-3000:]


@pytest.mark.distributed
def test_a_worker_that_exits_by_itself_is_named_not_the_rank_that_followed_it(toy_folder, tmp_path):
    """sys.exit(3) on rank 1 writes no traceback; rank 0 then stops, saying another rank failed.
    The launcher names rank 1 and its exit code, not rank 0, whose only error is that line."""
    out = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--nproc", "2",
                          "--output-dir", str(tmp_path / "run"), "--callback",
                          f"{SCAFFOLD}:ExitRank1"], cwd=toy_folder, env=child_env(AT_STEP="2"),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 3, out.stderr[-3000:]
    assert "error: rank 1 of 2 ended by sys.exit(3), with no error of its own" in out.stderr


@pytest.mark.distributed
def test_a_worker_interrupted_at_once_is_not_called_an_agreed_stop(toy_folder, tmp_path):
    """A KeyboardInterrupt on one rank stops it without waiting for the step (exit 130, as the
    agreed stop's): the launcher says so, not "the workers stopped after the same step"."""
    out = subprocess.run([sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--nproc", "2",
                          "--output-dir", str(tmp_path / "run"), "--callback",
                          f"{SCAFFOLD}:CtrlCRank1"], cwd=toy_folder, env=child_env(AT_STEP="2"),
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 130, out.stderr[-3000:]
    assert "error: rank 1 of 2 was interrupted (a second Ctrl-C, or a KeyboardInterrupt raised " \
           "in it) and stopped at once" in out.stderr, out.stderr[-3000:]
    assert "stopped after the same step" not in out.stderr
    assert "[rank 1] interrupted" not in out.stderr  # said once, by the launcher's summary


@pytest.mark.distributed
def test_a_reader_that_closes_the_pipe_is_no_failure_under_nproc(tiny_model_dir, tmp_path):
    """`predict --nproc 2 ... | head -1`: the reader has what it wanted; exit 141 as one process
    does, with no "rank 0 failed" line."""
    (tmp_path / "in.txt").write_text("".join(f"text number {i}\n" for i in range(20000)))
    command = (f"{shlex.quote(sys.executable)} -m nlptrain predict --model {tiny_model_dir} "
               f"--input in.txt --nproc 2 | head -1; exit ${{PIPESTATUS[0]}}")
    out = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=child_env(),
                         capture_output=True, text=True, timeout=240)
    assert out.stdout.startswith("row\t"), out.stderr[-3000:]
    assert out.returncode == 141 and "failed" not in out.stderr, out.stderr[-3000:]


def recorded_failure(folder, rank: int, exitcode: int, record: str):
    """A worker's failure as the agent reads it, with the record it wrote (tell_launcher's)."""
    import json

    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    error_file = folder / f"error-{rank}.json"
    error_file.write_text(json.dumps({"message": record, "timestamp": 100}))
    return ProcessFailure(rank, 10 + rank, exitcode, str(error_file))


def test_the_closed_pipe_is_no_failure_whichever_ranks_stop_is_dated_first(capsys, tmp_path):
    """1 run in 17: rank 1's record ("stopped: another rank failed") was dated before the agent
    noticed rank 0's exit 141, and the launcher said "rank 1 of 2 failed (exit code 1)"."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from nlptrain.launch import PIPE_CLOSED, reported_failure

    closed, follower = ProcessFailure(0, 11, PIPE_CLOSED, "<N/A>"), ProcessFailure(1, 12, 1, "<N/A>")
    closed.timestamp, follower.timestamp = 200, 100  # the follower's first
    assert reported_failure(ChildFailedError("nlptrain", {0: closed, 1: follower}), 2) == PIPE_CLOSED
    assert capsys.readouterr().err == ""
    # The writer ended by the agent (SIGTERM) while closing down, after rank 1's stop: its
    # record says the pipe closed ("rank 0 of 2 was ended by SIGTERM", in a CI run).
    ended = recorded_failure(tmp_path, 0, -15, "stdout closed: the reader has what it wanted")
    assert reported_failure(ChildFailedError("nlptrain", {0: ended, 1: follower}), 2) == PIPE_CLOSED
    assert capsys.readouterr().err == ""
    failed = recorded_failure(tmp_path, 1, 1, "error: something the rank said")
    assert reported_failure(ChildFailedError("nlptrain", {1: failed}), 2) == 1
    assert "error: rank 1 of 2 failed (exit code 1); its error is above" in capsys.readouterr().err
    # Its error said, the rank that only followed it gone first, then the agent's SIGTERM as
    # it left: its error, not the signal, is why it failed.
    failed = recorded_failure(tmp_path, 0, -15, "error: something the rank said")
    assert reported_failure(ChildFailedError("nlptrain", {0: failed}), 2) == 1
    assert "error: rank 0 of 2 failed (exit code 1); its error is above" in capsys.readouterr().err
    # The agreed stop (exit 130), the agent's SIGTERM likewise as it left (review 100: "failed").
    stopped = recorded_failure(tmp_path, 0, -15, f"error: {stopped_message(7, True)}")
    assert reported_failure(ChildFailedError("nlptrain", {0: stopped}), 2) == 130
    assert "error: the 2 workers stopped after the same step" in capsys.readouterr().err
    # sys.exit(3) told at once, then the agent's SIGTERM as it closed down, after rank 0 had
    # failed on its closed sockets ("rank 1 of 2 was ended by SIGTERM", in a busy CI run).
    exited = recorded_failure(tmp_path, 1, -15, "sys.exit(3)")
    assert reported_failure(ChildFailedError("nlptrain", {1: exited}), 2) == 3
    assert "error: rank 1 of 2 ended by sys.exit(3), with no error of its own" in capsys.readouterr().err
    # No error file (os._exit(3)): torch's made-up message ("To enable traceback ...") is none.
    silent = ProcessFailure(1, 12, 3, "<N/A>")
    assert reported_failure(ChildFailedError("nlptrain", {1: silent}), 2) == 3
    assert ("error: rank 1 of 2 failed (exit code 3) without reporting an error; any output of "
            "its own is above") in capsys.readouterr().err


def _stopped_by_the_agent_while(raised: BaseException | None):
    from nlptrain.signals import StoppedBySignal

    try:
        try:
            if raised is not None:
                raise raised
            raise StoppedBySignal(signal.SIGTERM, by_launcher=True)
        except StoppedBySignal:
            raise
        except BaseException:  # the agent's SIGTERM as this rank unwound from its own end
            raise StoppedBySignal(signal.SIGTERM, by_launcher=True) from None
    except StoppedBySignal as stop:
        return stop


def test_a_worker_the_agent_stops_as_it_unwinds_from_its_own_end_keeps_that_ends_record(
        tmp_path, monkeypatch, capsys):
    """A closed pipe and sys.exit(n) are told at once, since the agent's SIGTERM may come as the
    rank unwinds; the SIGTERM, now raised for the cleanup to run, must not replace that record
    or its exit code (review 93: 'rank 0 of 2 failed (exit code 143)' for `predict | head`)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from nlptrain import launch

    record = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(record))
    monkeypatch.setattr(launch, "_told", False)
    assert launch.tell_stopped_by_launcher(_stopped_by_the_agent_while(SystemExit(3)), 15) == 3
    assert launch.tell_stopped_by_launcher(_stopped_by_the_agent_while(BrokenPipeError()), 15) == \
        launch.PIPE_CLOSED
    assert not record.exists()
    launch.tell_launcher("stdout closed: the reader has what it wanted")  # told, then stopped
    assert launch.tell_stopped_by_launcher(_stopped_by_the_agent_while(None), 15) == 143
    assert "stdout closed" in record.read_text()
    monkeypatch.setattr(launch, "_told", False)  # a worker with nothing told: its own record
    assert launch.tell_stopped_by_launcher(_stopped_by_the_agent_while(None), 15) == 143
    stopped = recorded_failure(tmp_path, 1, 143, "stopped by SIGTERM outside the training steps")
    assert launch.reported_failure(ChildFailedError("nlptrain", {1: stopped}), 2) == 143
    assert ("error: rank 1 of 2 was ended by SIGTERM outside the training steps; any error of its "
            "own is above") in capsys.readouterr().err


@pytest.mark.distributed
def test_a_rendezvous_port_in_use_is_this_ranks_own_error_with_its_fix(toy_task, tmp_path):
    """Rank 0 cannot listen on MASTER_PORT (another job's rendezvous holds it): its error says
    so, not "another rank failed" (a DistError, read as a peer's failure before)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_cli(["train", "--task", str(toy_task), "--output-dir", "run"], cwd=tmp_path,
                       timeout=120, RANK="0", WORLD_SIZE="2", LOCAL_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    assert done.returncode == 1
    assert f"error: rank 0 cannot host the job's rendezvous at 127.0.0.1:{port}: the port is " \
           "in use (another job's?); give this job a free one (MASTER_PORT" in done.stderr
    assert "another rank failed" not in done.stderr and "Traceback" not in done.stderr


@pytest.mark.distributed
def test_a_rank_of_another_job_at_the_same_port_is_refused_at_once(toy_folder, tmp_path):
    """Two srun steps of one allocation running at once share the job id's port. Rank 1 of the
    second step, reaching the first step's rendezvous mid-training, is refused in seconds (it
    used to wait there, silent, for its whole timeout), and the first step trains on."""
    slurm = {"SLURM_JOB_ID": "100", "SLURM_NTASKS": "2", "MASTER_ADDR": "127.0.0.1",
             "MASTER_PORT": str(free_port())}
    started: list[subprocess.Popen] = []

    def task(step: int, rank: int, out: Path) -> subprocess.Popen:
        command = [sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--epochs", "1000",
                   "--output-dir", str(out)]
        env = child_env(**slurm, SLURM_STEP_ID=str(step), SLURM_PROCID=str(rank),
                        SLURM_LOCALID=str(rank))
        started.append(subprocess.Popen(command, cwd=toy_folder, env=env, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True))
        return started[-1]

    metrics = tmp_path / "first" / "metrics.jsonl"
    first = [task(0, rank, tmp_path / "first") for rank in (0, 1)]
    try:
        _wait_for(lambda: _lines(metrics) > 0, 120)  # the first step trains: its store is up
        stray = task(1, 1, tmp_path / "second")
        _, said = stray.communicate(timeout=90)
        assert stray.returncode == 1, said[-3000:]
        assert (f"error: rank 1 of slurm-100.1 reached another job's rendezvous at "
                f"127.0.0.1:{slurm['MASTER_PORT']} (slurm-100.0's); give each job a port of its own"
                in said), said[-3000:]
        logged = _lines(metrics)
        _wait_for(lambda: _lines(metrics) > logged, 60)  # still training
        for process in first:  # as srun passes on a scancel: both stop with a checkpoint
            process.send_signal(signal.SIGTERM)
        for process in first:
            _, log = process.communicate(timeout=120)
            assert process.returncode == 130 and "Traceback" not in log, log[-3000:]
    finally:
        for process in started:
            process.kill()
    assert step_folders(tmp_path / "first" / "checkpoints")


def _lines(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _wait_for(ready, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not ready():
        assert time.monotonic() < deadline, f"not ready after {seconds} s"
        time.sleep(0.2)


@pytest.mark.distributed
@pytest.mark.parametrize("launcher", ["srun", "env://"])
def test_ranks_that_count_another_world_size_are_refused_at_once(launcher, toy_folder, tmp_path):
    """One task of a job told 3 ranks, the other 2 (variables set by hand): gloo's mesh waited
    past the timeout for a rank that never comes, then gave a traceback; under env://, the rank
    that counted 2 waited without end. Each rank now says it."""
    port = str(free_port())
    job = "slurm-7.0" if launcher == "srun" else f"the job at 127.0.0.1:{port}"

    def variables(rank: int, world: int) -> dict[str, str]:
        if launcher == "srun":
            return {"SLURM_JOB_ID": "7", "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
                    "SLURM_LOCALID": str(rank), "SLURM_NTASKS": str(world)}
        return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world)}

    started = [subprocess.Popen(
        [sys.executable, "-m", "nlptrain", *TWO_RANK_TRAIN, "--output-dir", str(tmp_path / "run"),
         "--timeout", "300"], cwd=toy_folder, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, **variables(rank, world)))
        for rank, world in ((0, 2), (1, 3))]
    try:
        said = [process.communicate(timeout=120)[1] for process in started]
    finally:
        for process in started:
            process.kill()
    assert [process.returncode for process in started] == [1, 1], said
    assert f"error: rank 0 counts 2 ranks in {job}, rank 1 counts 3: every rank of a job " \
           "needs the same world size" in said[0], said[0][-3000:]
    assert f"error: rank 1 counts 3 ranks in {job}, rank 0 counts 2" in said[1], said[1][-3000:]


@pytest.mark.distributed
def test_env_ranks_that_spell_the_master_host_each_their_own_way_meet():
    """The rendezvous' owner check named an env:// job by its MASTER_ADDR as each rank spelt
    it: rank 0 with localhost, rank 1 with 127.0.0.1 were refused as two jobs."""
    port = str(free_port())
    join = "from nlptrain import distributed; d = distributed.from_env(60); " \
           "print(d.all_sum([1.0])[0]); d.close()"
    started = [subprocess.Popen([sys.executable, "-c", join], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=child_env(
                                    RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR=host, MASTER_PORT=port))
               for rank, host in ((0, "localhost"), (1, "127.0.0.1"))]
    try:
        said = [process.communicate(timeout=90) for process in started]
    finally:
        for process in started:
            process.kill()
    assert [out.strip() for out, _ in said] == ["2.0", "2.0"], [err[-2000:] for _, err in said]
