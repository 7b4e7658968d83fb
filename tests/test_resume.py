"""Checkpoints and exact resume: crashes, SIGTERM, SIGKILL under torchrun, NaN, unsafe files."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest
import torch
from conftest import REPO, TWO_RANK_TRAIN, run_cli, write_toy_task
from finetune_setup import StopAt
from nlptrain.callbacks import Checkpointer
from safetensors.torch import load_file
from toy_trainer import best_run_args, make_trainer, results, weights
from transformers import BertConfig, BertForSequenceClassification

from nlptrain import TrainConfig, Trainer
from nlptrain.checkpoint import list_checkpoints, load_checkpoint
from nlptrain.cli import main
from nlptrain.errors import CheckpointError
from nlptrain.integrity import file_checksums
from nlptrain.models import load_model
from nlptrain.precision import PIN_VARIABLE

SCAFFOLD = str(REPO / "tests" / "scaffold_callbacks.py")


def assert_same_run(a: Path, b: Path) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for name in wa:
        assert torch.equal(wa[name], wb[name]), name
    assert results(a)["test"] == results(b)["test"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tiny_model_dir) -> Path:
    """The toy task (the same rows as `toy_task`'s) trained without a stop, once for the module."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    task = write_toy_task(folder, tiny_model_dir, folder / "cache")
    run = folder / "whole"
    assert main(["train", "--task", str(task), "--output-dir", str(run),
                 "--checkpoint-every", "3"]) == 0
    return run


def test_crash_then_resume_equals_an_uninterrupted_run(toy_task, tmp_path, uninterrupted, monkeypatch):
    run = tmp_path / "crashed"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "3"]
    monkeypatch.setenv("AT_STEP", "25")  # epoch 2 of 2, mid-epoch; last checkpoint at step 24
    with pytest.raises(RuntimeError, match="injected crash at step 25"):
        main([*args, "--callback", f"{SCAFFOLD}:RaiseAtStep"])
    assert [p.name for p in list_checkpoints(run / "checkpoints")][-1] == "step-00000024"
    assert main([*args, "--resume"]) == 0
    assert_same_run(uninterrupted, run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows if r["kind"] == "eval"] == [1, 2]


def test_sigterm_checkpoints_exits_nonzero_and_resumes_exactly(toy_task, tmp_path, uninterrupted,
                                                              capsys, monkeypatch):
    run = tmp_path / "stopped"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "3"]
    monkeypatch.setenv("AT_STEP", "7")
    assert main([*args, "--callback", f"{SCAFFOLD}:SigtermRank0"]) == 130
    # Sent after step 7: step 8's flags carry the stop (read a step late), the run ends after it.
    # The command line's cure names the folder: --resume alone would start a new run elsewhere.
    err = capsys.readouterr().err  # (asked for: no "error:")
    assert f"\nstopped by a signal after step 8; continue with --resume --output-dir {run}\n" in err
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000008"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # handlers restored
    assert main([*args, "--resume"]) == 0
    assert_same_run(uninterrupted, run)


def test_a_second_ctrl_c_stops_at_once_says_so_and_the_run_resumes_exactly(
        toy_task, tmp_path, uninterrupted, capsys, monkeypatch):
    run = tmp_path / "killed"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "3"]
    monkeypatch.setenv("AT_STEP", "8")
    assert main([*args, "--callback", f"{SCAFFOLD}:SecondCtrlCAtStep"]) == 130
    err = capsys.readouterr().err
    assert "interrupted: stopped at once" in err and "train --resume" in err
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000006"
    assert main([*args, "--resume"]) == 0
    assert_same_run(uninterrupted, run)


@pytest.mark.parametrize(("fault", "at_step"), [("SigtermDuringEvaluation", "20"),
                                                ("SigtermRank0", "19")])
