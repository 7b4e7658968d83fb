"""The built-in callbacks the trainer adds from its config (early stopping, clipping, schedule)
and its progress bar."""

from __future__ import annotations

import json

import pytest
import torch
from nlptrain.callbacks import EarlyStopping, GradClip, MetricLogger, SaveBestModel
from toy_trainer import Recorder, make_trainer, toy_datasets

from nlptrain import Callback, TrainConfig, Trainer
from nlptrain.models import load_model


def test_early_stopping_stops_after_patience_evaluations_without_improvement(tmp_path, tiny_model_dir,
                                                                            caplog):
    recorder = Recorder()
    # lr 0: the model never changes, so only the first evaluation is "best".
    trainer = make_trainer(tmp_path, tiny_model_dir, [recorder], epochs=10, lr=0.0, early_stopping=2)
    assert any(isinstance(c, EarlyStopping) for c in trainer.callbacks.callbacks)
    with caplog.at_level("INFO", logger="nlptrain"):
        trainer.fit()
    assert recorder.events.count("on_valid_end") == 3  # best, then 2 without improvement
    assert trainer.epoch == 3 and trainer.should_stop
    # The message stands on its own (it comes before the progress line of the same evaluation).
    best = trainer.best_metric
    stops = [r.getMessage() for r in caplog.records if r.getMessage().startswith("early stop")]
    assert stops == [f"early stop at step {trainer.global_step}: accuracy {best:.4f}, not better "
                     f"than the best ({best:.4f}) for 2 evaluations (patience 2)"]


def test_early_stopping_without_eval_data_says_it_has_nothing_to_watch(tmp_path, tiny_model_dir,
                                                                       caplog):
    trainer = make_trainer(tmp_path, tiny_model_dir, [], epochs=2, early_stopping=1)
    trainer.eval_data = None
    with caplog.at_level("WARNING", logger="nlptrain"):
        trainer.fit()
    assert trainer.epoch == 2  # every epoch ran
    warned = [r.getMessage() for r in caplog.records if "nothing to watch" in r.getMessage()]
    assert len(warned) == 1 and "no eval_data" in warned[0]


def test_save_best_model_without_eval_data_says_it_saves_nothing(tmp_path, tiny_model_dir, caplog):
    trainer = make_trainer(tmp_path, tiny_model_dir, [SaveBestModel(tmp_path / "best")], epochs=2)
    trainer.eval_data = None
    with caplog.at_level("WARNING", logger="nlptrain"):
        trainer.fit()
    warned = [r.getMessage() for r in caplog.records if "nothing to compare" in r.getMessage()]
    assert len(warned) == 1 and "no eval_data, so no model is saved there" in warned[0]
    assert not (tmp_path / "best").exists()


class NormProbe(Callback):
    """Records the gradient norm after clipping (GradClip runs earlier: it is a built-in)."""

    def __init__(self) -> None:
        self.norms: list[float] = []

    def on_backward_end(self, trainer) -> None:
        grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
        self.norms.append(float(torch.linalg.vector_norm(torch.stack(
            [torch.linalg.vector_norm(g) for g in grads]))))


def test_gradient_clipping_bounds_the_norm(tmp_path, tiny_model_dir):
    probe = NormProbe()
    trainer = make_trainer(tmp_path, tiny_model_dir, [probe], epochs=1, max_grad_norm=1e-3)
    clip = next(c for c in trainer.callbacks.callbacks if isinstance(c, GradClip))
    trainer.fit()
    assert clip.last_norm > 1e-3  # there was something to clip...
    assert max(probe.norms) <= 1e-3 * 1.0001  # ...and every step's gradients were clipped


def test_no_clipping_when_max_grad_norm_is_zero(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, [], max_grad_norm=0)
    assert not any(isinstance(c, GradClip) for c in trainer.callbacks.callbacks)


def logged_rows(path) -> list[dict]:
    return [row for row in map(json.loads, path.read_text().splitlines()) if row["kind"] == "train"]


