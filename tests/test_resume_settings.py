"""A resume may change the lr, the weight decay and the lr schedule (after a divergence, the
non-finite-loss error says: lower the lr and resume); the checkpoint's optimizer state brought
the old run's back, silently. Now the resumed run goes on with the new ones, from the place on
the schedule it had reached, and says so; unchanged, it resumes number for number."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from log_capture import nlptrain_messages
from nlptrain.callbacks import Checkpointer
from toy_trainer import make_trainer

from nlptrain import Callback
from nlptrain.cli import main
from nlptrain.errors import CheckpointError

SCAFFOLD = str(Path(__file__).parent / "scaffold_callbacks.py")


class LrOfEachStep(Callback):
    """The lr each optimizer step uses (read once the schedule has set it for the step)."""

    def __init__(self) -> None:
        self.lr: dict[int, float] = {}
        self.weight_decay: dict[str, float] = {}

    def on_batch_start(self, trainer, batch) -> None:
        self.lr[trainer.global_step + 1] = trainer.optimizer.param_groups[0]["lr"]
        self.weight_decay = {g["name"]: g["weight_decay"] for g in trainer.optimizer.param_groups}


@pytest.fixture
def run_with_checkpoints(tmp_path, tiny_model_dir):
    """12 steps (2 epochs of 6), linear warmup over 10% then decay, lr 1e-3: the lr of each step,
    and the checkpoints every 2 steps."""
    folder, seen = tmp_path / "checkpoints", LrOfEachStep()
    make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2, keep=0), seen],
                 batch_size=4).fit()
    assert len(seen.lr) == 12 and seen.lr[12] < seen.lr[2]  # decaying
    return folder, seen.lr


def resume(tmp_path, tiny_model_dir, folder, **changes):
    seen = LrOfEachStep()
    with nlptrain_messages() as messages:
        trainer = make_trainer(tmp_path, tiny_model_dir, [seen], batch_size=4,
                               resume_from=folder / "step-00000004", **changes)
        trainer.fit()
    return seen, messages


def test_a_resume_with_a_lower_lr_goes_on_at_it_from_the_schedules_place(
        tmp_path, tiny_model_dir, run_with_checkpoints):
    folder, whole = run_with_checkpoints
    same, messages = resume(tmp_path, tiny_model_dir, folder)
    assert same.lr == {step: lr for step, lr in whole.items() if step > 4}  # to the last bit
    assert not any("as asked" in m for m in messages)

    lower, messages = resume(tmp_path, tiny_model_dir, folder, lr=2.5e-4, weight_decay=0.3)
    assert lower.lr.keys() == same.lr.keys()
    for step, lr in lower.lr.items():  # the same decay, a quarter as high
        assert lr == pytest.approx(whole[step] / 4, rel=1e-9), step
    assert lower.weight_decay == {"decay": 0.3, "no_decay": 0.0}
    assert any("the optimizer goes on with this run's settings: lr 0.001 -> 0.00025, "
               "weight_decay 0.01 -> 0.3" in m for m in messages), messages


def test_a_resume_with_another_schedule_follows_it_from_the_progress_reached(
        tmp_path, tiny_model_dir, run_with_checkpoints):
    folder, whole = run_with_checkpoints
    constant, messages = resume(tmp_path, tiny_model_dir, folder, scheduler="constant")
    assert set(constant.lr.values()) == {1e-3}  # was decaying: 1e-3 from step 5 on
    assert any("lr schedule: the run's was linear with warmup_ratio 0.1; it goes on as constant "
               "with warmup_ratio 0.1, as asked, from the progress reached (33%)" in m
               for m in messages), messages
    longer_warmup, _ = resume(tmp_path, tiny_model_dir, folder, warmup_ratio=0.5)
    # Linear warmup over the first 6 of 12 steps: steps 5 and 6 (progress 4/12, 5/12) still rise
    # to the peak at step 7, where the run's own schedule was decaying since step 2.
    for step, factor in ((5, 4 / 6), (6, 5 / 6), (7, 1.0)):
        assert longer_warmup.lr[step] == pytest.approx(1e-3 * factor, rel=1e-9), step
    assert whole[5] > whole[6] > whole[7]


def test_the_cli_resumes_with_a_lower_lr_and_refuses_other_parameter_groups(toy_task, tmp_path,
                                                                            capsys):
    run = tmp_path / "run"
    options = ["--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "5",
               "--log-every", "1"]
    assert main(["train", *options, "--epochs", "1", "--lr", "2e-3"]) == 0
    capsys.readouterr()
    assert main(["train", *options, "--resume", "--lr", "1e-3", "--layer-lr-decay", "0.9"]) == 1
    err = capsys.readouterr().err
    assert "a resume keeps the run's optimizer parameter groups, and these changed: " \
           "layer_lr_decay 1.0 -> 0.9;" in err, err
    assert main(["train", *options, "--resume", "--lr", "1e-3", "--epochs", "2"]) == 0
    err = capsys.readouterr().err
    assert "resume with changed settings: epochs 1 -> 2, lr 0.002 -> 0.001" in err, err
    assert "the optimizer goes on with this run's settings: lr 0.002 -> 0.001" in err, err
    rows = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    lrs = {r["step"]: r["lr"] for r in rows if r["kind"] == "train"}
    # The second epoch's lr follows the 2-epoch schedule (the run was planned again when the
    # 1-epoch one had ended), at the new lr: at most 1e-3.
    assert max(lr for step, lr in lrs.items() if step > 20) <= 1e-3 + 1e-12
    assert max(lr for step, lr in lrs.items() if step <= 20) > 1e-3


def test_a_diverged_run_resumes_at_the_lower_lr_its_error_advises(toy_task, tmp_path, capsys,
                                                                  monkeypatch):
    monkeypatch.setenv("AT_STEP", "6")  # the loss is infinite from step 7 while the lr > 1e-3
    run = tmp_path / "run"
    options = ["--task", str(toy_task), "--output-dir", str(run), "--checkpoint-every", "5",
               "--warmup-ratio", "0", "--callback", f"{SCAFFOLD}:DivergesAboveLr"]
    assert main(["train", *options, "--lr", "2e-3"]) == 1
    err = capsys.readouterr().err
    assert "the loss is not finite at epoch 1, batch 7 (optimizer step 7) on 1 rank(s); the " \
           "weights were not updated. Resume from the last checkpoint at a lower lr (--resume " \
           "--lr) or in fp32" in err, err
    again = ["train", "--output-dir", str(run), "--resume", "--callback",
             f"{SCAFFOLD}:DivergesAboveLr"]
    assert main(again) == 1  # the same lr: diverges again
    assert main([*again, "--lr", "1e-3"]) == 0
    assert json.loads((run / "results.json").read_text())["test"]["accuracy"] > 0.5
    assert json.loads((run / "config.json").read_text())["callbacks"] == \
        [f"{SCAFFOLD}:DivergesAboveLr"]
    capsys.readouterr()
    # A resume loads no code by itself: without the --callback, a warning names it.
    assert main(["train", "--output-dir", str(run), "--resume"]) == 0
    assert f"resume with changed callbacks: {SCAFFOLD}:DivergesAboveLr -> none; to keep a " \
           "callback, give its --callback again" in capsys.readouterr().err


def test_a_run_records_its_callbacks_with_absolute_paths(toy_task, tmp_path, capsys, monkeypatch):
    run, own = tmp_path / "run", tmp_path / "own_callbacks.py"
    own.write_text("from nlptrain import Callback\n\nclass Quiet(Callback):\n    pass\n\n"
                   "class AlsoQuiet(Callback):\n    pass\n")
    monkeypatch.chdir(tmp_path)  # given relative, recorded absolute: a resume may start elsewhere
    options = ["--task", str(toy_task), "--output-dir", str(run), "--epochs", "1"]
    assert main(["train", *options, "--callback", "own_callbacks.py:Quiet"]) == 0
    assert json.loads((run / "config.json").read_text())["callbacks"] == [f"{own}:Quiet"]
    capsys.readouterr()
    assert main(["train", *options, "--resume", "--epochs", "2", "--callback",
                 "own_callbacks.py:AlsoQuiet", "--callback", "own_callbacks.py:Quiet"]) == 0
    err = capsys.readouterr().err
    # Only added: said, with no advice to give one again.
    assert f"resume with changed callbacks: {own}:Quiet -> {own}:AlsoQuiet, {own}:Quiet\n" in err


class CountsSteps(Callback):
    """A user's callback with state in the checkpoint."""

    def __init__(self) -> None:
        self.steps = 0

    def on_step_end(self, trainer) -> None:
        self.steps += 1

    def on_save_checkpoint(self, trainer, state) -> None:
        state["counts_steps"] = self.steps

    def on_load_checkpoint(self, trainer, state) -> None:
        self.steps = state.get("counts_steps", 0)