def test_sigterm_at_the_epoch_end_stops_with_130_and_resumes_exactly(
        toy_task, tmp_path, uninterrupted, capsys, monkeypatch, fault, at_step):
    """Epoch 1 of 2 ends at step 20. A SIGTERM during its evaluation, or during its last step
    (read with step 20's flags, before the evaluation): the checkpoint of step 20 holds the
    epoch's end done, or still to do; either way the resume evaluates step 20 once, as the
    uninterrupted run did, and trains on to the same weights."""
    run = tmp_path / "stopped"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "3"]
    monkeypatch.setenv("AT_STEP", at_step)
    assert main([*args, "--callback", f"{SCAFFOLD}:{fault}"]) == 130
    assert "stopped by a signal after step 20" in capsys.readouterr().err
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000020"
    assert not (run / "model").exists()  # no export of a run that did not finish
    assert main([*args, "--resume"]) == 0
    assert_same_run(uninterrupted, run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r["kind"] == "eval"] == [20, 40]


def test_nan_loss_stops_naming_the_step_and_keeps_the_last_good_checkpoint(toy_task, tmp_path,
                                                                           capsys, monkeypatch):
    monkeypatch.setenv("AT_STEP", "4")
    run = tmp_path / "nan"
    code = main(["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "2",
                 "--callback", f"{SCAFFOLD}:PoisonWeights"])
    err = capsys.readouterr().err
    assert code == 1
    assert "the loss is not finite at epoch 1, batch 5 (optimizer step 5)" in err
    last = list_checkpoints(run / "checkpoints")[-1]
    assert last.name == "step-00000004"
    saved = load_file(last / "model.safetensors")
    assert all(torch.isfinite(t).all() for t in saved.values())


def test_sigkill_under_torchrun_restarts_and_matches_the_uninterrupted_run(toy_folder, two_rank_run,
                                                                          tmp_path):
    killed = run_cli([*TWO_RANK_TRAIN, "--output-dir", str(tmp_path / "killed"), "--checkpoint-every",
                      "2", "--callback", f"{SCAFFOLD}:KillRank1"], toy_folder,
                     torchrun_args=["--standalone", "--nproc_per_node=2", "--max-restarts=1"],
                     AT_STEP="5")
    assert killed.returncode == 0, killed.stderr[-3000:]
    assert "resumed from" in killed.stderr and "step-00000004" in killed.stderr
    assert_same_run(two_rank_run.folder, tmp_path / "killed")


def test_sigterm_to_one_rank_stops_both_after_the_same_step(toy_task, tmp_path):
    run = tmp_path / "run"
    out = run_cli(["train", "--task", str(toy_task), "--output-dir", str(run),
                   "--callback", f"{SCAFFOLD}:SigtermRank0"], tmp_path, nproc=2, AT_STEP="3")
    assert out.returncode != 0
    # Sent to rank 0 after step 3: both ranks read the stop in step 4's flags and end after it.
    told = [line for line in out.stderr.splitlines() if "stopped by a signal after step 4" in line]
    assert len(told) == 2, told  # rank 0 reports, once; torchrun's root cause quotes it
    assert told[0].startswith("stopped by a signal") and "traceback : stopped by a signal" in told[1]
    assert list_checkpoints(run / "checkpoints")[-1].name == "step-00000004"