def test_each_logged_step_has_its_gradient_norm_before_clipping(tmp_path, tiny_model_dir):
    # A bound no step reaches: the gradients the probe sees are those GradClip measured.
    probe, log = NormProbe(), tmp_path / "metrics.jsonl"
    make_trainer(tmp_path, tiny_model_dir, [probe, MetricLogger(log, 1)], epochs=1,
                 max_grad_norm=1e9, log_every=1).fit()
    rows = logged_rows(log)
    assert len(rows) == len(probe.norms) > 1
    assert [row["grad_norm"] for row in rows] == pytest.approx(probe.norms, rel=1e-5)
    assert len(set(probe.norms)) > 1  # each row its own step's norm, not one value repeated


def test_each_logged_lr_is_the_one_its_step_used(tmp_path, tiny_model_dir):
    """Linear decay from 1e-3 without warm-up over 6 steps: step k (from 1) updates with
    1e-3 * (1 - (k - 1) / 6); the last step's is 1e-3 / 6, not the 0 the schedule moves to."""
    log = tmp_path / "metrics.jsonl"
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 1)], epochs=2, warmup_ratio=0.0,
                 scheduler="linear", log_every=1).fit()
    rows = logged_rows(log)
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5, 6]
    assert [row["lr"] for row in rows] == pytest.approx([1e-3 * (1 - k / 6) for k in range(6)])


def test_no_gradient_norm_is_logged_without_clipping(tmp_path, tiny_model_dir):
    log = tmp_path / "metrics.jsonl"
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 1)], epochs=1, max_grad_norm=0,
                 log_every=1).fit()
    rows = logged_rows(log)
    assert rows and not any("grad_norm" in row for row in rows)


def test_best_model_is_saved_when_the_metric_improves(tmp_path, tiny_model_dir):
    scores = iter([0.5, 0.7, 0.6])
    seen: list[bool] = []

    class Watch(Callback):
        def on_valid_end(self, trainer, metrics, is_best) -> None:
            seen.append(is_best)

    best = SaveBestModel(tmp_path / "best")
    trainer = make_trainer(tmp_path, tiny_model_dir, [best, Watch()], epochs=3)
    trainer.evaluate = lambda data: {"accuracy": next(scores), "macro_f1": 0.0}  # scripted scores
    trainer.fit()
    assert seen == [True, True, False]
    assert best.saved_metrics["accuracy"] == 0.7 and best.saved_metrics["step"] == 6
    assert (tmp_path / "best" / "model.safetensors").is_file()
    assert trainer.best_metric == 0.7


def test_progress_in_a_log_file_is_a_plain_line_every_n_seconds(tmp_path, tiny_model_dir, capsys):
    from nlptrain.callbacks import ProgressBar

    now = [0.0]

    class TenSecondsABatch(Callback):
        def on_batch_end(self, trainer):
            now[0] += 10.0

    bar = ProgressBar(log_every_s=30, clock=lambda: now[0])  # stderr is captured: not a terminal
    make_trainer(tmp_path, tiny_model_dir, [TenSecondsABatch(), bar], epochs=1,
                 batch_size=4).fit()  # 24 rows: 6 batches, 60 s
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith(("epoch", "eval"))]
    assert [line.split(",")[0] for line in lines[:2]] == ["epoch 1/1: batch 3/6 (50%)",
                                                          "epoch 1/1: batch 6/6 (100%)"]
    assert lines[2].startswith("eval at step 6: accuracy ")
    assert lines[3] == "epoch 1/1 done: 6 batches in 1 min 00 s, step 6"
    assert "0.10 batch/s, 30 s left in the epoch" in lines[0]


def test_progress_after_a_mid_epoch_resume_counts_and_times_the_batches_it_trained(
        tmp_path, tiny_model_dir, capsys):
    """Resumed after batch 4 of 6: 2 batches in 20 s (not 6), at 0.10 batch/s (not 0.30)."""
    from nlptrain.callbacks import Checkpointer, ProgressBar

    now = [0.0]

    class TenSecondsABatch(Callback):
        def on_batch_end(self, trainer):
            now[0] += 10.0
            # asked after step 3, agreed in step 4's flags: the run stops (and saves) after step 4
            trainer.should_stop = trainer.global_step == 3 and trainer.resumed_from is None

    folder = tmp_path / "ckpt"
    make_trainer(tmp_path, tiny_model_dir, [TenSecondsABatch(), Checkpointer(folder, every=2)],
                 epochs=1, batch_size=4, resume_from=folder).fit()
    capsys.readouterr()
    bar = ProgressBar(log_every_s=0, plain=True, clock=lambda: now[0])
    make_trainer(tmp_path, tiny_model_dir, [TenSecondsABatch(), bar], epochs=1, batch_size=4,
                 resume_from=folder).fit()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("epoch")]
    assert lines[0].startswith("epoch 1/1: batch 5/6 (83%), ") and "0.10 batch/s" in lines[0]
    assert lines[-1] == "epoch 1/1 done: 2 batches in 20 s (resumed after batch 4), step 6"