def test_a_library_resume_names_the_callbacks_with_state_it_left_out(tmp_path, tiny_model_dir):
    folder = tmp_path / "checkpoints"
    make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2), CountsSteps()],
                 batch_size=4, epochs=1, ema_decay=0.9).fit()
    with nlptrain_messages() as messages:
        counter = CountsSteps()
        make_trainer(tmp_path, tiny_model_dir, [counter], batch_size=4, ema_decay=0.9,
                     resume_from=folder)
    assert counter.steps == 6 and not any("the state of callback" in m for m in messages)
    with nlptrain_messages() as messages:
        make_trainer(tmp_path, tiny_model_dir, [], batch_size=4, resume_from=folder)
    assert "the checkpoint holds the state of callback(s) CountsSteps, EMA, which this run has " \
           "not: it goes on without them (to keep one, give it again, or the option that makes it)" \
        in messages, messages


def test_warmup_steps_warm_up_over_that_many_steps_and_resume_exactly(tmp_path, tiny_model_dir):
    """12 steps, warmup_steps 3: the lr rises 0, 1/3, 2/3 of the peak, peaks at step 4, then decays
    to 0 after step 12; a run crashed after step 5 and resumed ends with the same weights."""
    from toy_trainer import crash_then_resume

    seen = LrOfEachStep()
    (tmp_path / "whole").mkdir()
    whole = make_trainer(tmp_path / "whole", tiny_model_dir, [seen], batch_size=4, warmup_steps=3)
    whole.fit()
    expected = [0, 1 / 3, 2 / 3, 1] + [(12 - step) / 9 for step in range(4, 12)]
    assert [seen.lr[step] for step in range(1, 13)] == pytest.approx([1e-3 * f for f in expected])
    resumed = crash_then_resume(tmp_path, tiny_model_dir, list, crash_after=5, every=2,
                                batch_size=4, warmup_steps=3)
    for name, weight in whole.unwrapped_model.state_dict().items():
        assert torch.equal(weight, resumed.unwrapped_model.state_dict()[name]), name


