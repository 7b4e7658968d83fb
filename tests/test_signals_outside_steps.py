"""SIGTERM and SIGHUP outside the training steps (reading the data, the final scoring, export and
report) are a Ctrl-C: the command stops at once and says how to go on. They ended the process
without a word (a cluster's preemption in the test scoring left no line in the job's log)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest
from conftest import REPO

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


def test_under_torchs_agent_a_sigterm_is_left_as_it_was():
    """The agent (torchrun, --nproc) SIGTERMs every worker when one fails: a line saying 'run it
    again' from each would bury the failing rank's error. It says its own stop itself."""
    from nlptrain.environments import detect

    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "TORCHELASTIC_RUN_ID": "abc",
                "TORCHELASTIC_RESTART_COUNT": "0"}
    assert detect(torchrun).has_agent
    assert not detect({"RANK": "1", "WORLD_SIZE": "2"}).has_agent  # env:// set by hand
    assert not detect({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_ID": "7",
                       "SLURM_STEP_ID": "0"}).has_agent
    with interrupt_on_signals(enabled=False):
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