def test_progress_counts_to_max_steps_where_it_ends_the_run_inside_the_epoch(
        tmp_path, tiny_model_dir, capsys):
    from nlptrain.callbacks import ProgressBar

    bar = ProgressBar(log_every_s=0, plain=True)
    make_trainer(tmp_path, tiny_model_dir, [bar], epochs=2, batch_size=4, max_steps=4).fit()
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("epoch 1/2:")]
    assert [line.split(" (")[0] for line in lines] == [f"epoch 1/2: batch {n}/4" for n in range(1, 5)]
    assert "(100%)" in lines[-1] and "0 s left in the epoch" in lines[-1]
    end = [line for line in err.splitlines() if line.startswith("epoch 1/2 ")]
    assert end and end[0].startswith("epoch 1/2 stopped after batch 4 of 6: 4 batches in "), end


def test_a_step_budget_of_your_own_ends_the_run_and_its_schedule_there(tmp_path, tiny_model_dir):
    """It replaces the config's (as any callback of yours does the config's of its class), but
    the loop and the schedule read max_steps from the config: it said "the run ends at this
    step" at step 3 and trained all 12 (review 120)."""
    from nlptrain.callbacks import StepBudget

    trainer = make_trainer(tmp_path, tiny_model_dir, [StepBudget(3)], batch_size=8,
                           warmup_ratio=0.0)
    trainer.fit()
    assert trainer.global_step == 3  # the linear decay ended there, not at step 12:
    assert [group["lr"] for group in trainer.optimizer.param_groups] == [0.0, 0.0]


def test_progress_in_windows_of_micro_batches_counts_to_max_steps_and_shows_the_lr(
        tmp_path, tiny_model_dir, capsys):
    """grad_accum 2: the totals went 1/5, 2/4, 3/5 (a window's micro-batches counted twice), and
    the lr was 0 until the first step (a resume's too)."""
    from nlptrain.callbacks import ProgressBar

    bar = ProgressBar(log_every_s=0, plain=True)
    make_trainer(tmp_path, tiny_model_dir, [bar], epochs=2, batch_size=2, grad_accum=2,
                 max_steps=2, warmup_ratio=0.0, lr=1e-3).fit()
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("epoch 1/2:")]
    assert [line.split(" (")[0] for line in lines] == [f"epoch 1/2: batch {n}/4" for n in range(1, 5)]
    assert "lr 1.00e-03" in lines[0], lines


def test_progress_names_the_set_it_scores_and_marks_best_only_where_a_best_is_kept(
        tmp_path, tiny_model_dir, capsys):
    """A CLI run without a validation set evaluates on the test set: its lines say "test", and
    no "(best so far)", as nothing is selected on it."""
    from nlptrain.callbacks import ProgressBar

    for name, marks_best in (("test", False), ("validation", True)):
        bar = ProgressBar(eval_name=name, marks_best=marks_best, plain=True)
        (tmp_path / name).mkdir()
        make_trainer(tmp_path / name, tiny_model_dir, [bar], epochs=2, batch_size=8).fit()
        lines = [line for line in capsys.readouterr().err.splitlines() if " at step " in line]
        assert [line.split(":")[0] for line in lines] == [f"{name} at step 3", f"{name} at step 6"]
        assert ("(best so far)" in lines[0]) == marks_best  # the first evaluation is the best yet


def test_log_level_warning_leaves_out_the_progress_lines_too(toy_task, tmp_path, capsys):
    from nlptrain.cli import main

    assert main(["train", "--task", str(toy_task), "--output-dir", str(tmp_path / "run"),
                 "--epochs", "1", "--log-level", "warning"]) == 0
    err = capsys.readouterr().err
    assert "epoch 1/1" not in err and "at step" not in err, err