def test_kill_while_writing_a_checkpoint_keeps_the_previous_one(toy_task, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "2"]
    died = run_cli([*args, "--callback", f"{SCAFFOLD}:DieWhileWritingCheckpoint"], tmp_path)
    assert died.returncode == -signal.SIGKILL
    assert [p.name for p in list_checkpoints(run / "checkpoints")] == ["step-00000002"]
    assert any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())
    left = sorted(p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp-"))
    assert main([*args, "--resume", "--log-level", "info"]) == 0  # here: no process to start
    err = capsys.readouterr().err
    assert "resumed from" in err and "step-00000002" in err
    # The resume holds the folder's lock: what is half-written there is the dead run's, cleared.
    assert f"{run}: cleared what a crash left half-written: {', '.join(left)}" in err
    assert not any(p.name.startswith(".tmp-") for p in (run / "checkpoints").iterdir())


class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {os.environ['MARKER']}",))


def test_a_checkpoint_that_would_run_code_is_refused(toy_task, tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1"]
    assert main(args) == 0
    last = list_checkpoints(run / "checkpoints")[-1]
    marker = tmp_path / "pwned"
    monkeypatch.setenv("MARKER", str(marker))
    torch.save({"progress": Payload()}, last / "state.pt")
    # Whoever swapped the file also recorded its checksum: the load itself must refuse it.
    meta = json.loads((last / "meta.json").read_text())
    (last / "meta.json").write_text(json.dumps({**meta, "files": file_checksums(last)}))
    capsys.readouterr()
    assert main([*args, "--resume"]) == 1
    assert "state.pt: refused: it holds Python objects that could run code" in capsys.readouterr().err
    assert not marker.exists()


def test_a_checkpoint_of_another_task_is_refused(toy_task, tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1"]) == 0
    trainer = make_trainer(tmp_path, tiny_model_dir, [])
    trainer.label_names = ["neg", "neutral"]
    with pytest.raises(CheckpointError, match="made for another model or task .labels"):
        load_checkpoint(trainer, list_checkpoints(run / "checkpoints")[-1])
    # The same model type, width, depth and labels, but other shapes (a wider feed-forward); the
    # run's batch_size, so that its data order is not what is refused.
    config = BertConfig(**{**load_model(str(tiny_model_dir), ["neg", "pos"]).config.to_dict(),
                           "intermediate_size": 48})
    other = Trainer(BertForSequenceClassification(config), config=TrainConfig(batch_size=8))
    with pytest.raises(CheckpointError, match="weights do not fit this model .size mismatch for "):
        load_checkpoint(other, list_checkpoints(run / "checkpoints")[-1])


def test_resume_with_another_world_size_trains_each_remaining_row_once(toy_task, tmp_path,
                                                                      monkeypatch, capsys):
    """2 ranks crash at step 5 (checkpoint at 4); 1 process resumes: epoch 1 is still exactly
    one pass over the data, without reading the skipped batches again."""
    run, rows_file = tmp_path / "run", tmp_path / "rows.txt"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "4",
            "--epochs", "1", "--callback", f"{SCAFFOLD}:RecordRows"]
    crashed = run_cli([*args, "--callback", f"{SCAFFOLD}:RaiseAtStep"], tmp_path, nproc=2,
                      AT_STEP="5", ROWS_FILE=str(rows_file))
    assert crashed.returncode != 0 and "injected crash at step 5" in crashed.stderr
    before = [line.split() for line in rows_file.read_text().splitlines()]
    kept = [int(row) for _, _, step, row in before if int(step) <= 4]  # what step-4 holds
    assert len(kept) == 4 * 2 * 8
    rows_file.unlink()
    monkeypatch.setenv("ROWS_FILE", str(rows_file))
    assert main([*args, "--resume"]) == 0  # one process: here
    assert "written by 2 ranks, this job has 1" in capsys.readouterr().err
    after = [int(line.split()[3]) for line in rows_file.read_text().splitlines()]
    assert len(after) == 160 - 64
    assert sorted(kept + after) == list(range(160))  # every row once, none skipped or repeated


@pytest.mark.parametrize(("extra", "best_step", "crashes"), [
    # An epoch-end checkpoint (step 15, also a --checkpoint-every step) and a later one (24).
    (("--checkpoint-every", "3"), "15", ("16", "25")),
    # A checkpoint at a step that also evaluates (--eval-every), crash before the next.
    (("--checkpoint-every", "5", "--eval-every", "5"), "5", ("7",)),
])
def test_a_resume_that_finds_no_better_model_keeps_the_best(toy_task, tmp_path, monkeypatch,
                                                              extra, best_step, crashes):
    """The checkpoint holds the step's evaluation and the best model's metrics: a resumed run
    whose evaluations never beat the best still ends with it, as the run that never stopped."""
    monkeypatch.setenv("BEST_STEP", best_step)
    whole = tmp_path / "whole"
    assert main(best_run_args(toy_task, whole, *extra)) == 0
    assert results(whole)["valid"]["step"] == int(best_step)
    for crash in crashes:
        run = tmp_path / f"crash-{crash}"
        monkeypatch.setenv("AT_STEP", crash)
        with pytest.raises(RuntimeError, match=f"injected crash at step {crash}"):
            main([*best_run_args(toy_task, run, *extra), "--callback", f"{SCAFFOLD}:RaiseAtStep"])
        assert main([*best_run_args(toy_task, run, *extra), "--resume"]) == 0
        assert_same_run(whole, run)
        assert results(run)["valid"] == results(whole)["valid"]


def test_a_stream_resumed_mid_epoch_equals_an_uninterrupted_run(toy_task, tmp_path, monkeypatch):
    """A stream resumes by reading past the batches done: the epoch keeps its length (20 steps
    of 8 rows), no batch is trained twice, and the weights are those of the run never stopped."""
    def args(run: Path) -> list[str]:
        return ["train", "--task", str(toy_task), "--output-dir", str(run), "--streaming",
                "--checkpoint-every", "3"]

    assert main(args(tmp_path / "whole")) == 0
    monkeypatch.setenv("AT_STEP", "25")  # epoch 2, batch 5; the checkpoint is at step 24
    with pytest.raises(RuntimeError, match="injected crash at step 25"):
        main([*args(tmp_path / "run"), "--callback", f"{SCAFFOLD}:RaiseAtStep"])
    assert main([*args(tmp_path / "run"), "--resume"]) == 0
    assert_same_run(tmp_path / "whole", tmp_path / "run")
    steps = [json.loads(line)["step"] for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert max(steps) == 40  # 2 epochs of 20 steps, the resumed one too


def test_an_evaluation_leaves_the_training_randomness_as_it_was(tmp_path, tiny_model_dir):
    # A run stopped by a callback mid-epoch evaluates once more before its checkpoint, and a
    # resume may change eval_every: an evaluation that drew from the global RNG (a DataLoader
    # iterator's seed) would give the resumed run other dropout masks than an uninterrupted one.
    trainer = make_trainer(tmp_path, tiny_model_dir, [])
    before = torch.get_rng_state()
    assert trainer.validate()["rows"] == 10
    assert torch.equal(torch.get_rng_state(), before)

def test_the_library_resumes_from_a_checkpointers_folder_in_the_runs_precision(
        tmp_path, tiny_model_dir, monkeypatch, caplog):
    # Trainer(resume_from=folder): nothing there yet starts afresh; later, the newest whole
    # checkpoint, and "auto" keeps the precision the run began in (bf16 here), whatever this
    # machine would pick now (fp32), so the run ends as an uninterrupted one.
    folder = tmp_path / "ckpt"
    monkeypatch.setenv(PIN_VARIABLE, "bf16")
    whole = make_trainer(tmp_path, tiny_model_dir, [], precision="bf16")
    whole.fit()
    with caplog.at_level("INFO", logger="nlptrain"):
        first = make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2, keep=0),
                                                        StopAt(4)], resume_from=folder, precision="auto")
    assert first.resumed_from is None and "no checkpoint yet" in caplog.text
    first.fit()
    monkeypatch.setenv(PIN_VARIABLE, "fp32")
    with caplog.at_level("INFO", logger="nlptrain"):
        resumed = make_trainer(tmp_path, tiny_model_dir, [], resume_from=folder, precision="auto")
    newest = list_checkpoints(folder)[-1]  # where the first run stopped, mid-epoch 2
    assert resumed.resumed_from == newest and resumed.global_step == first.global_step < 6
    assert resumed.config.precision == "bf16" and f"precision auto: bf16 (kept from {newest.name}" \
        in caplog.text
    resumed.fit()
    for (name, a), b in zip(whole.unwrapped_model.state_dict().items(),
                            resumed.unwrapped_model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    # The best model so far was picked by accuracy: a resume by the loss would compare the two.
    with pytest.raises(CheckpointError, match=r"picked by 'accuracy'; resume with that "
                                              r"metric_for_best, not 'loss'"):
        make_trainer(tmp_path, tiny_model_dir, [], resume_from=folder, metric_for_best="loss")
    # One checkpoint by name; a damaged one is refused before anything is loaded.
    assert make_trainer(tmp_path, tiny_model_dir, [], resume_from=folder / "step-00000002"
                        ).global_step == 2
    (folder / "step-00000002" / "state.pt").write_bytes(b"cut short")
    with pytest.raises(CheckpointError, match=r"step-00000002/state.pt: damaged \(size 9 of \d+ "
                                              r"bytes\): cannot resume from"):
        make_trainer(tmp_path, tiny_model_dir, [], resume_from=folder / "step-00000002")


def test_a_resume_from_an_earlier_step_sets_the_later_ones_aside(tmp_path, tiny_model_dir):
    """Going back to step 4 of a 12-step run in the same folder: steps 6-12 are the abandoned
    run's. Left as they were, they outlived this run's own checkpoints in pruning, and the next
    restart resumed the abandoned run; now they are renamed aside, kept, never resumed."""
    from toy_trainer import RaiseAfterStep

    from nlptrain.checkpoint import checkpoint_to_resume
    from nlptrain.distributed import SingleProcess

    folder = tmp_path / "checkpoints"
    make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2, keep=0)],
                 batch_size=4).fit()  # 24 rows: 6 steps an epoch, 2 epochs
    assert [p.name for p in list_checkpoints(folder)][-1] == "step-00000012"
    branch = make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2, keep=3),
                                                     RaiseAfterStep(7)],
                          batch_size=4, resume_from=folder / "step-00000004")
    with pytest.raises(RuntimeError, match="crash after step 7"):
        branch.fit()
    assert [p.name for p in list_checkpoints(folder)] == ["step-00000002", "step-00000004",
                                                          "step-00000006"]  # keep=3
    assert checkpoint_to_resume(folder, SingleProcess()).name == "step-00000006"
    aside = sorted(p.name.split("-set-aside-")[0] for p in folder.glob("step-*-set-aside-*"))
    assert aside == ["step-00000006", "step-00000008", "step-00000010", "step-00000012"]
    assert all((p / "meta.json").is_file() for p in folder.glob("step-*-set-aside-*"))


