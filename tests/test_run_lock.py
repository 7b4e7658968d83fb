"""One running job per run directory: a second one (a --resume while the run still trains, the
same --output-dir twice in a sweep) is refused while the first holds the folder's lock, and a
holder that died blocks nothing (the kernel drops its lock). The holder is a real second process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from nlptrain.cli import main
from nlptrain.runs import LOCK_FILE

HOLD = ("import sys, time; from pathlib import Path; from nlptrain.runs import RunDirLock; "
        "lock = RunDirLock(); lock.acquire(Path(sys.argv[1])); print('held', flush=True); time.sleep(120)")


def test_a_second_job_is_refused_while_the_first_holds_the_folder(toy_task: Path, tmp_path: Path,
                                                                  capsys) -> None:
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1"]
    assert main(args) == 0
    before = (run / "config.json").read_text()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert main([*args, "--resume", "--epochs", "2"]) == 1
        err = capsys.readouterr().err
        assert f"{run}: in use by a running job (pid {holder.pid} on " in err, err
        assert (run / "config.json").read_text() == before  # nothing of the first run touched
    finally:
        holder.kill()
        holder.wait()
    # The holder died without a word: its lock went with it, and the resume goes on.
    assert main([*args, "--resume", "--epochs", "2"]) == 0
    assert "in use" not in capsys.readouterr().err


def test_overwrite_keeps_the_lock_it_holds_and_a_new_folder_gets_one(toy_task: Path,
                                                                     tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1"]
    assert main(args) == 0 and main([*args, "--overwrite"]) == 0
    assert (run / LOCK_FILE).is_file() and (run / "results.json").is_file()
    assert main(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "ro" / "x"),
                 "--epochs", "1"]) == 0


def test_an_unwritable_output_dir_is_one_line(toy_task: Path, tmp_path: Path, capsys) -> None:
    (tmp_path / "file").write_text("not a folder")
    assert main(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "file" / "run")]) == 1
    err = capsys.readouterr().err
    assert f"error: {tmp_path / 'file' / 'run'}: cannot be written (Not a directory)" in err
    assert "Traceback" not in err, err
    assert main(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "file")]) == 1
    assert f"error: {tmp_path / 'file'}: cannot be written (a file, not a folder); pick another " \
        "--output-dir" in capsys.readouterr().err  # ("File exists", of the folder it names)


def test_a_file_system_without_locks_runs_unguarded_and_says_so(tmp_path: Path, monkeypatch) -> None:
    import errno
    import fcntl

    from log_capture import nlptrain_messages

    from nlptrain.runs import RunDirLock

    def no_locks(*_: object) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_locks)
    lock = RunDirLock()
    with nlptrain_messages() as said:
        lock.acquire(tmp_path / "run")
    lock.release()
    assert any("run: cannot be locked (No locks available): a second job in this folder would "
               "not be stopped" in m for m in said), said


def test_a_process_forked_while_the_lock_is_held_does_not_hold_it_past_the_run(tmp_path: Path) -> None:
    """A DataLoader worker is forked from the run's process: it inherited the locked file, and a
    flock lasts while any copy is open, so a worker outliving a SIGKILL of the run (1.5-5 s)
    refused the resume that followed ("in use by a running job", naming the dead pid)."""
    import multiprocessing
    import time

    from nlptrain.runs import RunDirLock

    lock = RunDirLock()
    lock.acquire(tmp_path / "run")
    forked = multiprocessing.get_context("fork")
    started = forked.Event()
    worker = forked.Process(target=lambda: (started.set(), time.sleep(60)))
    worker.start()
    try:
        assert started.wait(30)  # the child runs (its fork handlers have run)
        lock.release()  # the run's end, as its death would be
        resumed = RunDirLock()
        resumed.acquire(tmp_path / "run")  # refused while the worker held a copy
        resumed.release()
    finally:
        worker.kill()
        worker.join()