def test_a_callback_scales_the_lr_through_the_schedules_base_lrs(tmp_path, tiny_model_dir):
    """The README's way to lower the lr from a callback (a plateau rule): the schedule then goes
    on from the new base, rather than putting the old lr back at the next step."""
    seen: list[float] = []

    class Plateau(Callback):
        def on_valid_end(self, trainer, metrics, is_best) -> None:
            trainer.scheduler.base_lrs = [lr * 0.1 for lr in trainer.scheduler.base_lrs]

        def on_step_end(self, trainer) -> None:
            seen.append(trainer.optimizer.param_groups[0]["lr"])

    make_trainer(tmp_path, tiny_model_dir, [Plateau()], epochs=2, scheduler="constant").fit()
    assert seen[:3] == pytest.approx([1e-3] * 3) and seen[3:] == pytest.approx([1e-4] * 3)


def test_multiply_lr_lowers_the_next_steps_lr_and_a_resume_keeps_it(tmp_path, tiny_model_dir):
    """A plateau rule with `multiply_lr` in on_valid_end: the step right after the evaluation
    already trains at the lower lr, and a run resumed after it goes on at that lr (before, the
    README's recipe put one step back at the config's lr, 10x, after a resume)."""
    from nlptrain.callbacks import multiply_lr
    from toy_trainer import crash_then_resume

    lrs: dict[int, float] = {}

    class Plateau(Callback):
        def on_batch_start(self, trainer, batch) -> None:
            lrs[trainer.global_step + 1] = trainer.optimizer.param_groups[0]["lr"]

        def on_valid_end(self, trainer, metrics, is_best) -> None:
            if trainer.epoch == 0:
                multiply_lr(trainer, 0.1)

    (tmp_path / "whole").mkdir()
    whole = make_trainer(tmp_path / "whole", tiny_model_dir, [Plateau()], epochs=3,
                         scheduler="constant")
    whole.fit()
    uninterrupted = dict(lrs)
    assert uninterrupted == pytest.approx({**{s: 1e-3 for s in (1, 2, 3)},
                                           **{s: 1e-4 for s in range(4, 10)}})
    lrs.clear()
    resumed = crash_then_resume(tmp_path, tiny_model_dir, lambda: [Plateau()], crash_after=5,
                                every=4, epochs=3, scheduler="constant")
    assert {s: lrs[s] for s in range(5, 10)} == pytest.approx({s: 1e-4 for s in range(5, 10)})
    expected = whole.unwrapped_model.state_dict()
    for name, value in resumed.unwrapped_model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_a_python_trainer_shows_progress_unless_told_not_to(tmp_path, tiny_model_dir, capsys):
    from nlptrain.callbacks import ProgressBar

    def bars(trainer) -> int:
        return sum(isinstance(c, ProgressBar) for c in trainer.callbacks.callbacks)

    trainer = make_trainer(tmp_path, tiny_model_dir, [], epochs=1, batch_size=4)
    assert bars(trainer) == 1
    trainer.fit()
    err = capsys.readouterr().err  # not a terminal: plain lines
    assert "epoch 1/1 done: 6 batches in" in err and "eval at step 6: accuracy " in err

    train, test = toy_datasets(tmp_path, tiny_model_dir)
    quiet = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test,
                    config=TrainConfig(epochs=1, batch_size=4), progress=False)
    assert bars(quiet) == 0
    quiet.fit()
    assert "epoch 1/1" not in capsys.readouterr().err

    own = ProgressBar(log_every_s=5)
    assert bars(make_trainer(tmp_path, tiny_model_dir, [own], epochs=1)) == 1  # the user's, alone


@pytest.mark.parametrize("plain", [False, True])
def test_the_bar_reads_the_loss_back_only_at_log_steps(tmp_path, tiny_model_dir, monkeypatch, plain):
    """Reading the loss is a device sync: the bar, or the plain lines (one each batch here),
    show the loss read where the loop logs it anyway."""
    import io

    from nlptrain.callbacks import ProgressBar

    reads = []
    loss = Trainer.last_loss
    monkeypatch.setattr(Trainer, "last_loss", property(lambda t: reads.append(t.global_step)
                                                       or loss.fget(t)))
    out = io.StringIO()
    bar = ProgressBar(plain=plain, stream=out, log_every_s=0)  # plain=False: as on a terminal
    make_trainer(tmp_path, tiny_model_dir, [bar], epochs=1, batch_size=4, log_every=3).fit()
    assert reads == [3, 6]  # of 6 steps
    if plain:
        lines = [line for line in out.getvalue().splitlines() if ": batch " in line]
        assert [" loss " in line for line in lines] == [False, False, True, True, True, True]


