"""Early stopping and resume: the run ends at the evaluation that decided the stop (on 2 ranks:
test_ddp.py), and a resume of a stopped run trains no further unless told to (and says so)."""

from __future__ import annotations

import json

from toy_trainer import best_run_args, results

from nlptrain.checkpoint import list_checkpoints
from nlptrain.cli import main


def test_a_run_stopped_early_is_not_trained_further_by_a_resume(toy_task, tmp_path, monkeypatch):
    """Early stopping ends the run after epoch 2 of 4; a resume from its last checkpoint (a
    restart after a crash in the final test or export) trains no further."""
    monkeypatch.setenv("BEST_STEP", "15")  # epoch 2's evaluation is worse: patience 1 stops
    run = tmp_path / "run"
    args = best_run_args(toy_task, run, "--epochs", "4", "--early-stopping", "1")
    assert main(args) == 0
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000030"
    assert main([*args, "--resume"]) == 0
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000030"
    assert max(json.loads(line)["step"] for line in (run / "metrics.jsonl").open()) == 30


def test_early_stopping_ends_the_run_at_the_evaluation_that_decided_it(toy_task, tmp_path,
                                                                       monkeypatch, capsys):
    """Evaluations at steps 5 and 10; the one at 10 is worse (spoiled) and patience is 1: the
    run ends at step 10, the step whose evaluation stopped it. No step 11 trained past the
    decision, no second evaluation of it, and the last checkpoint is step 10's."""
    monkeypatch.setenv("BEST_STEP", "5")
    run = tmp_path / "run"
    assert main(best_run_args(toy_task, run, "--eval-every", "5", "--early-stopping", "1",
                          "--checkpoint-every", "5")) == 0
    err = capsys.readouterr().err
    # The decision follows the evaluation it was taken on, in the log too.
    assert err.index("validation at step 10:") < err.index("early stop at step 10"), err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [5, 10]
    assert max(r["step"] for r in rows) == 10
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000010"
    assert results(run)["valid"]["step"] == 5  # the best model's
    # Resumed, the stop holds, and says how to train on; without early stopping it does.
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "3"]) == 0
    assert "early stopping had stopped this run at step 10 (1 evaluations without a better " \
           "loss, patience 1): nothing more is trained" in capsys.readouterr().err
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000010"
    assert main(["train", "--output-dir", str(run), "--resume", "--early-stopping", "0"]) == 0
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000045"  # --epochs 3 kept
