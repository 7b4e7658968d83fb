"""Stop signals where the loop's own stop does not reach. Outside the training steps (reading
the data, the final scoring, export and report) SIGTERM and SIGHUP are a Ctrl-C: the command
stops at once and says how to go on (they ended the process without a word). And a signal to
the whole process group reaches DataLoader workers too: they leave it to the main process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from conftest import REPO, child_env

from nlptrain.checkpoint import list_checkpoints
from nlptrain.cli import main
from nlptrain.signals import StoppedBySignal, interrupt_on_signals

SCAFFOLD = str(REPO / "tests" / "scaffold_callbacks.py")


def test_sigterm_and_sighup_raise_as_a_ctrl_c_and_the_handlers_come_back():
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with pytest.raises(StoppedBySignal) as stop, interrupt_on_signals():
            os.kill(os.getpid(), signum)
            time.sleep(5)  # (the handler runs at once: the sleep is cut short)
        assert isinstance(stop.value, KeyboardInterrupt)
        assert stop.value.signal_name == signal.Signals(signum).name
        assert signal.getsignal(signum) is signal.SIG_DFL


def test_an_ignored_sighup_stays_ignored():
    """nohup: the run goes on past a closed terminal, as asked."""
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        with interrupt_on_signals():
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGHUP)
    finally:
        signal.signal(signal.SIGHUP, before)


def test_a_sigterm_while_the_test_set_is_scored_says_how_to_finish_the_run(toy_task, tmp_path,
                                                                           capsys):
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--valid-size", "0.2",
            "--epochs", "1"]
    assert main([*args, "--callback", f"{SCAFFOLD}:SigtermAfterTraining"]) == 130
    err = capsys.readouterr().err
    assert ("interrupted by SIGTERM: stopped at once, without waiting for a step under way; the "
            "run goes on from its last whole checkpoint, or from the start where it wrote none, "
            f"with train --resume --output-dir {run}") in err, err
    assert not (run / "results.json").exists()
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert main([*args, "--resume"]) == 0
    assert "nothing left to train" in capsys.readouterr().err
    assert json.loads((run / "results.json").read_text())["test"]["rows"] == 40


def test_under_torchs_agent_a_sigterm_is_raised_marked_as_the_launchers():
    """The agent (torchrun, --nproc) SIGTERMs every worker when one fails."""
    from nlptrain.environments import detect

    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc",
                "TORCHELASTIC_RESTART_COUNT": "0"}
    assert detect(torchrun).has_agent
    assert not detect({"RANK": "1", "WORLD_SIZE": "2"}).has_agent  # env:// set by hand
    assert not detect({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7",
                       "SLURM_STEP_ID": "0"}).has_agent
    with pytest.raises(StoppedBySignal) as stop, interrupt_on_signals(by_launcher=True):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
    assert stop.value.by_launcher and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL


AS_AN_AGENTS_WORKER = """
import os, signal, sys
import nlptrain.cli as cli
import nlptrain.command_end as command_end
import nlptrain.recipe as recipe
command_end.under_agent = lambda: True  # a worker of torchrun, --nproc
made = recipe.DistTrainer
def agent_stops_it(*args, **kwargs):  # the agent's SIGTERM as another rank failed, before
    os.kill(os.getpid(), signal.SIGTERM)  # this one trained or wrote anything
    return made(*args, **kwargs)
recipe.DistTrainer = agent_stops_it
sys.exit(cli.main(sys.argv[1:]))
"""


def test_a_workers_new_run_stopped_by_its_agent_before_training_is_removed_without_a_word(
        toy_task, tmp_path):
    """The agent's SIGTERM ended such a worker before its cleanup: its new run, with nothing
    but config.json in it, stayed, and the same command once fixed was refused there ("already
    holds a run"; test_per_rank.py's bad row in one rank's file failed so in a CI run). Now the
    cleanup runs, and the worker ends without a line of its own: the failing rank's error and
    the agent's summary say what happened; its record is dated after the failing rank's."""
    run, record = tmp_path / "run", tmp_path / "error.json"
    done = subprocess.run([sys.executable, "-c", AS_AN_AGENTS_WORKER, "train", "--task",
                           str(toy_task), "--output-dir", str(run)],
                          env=child_env(TORCHELASTIC_ERROR_FILE=str(record)), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    assert not run.exists(), sorted(p.name for p in run.iterdir())
    assert "interrupted" not in done.stderr, done.stderr[-3000:]
    assert "failed before it wrote anything" not in done.stderr  # (it was stopped, not failed)
    said = json.loads(record.read_text())["message"]
    assert said["message"] == "stopped by SIGTERM outside the training steps"
    assert int(said["extraInfo"]["timestamp"]) > time.time() - 60


def test_a_sigterm_to_the_process_group_stops_after_the_step_with_dataloader_workers(toy_task,
                                                                                     tmp_path):
    """A scheduler's preemption signals every process of the job: torch's handler ended the
    DataLoader workers at once, and the run failed on a worker gone (exit 1, no checkpoint)."""
    run = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "nlptrain", "train", "--task", str(toy_task), "--output-dir", str(run),
         "--set", "train.num_workers=2", "--callback", f"{SCAFFOLD}:SigtermProcessGroup"],
        env=child_env(AT_STEP="3"), capture_output=True, text=True, timeout=240,
        start_new_session=True)  # the group: this run and its workers alone
    assert done.returncode == 130, done.stderr[-3000:]
    assert f"stopped by a signal after step 4; continue with --resume --output-dir {run}" in \
        done.stderr, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "exited unexpectedly" not in done.stderr
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000004"