def test_best_folder_is_the_best_the_resumed_checkpoint_names_after_a_crash(tmp_path,
                                                                            tiny_model_dir):
    """A best scored after the latest checkpoint, then a crash: the resume discards that
    training, so best/ must hold the best the checkpoint names (step 4), not step 6's weights
    while results say step 4's scores."""
    from nlptrain.callbacks import Checkpointer
    from safetensors.torch import load_file
    from toy_trainer import RaiseAfterStep

    at_step = {}

    def scripted(trainer, scores):
        def evaluate(data):
            step = trainer.global_step
            at_step[step] = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
            return {"accuracy": scores.get(step, 0.1), "macro_f1": 0.0}
        trainer.evaluate = evaluate
        return trainer

    best, checkpoints = tmp_path / "best", tmp_path / "checkpoints"
    settings = dict(epochs=3, batch_size=4, eval_every=2)  # 6 steps an epoch
    with pytest.raises(RuntimeError, match="crash after step 6"):
        scripted(make_trainer(tmp_path, tiny_model_dir, [SaveBestModel(best), Checkpointer(checkpoints, 4),
                                                          RaiseAfterStep(6)], **settings),
                 {2: 0.5, 4: 0.6, 6: 0.9}).fit()
    resumed = SaveBestModel(best)
    trainer = scripted(make_trainer(tmp_path, tiny_model_dir, [resumed, Checkpointer(checkpoints, 4)],
                                    resume_from=checkpoints, **settings), {})
    assert trainer.global_step == 4
    trainer.fit()  # no later evaluation beats step 4's 0.6
    assert resumed.saved_metrics["accuracy"] == 0.6 and resumed.saved_metrics["step"] == 4
    weights = load_file(best / "model.safetensors")
    assert all(torch.equal(weights[k], at_step[4][k]) for k in weights)
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("best")) == ["best"]
    mark = json.loads((best / "nlptrain_best.json").read_text())  # its step, its files' checksums
    assert mark["step"] == 4 and "model.safetensors" in mark["files"]


class StopAtStep(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, trainer: Trainer) -> None:
        trainer.should_stop = trainer.global_step == self.step


@pytest.mark.parametrize("stop", ["max_steps", "a callback"])
def test_the_checkpoint_of_a_run_stopped_on_a_checkpoint_step_holds_its_last_evaluation(
        tmp_path, tiny_model_dir, stop):
    """A stop at step 8, a checkpoint step, mid-epoch: the checkpoint was written before the
    stop's evaluation, so it named the best before; a resume of the finished run then put that
    older best back in best/ and model/, and deleted the better one. A callback's stop rides the
    next step's flags (asked at step 7, it ends the run after step 8), read with the checkpoint."""
    from nlptrain.callbacks import Checkpointer

    from nlptrain.checkpoint import list_checkpoints

    scores = {6: 0.5, 8: 0.9}
    trainer = make_trainer(tmp_path, tiny_model_dir, [SaveBestModel(tmp_path / "best"),
                                                      Checkpointer(tmp_path / "checkpoints", 4),
                                                      *([StopAtStep(7)] if stop != "max_steps" else [])],
                           epochs=3, batch_size=4, max_steps=8 if stop == "max_steps" else 0)
    # (6 steps an epoch)
    trainer.evaluate = lambda data: {"accuracy": scores[trainer.global_step], "macro_f1": 0.0}
    trainer.fit()
    last = list_checkpoints(tmp_path / "checkpoints")[-1]
    state = torch.load(last / "state.pt", weights_only=True)
    assert last.name.endswith("08") and state["callbacks"]["best_model_step"] == 8
    assert json.loads((tmp_path / "best" / "nlptrain_best.json").read_text())["step"] == 8