def test_a_resume_that_names_no_task_goes_on_with_the_runs_own_settings(toy_task, tmp_path,
                                                                        monkeypatch, capsys):
    """`train --output-dir RUN --resume` alone: the task file and the options the run began with
    come from its config.json (not the default task's), so it ends as the run never stopped; an
    option given with the resume changes the run, said in the log and kept in config.json."""
    options = ["--task", str(toy_task), "--lr", "2e-3", "--epochs", "3", "--log-every", "2",
               "--checkpoint-every", "3"]
    whole, run = tmp_path / "whole", tmp_path / "run"
    assert main(["train", "--output-dir", str(whole), *options]) == 0
    monkeypatch.setenv("AT_STEP", "25")  # epoch 2, mid-epoch; the last checkpoint is at step 24
    with pytest.raises(RuntimeError, match="injected crash at step 25"):
        main(["train", "--output-dir", str(run), *options, "--callback", f"{SCAFFOLD}:RaiseAtStep"])
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume"]) == 0
    assert "changed settings" not in capsys.readouterr().err
    assert_same_run(whole, run)

    def steps(folder: Path) -> list[int]:
        return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").open()]

    assert steps(run) == steps(whole) and max(steps(run)) == 60  # 3 epochs, logged every 2 steps
    assert main(["train", "--output-dir", str(run), "--resume"]) == 0  # finished: tests, exports
    assert "the run had finished 3 epoch(s) (step 60); nothing left to train" in \
        capsys.readouterr().err
    assert max(steps(run)) == 60
    # Fewer epochs than it trained: nothing trains, and its record still says 3, not 2.
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "2"]) == 0
    assert "the run had finished 3 epoch(s) (step 60), past the 2 asked for now; nothing left " \
        "to train" in capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["task"]["train"]["epochs"] == 3
    assert "| epochs | 3 |" in (run / "report.md").read_text()
    assert max(steps(run)) == 60
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "4"]) == 0
    err = capsys.readouterr().err
    assert "resume with changed settings: epochs 3 -> 4" in err
    assert max(steps(run)) == 80
    # The linear decay had reached 0 at step 60: the added epoch trains on the schedule planned
    # over 80 steps (warmup 8), not at lr 0.
    assert "lr schedule: it had ended at step 60 (lr 0); planned again over 80 steps" in err
    lrs = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").open())
           if r["kind"] == "train"}
    for step in (62, 70, 80):
        assert lrs[step] == pytest.approx(2e-3 * (80 - (step - 1)) / 72, rel=1e-3), step
    config = json.loads((run / "config.json").read_text())
    assert config["task"]["train"]["epochs"] == 4 and config["task"]["train"]["lr"] == 2e-3
    assert [r["changed"] for r in config["resumes"]] == [[], [], ["epochs 3 -> 2"], ["epochs 3 -> 4"]]