def test_a_resume_with_fewer_epochs_than_it_reached_says_it_stopped_mid_epoch(tmp_path,
                                                                             tiny_model_dir):
    """Stopped in epoch 2 and resumed with epochs 1: it said 'the run had finished its 1
    epoch(s)', of a run that had trained 1.5."""
    from toy_trainer import RaiseAfterStep

    folder = tmp_path / "checkpoints"
    settings = dict(epochs=2, batch_size=4)  # 24 rows: 6 steps an epoch
    with pytest.raises(RuntimeError, match="crash after step 10"):
        make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, 3), RaiseAfterStep(10)],
                     **settings).fit()
    with nlptrain_messages() as messages:
        trainer = make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, 3)],
                               resume_from=folder, **{**settings, "epochs": 1})
    assert trainer.global_step == 9
    assert any("the run stopped inside epoch 2 (step 9), past the 1 epoch(s) asked for now: "
               "nothing more is trained" in m for m in messages), messages
    assert not any("finished its 1 epoch(s)" in m for m in messages)


def test_a_resume_asking_fewer_epochs_than_reached_keeps_the_runs_epochs_on_record(
        toy_task, tmp_path, capsys):
    """Stopped inside epoch 2 of 3 and resumed with --epochs 1: nothing trains (said), and its
    config.json and report said epochs 1, for a run set to 3 that trained 1.5."""
    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run)]
    assert main([*args, "--epochs", "3", "--max-steps", "15", "--batch-size", "16"]) == 0
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "1"]) == 0
    assert "past the 1 epoch(s) asked for now: nothing more is trained" in capsys.readouterr().err
    assert json.loads((run / "config.json").read_text())["task"]["train"]["epochs"] == 3
    assert "| epochs | 3 |" in (run / "report.md").read_text()


def test_the_library_refuses_to_resume_in_another_data_order(tmp_path, tiny_model_dir):
    folder = tmp_path / "checkpoints"
    make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2)], batch_size=4,
                 epochs=1).fit()
    with pytest.raises(CheckpointError, match=r"another data order \(batch_size 4 -> 8\): some "
                                              r"rows would be trained twice, others never"):
        make_trainer(tmp_path, tiny_model_dir, [], batch_size=8, resume_from=folder)
    make_trainer(tmp_path, tiny_model_dir, [], batch_size=4, resume_from=folder)  # the same: fine
    # Windows counted from the epoch's start: the first after a resume took 2 micro-batches of 4.
    with pytest.raises(CheckpointError, match=r"another data order \(grad_accum 1 -> 4\): the "
                                              r"first step after it would sum another count"):
        make_trainer(tmp_path, tiny_model_dir, [], batch_size=4, grad_accum=4, resume_from=folder)
    budget = tmp_path / "budget"  # a token budget's batches are planned on the padded widths
    make_trainer(tmp_path, tiny_model_dir, [Checkpointer(budget, every=2)], max_tokens=256,
                 epochs=1).fit()
    with pytest.raises(CheckpointError, match=r"another data order \(pad_to_multiple_of 8 -> 1\)"):
        make_trainer(tmp_path, tiny_model_dir, [], max_tokens=256, pad_to_multiple_of=1,
                     resume_from=budget)


def test_the_optimizer_changes_said_on_resume_are_the_runs_lr_and_weight_decay():
    """Under layer-wise lr decay the line said the embeddings' lr (lr x decay^layers), and of a
    no-decay group's weight decay, its 0."""
    from nlptrain.optim import keep_group_settings

    weights = [torch.nn.Parameter(torch.zeros(1)) for _ in range(3)]
    optimizer = torch.optim.AdamW([{"params": [w], "lr": lr, "weight_decay": wd} for w, lr, wd in
                                   zip(weights, (2.5e-4, 5e-4, 1e-3), (0.01, 0.0, 0.01), strict=True)])
    wanted = [{"lr": 2 * group["lr"], "weight_decay": 2 * group["weight_decay"]}
              for group in optimizer.param_groups]
    assert keep_group_settings(optimizer, wanted) == ["lr 0.001 -> 0.002",
                                                      "weight_decay 0.01 -> 0.02"]


def test_a_finished_run_whose_checkpoints_were_removed_is_not_trained_again_over(
        toy_task, tmp_path, capsys):
    """Its closing line says checkpoints/ is safe to remove once the run is done; a resume then
    began from the pre-trained weights and replaced the run's results, model and record."""
    import shutil

    run = tmp_path / "run"
    assert main(["train", "--task", str(toy_task), "--output-dir", str(run), "--epochs", "1",
                 "--max-steps", "4", "--batch-size", "16"]) == 0
    shutil.rmtree(run / "checkpoints")
    results, config = (run / "results.json").read_bytes(), (run / "config.json").read_bytes()
    capsys.readouterr()
    assert main(["train", "--output-dir", str(run), "--resume", "--epochs", "2"]) == 1
    assert "holds a finished run and no checkpoint to go on from (checkpoints/ is gone or " \
           "empty)" in capsys.readouterr().err
    assert (run / "results.json").read_bytes() == results
    assert (run / "config.json").read_bytes() == config


class LatestSeen(Callback):
    """What a callback reads of the run so far: at the start, and after each optimizer step."""

    def __init__(self) -> None:
        self.at: dict[object, tuple] = {}

    @staticmethod
    def seen(trainer) -> tuple:
        loss, rows = trainer.step_loss, trainer.step_rows
        return (None if loss is None else loss.item(), None if rows is None else rows.item(),
                trainer.step_lr, trainer.metrics)

    def on_train_start(self, trainer) -> None:
        self.at["start"] = self.seen(trainer)

    def on_batch_end(self, trainer) -> None:
        if trainer.is_update_step:
            self.at[trainer.global_step] = self.seen(trainer)


def test_a_resume_gives_back_the_latest_steps_loss_rows_lr_and_metrics(tmp_path, tiny_model_dir):
    """After a resume they were empty (None, NaN, {}) until the next step or evaluation, and
    step_lr was the next step's: a callback at on_train_start saw another run than the one
    that wrote the checkpoint."""
    from toy_trainer import crash_then_resume

    made: list[LatestSeen] = []

    def callbacks() -> list[LatestSeen]:
        made.append(LatestSeen())
        return made[-1:]

    crash_then_resume(tmp_path, tiny_model_dir, callbacks, crash_after=5, every=2, eval_every=2)
    crashed, resumed = made
    loss, rows, lr, metrics = crashed.at[4]  # the checkpoint's step, and its evaluation
    assert rows == 8 and lr > 0 and metrics["step"] == 4
    assert resumed.at["start"] == (loss, rows, lr, metrics)
    assert resumed.at[5][:3] == crashed.at[5][:3]  # and the run goes on as the crashed one did


def test_a_metric_a_checkpoint_cannot_hold_is_left_out_of_the_resumed_metrics(tmp_path, tiny_model_dir):
    """A user's metric may return anything that its logs can show; the checkpoint keeps the
    plain ones for the resume rather than refusing to be written."""
    from nlptrain.checkpoint import load_checkpoint, save_checkpoint

    trainer = make_trainer(tmp_path, tiny_model_dir, [])
    trainer.metrics = {"accuracy": np.float64(0.5), "report": "text", "odd": object()}
    save_checkpoint(trainer, tmp_path / "checkpoint")
    resumed = make_trainer(tmp_path, tiny_model_dir, [])
    load_checkpoint(resumed, tmp_path / "checkpoint")
    assert resumed.metrics == {"accuracy": 0.5, "report": "text"}
