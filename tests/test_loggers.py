"""The training logs (TensorBoard, metrics.jsonl) of a crashed and resumed run are those of the run
never stopped: nothing lost, nothing twice."""

from __future__ import annotations

import importlib.util
import json

import pytest
from nlptrain.callbacks import Checkpointer, MetricLogger, TensorBoardLogger
from toy_trainer import crash_then_resume, make_trainer

from nlptrain.checkpoint import list_checkpoints, load_checkpoint
from nlptrain.events import Callback

HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None
STEPS = dict(epochs=1, batch_size=4, log_every=1)  # 24 rows: 6 steps, each logged


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)]
            for tag in events.Tags()["scalars"] if tag != "train/samples_per_s"}  # a timing


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_tensorboard_after_a_resume_keeps_the_checkpoints_step(tmp_path, tiny_model_dir):
    make_trainer(tmp_path, tiny_model_dir, [TensorBoardLogger(tmp_path / "whole")], **STEPS).fit()
    # Steps 1-5 logged, then a crash; the checkpoint of step 4 holds step 4's logging.
    crash_then_resume(tmp_path, tiny_model_dir, lambda: [TensorBoardLogger(tmp_path / "tb")],
                      crash_after=5, every=2, **STEPS)
    whole, resumed = scalars(tmp_path / "whole"), scalars(tmp_path / "tb")
    assert [step for step, _ in whole["train/loss"]] == [1, 2, 3, 4, 5, 6]
    assert resumed == whole
    # Throughput counts each window's own rows: the resumed run's first (step 5) is not 0.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    speeds = {e.step: e.value for e in events.Scalars("train/samples_per_s")}
    assert sorted(speeds)[-2:] == [5, 6] and all(v > 0 for v in speeds.values()), speeds


def rows(path) -> list[dict]:
    timings = ("time", "samples_per_s")
    return [{k: v for k, v in json.loads(line).items() if k not in timings}
            for line in path.read_text().splitlines()]


def test_metrics_jsonl_after_a_resume_has_each_row_once_and_the_same_means(tmp_path, tiny_model_dir):
    config = {**STEPS, "log_every": 2}  # rows at steps 2, 4, 6: each the mean of its 2 steps
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "whole.jsonl", 2)],
                 **config).fit()
    # Rows 2 and 4 written, a crash after step 5, the resume from step 3: row 4 again, once.
    crash_then_resume(tmp_path, tiny_model_dir, lambda: [MetricLogger(tmp_path / "run.jsonl", 2)],
                      crash_after=5, every=3, **config)
    whole = rows(tmp_path / "whole.jsonl")
    assert [(r["kind"], r["step"]) for r in whole] == [("train", 2), ("train", 4), ("train", 6),
                                                       ("eval", 6)]
    assert rows(tmp_path / "run.jsonl") == whole
    # The resumed window (step 4 alone) counts its own rows: it read 0 samples/s, as the
    # trainer's count of rows lags a step where fused AdamW skips a bad step on the device.
    speeds = [r["samples_per_s"] for r in map(json.loads, (tmp_path / "run.jsonl").open())
              if r["kind"] == "train"]
    assert len(speeds) == 3 and all(speed > 0 for speed in speeds), speeds


def train_rows(path) -> list[dict]:
    return [row for row in rows(path) if row["kind"] == "train"]


class StopAtStep(Callback):
    """Asks the run to stop at `step`, as Ctrl-C or an early stop would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_batch_end(self, trainer) -> None:
        if trainer.is_update_step and trainer.global_step == self.step:
            trainer.should_stop = True


def test_the_runs_end_is_logged_and_a_resume_drops_a_stopped_runs_closing_row(tmp_path,
                                                                              tiny_model_dir):
    config = {**STEPS, "log_every": 4}  # 6 steps: a row at step 4, and the end's at step 6
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "whole.jsonl", 4)],
                 **config).fit()
    whole = rows(tmp_path / "whole.jsonl")
    assert [(r["kind"], r["step"], r.get("closing")) for r in whole] == [
        ("train", 4, None), ("eval", 6, None), ("train", 6, True)]
    assert {r["epoch"] for r in whole} == {1}  # the end's row too: its steps' epoch, not the next

    folder = tmp_path / "checkpoints"
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "run.jsonl", 4), StopAtStep(2),
                                            Checkpointer(folder, 3)], **config).fit()
    # (a stop asked at step 2 ends the run after step 3, whose agreed flags carry it)
    assert [(r["step"], r.get("closing")) for r in train_rows(tmp_path / "run.jsonl")] == [(3, True)]
    resumed = make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "run.jsonl", 4),
                                                      Checkpointer(folder, 3)], **config)
    load_checkpoint(resumed, list_checkpoints(folder)[-1])
    resumed.fit()
    # Step 4's row is the mean of steps 1-4 again. (The stopped run's evaluation at its stop
    # stays: it was made and written.)
    assert train_rows(tmp_path / "run.jsonl") == train_rows(tmp_path / "whole.jsonl")


def test_a_run_restarted_before_its_first_checkpoint_drops_the_dead_attempts_rows(tmp_path,
                                                                                 tiny_model_dir):
    """A restart (or --resume) of an attempt that died before its first checkpoint trains from
    step 0 again: metrics.jsonl then holds each step once, as a run never stopped."""
    from toy_trainer import RaiseAfterStep

    config = {**STEPS, "log_every": 2}
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "whole.jsonl", 2)],
                 **config).fit()
    with pytest.raises(RuntimeError, match="crash after step 5"):
        make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "run.jsonl", 2),
                                                RaiseAfterStep(5)], **config).fit()
    assert [r["step"] for r in train_rows(tmp_path / "run.jsonl")] == [2, 4, 5]  # 5: its end
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(tmp_path / "run.jsonl", 2)],
                 resume_from=tmp_path / "checkpoints", **config).fit()  # none there: from step 0
    assert rows(tmp_path / "run.jsonl") == rows(tmp_path / "whole.jsonl")


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_tensorboard_of_a_run_restarted_before_its_first_checkpoint_has_each_step_once(
        tmp_path, tiny_model_dir):
    from toy_trainer import RaiseAfterStep

    make_trainer(tmp_path, tiny_model_dir, [TensorBoardLogger(tmp_path / "whole")], **STEPS).fit()
    with pytest.raises(RuntimeError, match="crash after step 5"):
        make_trainer(tmp_path, tiny_model_dir, [TensorBoardLogger(tmp_path / "tb"),
                                                RaiseAfterStep(5)], **STEPS).fit()
    make_trainer(tmp_path, tiny_model_dir, [TensorBoardLogger(tmp_path / "tb")],
                 resume_from=tmp_path / "checkpoints", **STEPS).fit()  # none there: from step 0
    assert scalars(tmp_path / "tb") == scalars(tmp_path / "whole")


def test_a_new_trainer_logging_to_an_earlier_runs_file_keeps_its_rows(tmp_path, tiny_model_dir):
    """Two stages (say frozen, then unfrozen), each its own Trainer, one metrics.jsonl: only a
    resume drops rows, never a new run's start."""
    log = tmp_path / "metrics.jsonl"
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 2)], **{**STEPS, "log_every": 2}).fit()
    first = rows(log)
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 2)], **{**STEPS, "log_every": 2}).fit()
    assert len(first) == 4 and rows(log) == first + first


def test_a_row_after_an_epoch_end_means_every_step_since_the_row_before(tmp_path, tiny_model_dir):
    """6 steps an epoch, a row every 4: the row of step 8 is the mean of steps 5-8, not of 7-8
    (steps 5 and 6, the first epoch's tail, were in no row)."""
    each, every4 = tmp_path / "each.jsonl", tmp_path / "every4.jsonl"
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(each, 1)], **{**STEPS, "epochs": 2}).fit()
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(every4, 4)],
                 **{**STEPS, "epochs": 2, "log_every": 4}).fit()
    losses = {r["step"]: r["loss"] for r in train_rows(each)}
    by_step = {r["step"]: r["loss"] for r in train_rows(every4)}
    assert sorted(losses) == list(range(1, 13)) and sorted(by_step) == [4, 8, 12]
    assert by_step[8] == pytest.approx(sum(losses[s] for s in (5, 6, 7, 8)) / 4, rel=1e-5)


def test_a_diverged_loss_is_written_as_json_null(tmp_path):
    """A bare NaN is no JSON: a strict reader (JavaScript's JSON.parse, jq --strict) refuses the
    file of exactly the runs people look into."""
    from types import SimpleNamespace

    logger = MetricLogger(tmp_path / "metrics.jsonl", 1)
    logger._write({"kind": "train", "step": 2, "loss": float("nan"), "lr": float("inf")})
    logger.on_train_end(SimpleNamespace())
    line = (tmp_path / "metrics.jsonl").read_text()
    assert json.loads(line, parse_constant=lambda name: pytest.fail(f"{name} in {line}")) == {
        "kind": "train", "step": 2, "loss": None, "lr": None}


def test_the_lr_logged_under_layer_wise_decay_is_the_runs_not_the_embeddings(tmp_path,
                                                                             tiny_model_dir):
    """The first parameter group is the embeddings', at lr x 0.5^3 with 2 layers: the curve sat
    8x below the lr the user set."""
    log = tmp_path / "metrics.jsonl"
    trainer = make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 2)], **STEPS, lr=1e-3,
                           layer_lr_decay=0.5, scheduler="constant", warmup_ratio=0.0)
    trainer.fit()
    assert trainer.optimizer.param_groups[0]["lr"] == pytest.approx(1.25e-4)
    assert [r["lr"] for r in train_rows(log)] == [pytest.approx(1e-3)] * 3


def test_a_finished_run_resumed_ends_its_file_as_it_was(tmp_path, tiny_model_dir):
    """No step runs: the closing row, dropped at the load, was written again from an empty
    window (lr 0, epoch 1, no grad_norm), and the plots drew the lr falling to 0 at the end."""
    folder, log = tmp_path / "checkpoints", tmp_path / "run.jsonl"
    config = {**STEPS, "log_every": 4}  # 6 steps: a row at 4, the closing one at 6
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 4), Checkpointer(folder, 3)],
                 **config).fit()
    finished = log.read_text()
    assert json.loads(finished.splitlines()[-1])["closing"]
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 4), Checkpointer(folder, 3)],
                 resume_from=folder, **config).fit()
    assert log.read_text() == finished
    # A damaged byte spoils its line alone (the resume was a UnicodeDecodeError traceback).
    log.write_bytes(b'{"kind": "train", "step": 1, "loss": \xff}\n' + finished.encode())
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 4), Checkpointer(folder, 3)],
                 resume_from=folder, **config).fit()
    assert log.read_text() == finished


def test_a_resume_that_runs_no_step_makes_no_row_of_the_checkpoints_window(tmp_path,
                                                                           tiny_model_dir):
    """Resumed with fewer epochs than reached (nothing is trained): a closing row was made from
    the checkpoint's window with this run's lr and epoch, which it never had (lr 0, epoch 1)."""
    from toy_trainer import RaiseAfterStep

    folder, log = tmp_path / "checkpoints", tmp_path / "run.jsonl"
    config = {**STEPS, "epochs": 2, "log_every": 4}  # 6 steps an epoch
    with pytest.raises(RuntimeError, match="crash after step 10"):
        make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 4), Checkpointer(folder, 3),
                                                RaiseAfterStep(10)], **config).fit()
    make_trainer(tmp_path, tiny_model_dir, [MetricLogger(log, 4), Checkpointer(folder, 3)],
                 resume_from=folder, **{**config, "epochs": 1}).fit()
    assert [(r["kind"], r["step"]) for r in rows(log)] == [("train", 4), ("eval", 6), ("train", 8)]


def test_the_rate_of_training_leaves_out_the_evaluations_inside_its_window(tmp_path,
                                                                           tiny_model_dir):
    """An evaluation at step 2 inside the window of steps 1-3: it read 21 samples/s for a
    training that ran at 250. And the progress line shows the lr metrics.jsonl gives the step
    (it showed the next step's: the schedule had moved on)."""
    import io
    import time

    from nlptrain.callbacks import ProgressBar

    shown = io.StringIO()
    trainer = make_trainer(tmp_path, tiny_model_dir, [
        MetricLogger(tmp_path / "run.jsonl", 3),
        ProgressBar(plain=True, stream=shown, log_every_s=0, refresh_every=3)],
        **{**STEPS, "eval_every": 2, "log_every": 3})
    evaluate = trainer.evaluate

    def slow_evaluation(data):
        time.sleep(2.0)
        return evaluate(data)

    trainer.evaluate = slow_evaluation
    began = time.perf_counter()
    trainer.fit()
    spent = time.perf_counter() - began
    first = [r for r in map(json.loads, (tmp_path / "run.jsonl").open()) if r["kind"] == "train"][0]
    assert first["step"] == 3
    assert 12 / first["samples_per_s"] < spent - 3 * 2.0, (first, spent)  # 3 evaluations of 2 s
    line = [s for s in shown.getvalue().splitlines() if "batch 3/6" in s][0]
    assert f"lr {first['lr']:.2e}" in line, (line, first)


def test_a_terminal_of_no_width_gets_plain_progress_lines():
    """A pty with 0 columns (some CI and container shells): tqdm drew nothing at all."""
    import os
    import pty

    from nlptrain.callbacks import ProgressBar

    parent, child = pty.openpty()  # a new pty: 0 rows and 0 columns until told
    try:
        with os.fdopen(child, "w") as terminal:
            assert terminal.isatty() and os.get_terminal_size(child).columns == 0
            assert ProgressBar(stream=terminal)._is_plain()
    finally:
        os.close(parent)


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_tensorboards_loss_is_metrics_jsonls_window_mean_across_a_resume(tmp_path, tiny_model_dir):
    """TensorBoard's train/loss was the logged step's loss alone, beside metrics.jsonl's (and the
    plot's) mean since the previous point, under the same name."""
    config = {**STEPS, "log_every": 2}  # points at steps 2, 4, 6: each the mean of its 2 steps

    def loggers():
        return [MetricLogger(tmp_path / "run.jsonl", 2), TensorBoardLogger(tmp_path / "tb")]

    # A crash after step 5 and a resume from step 3's checkpoint: the window of step 4 spans it.
    crash_then_resume(tmp_path, tiny_model_dir, loggers, crash_after=5, every=3, **config)
    means = [(r["step"], r["loss"]) for r in train_rows(tmp_path / "run.jsonl")]
    assert [step for step, _ in means] == [2, 4, 6]
    logged = scalars(tmp_path / "tb")["train/loss"]
    assert [step for step, _ in logged] == [2, 4, 6]
    assert [value for _, value in logged] == pytest.approx([loss for _, loss in means], rel=1e-6)


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="tensorboard is not installed")
def test_a_resume_goes_on_logging_to_tensorboard_as_the_run_did(toy_task, tmp_path):
    """--tensorboard is not part of the task: a plain --resume (which needs no options retyped)
    stopped logging there, unsaid; --no-tensorboard still stops it."""
    from nlptrain.cli import main

    run = tmp_path / "run"
    args = ["train", "--task", str(toy_task), "--output-dir", str(run), "--set", "train.log_every=1"]
    assert main([*args, "--tensorboard", "--max-steps", "2"]) == 0
    assert main([*args, "--resume", "--max-steps", "4"]) == 0
    assert [step for step, _ in scalars(run / "tensorboard")["train/loss"]] == [1, 2, 3, 4]
    assert main([*args, "--resume", "--max-steps", "6", "--no-tensorboard"]) == 0
    assert [step for step, _ in scalars(run / "tensorboard")["train/loss"]] == [1, 2, 3, 4]
    assert main([*args, "--resume", "--max-steps", "8"]) == 0  # stopped until asked again
    assert [step for step, _ in scalars(run / "tensorboard")["train/loss"]] == [1, 2, 3, 4]


def test_a_finished_run_resumed_from_python_returns_its_scores(tmp_path, tiny_model_dir):
    """fit() of a run resumed where it had ended (its export crashed, say) returned the shape of
    a run without evaluation data, {'epoch', 'step', 'train_loss': nan}."""
    folder = tmp_path / "checkpoints"
    ended = make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, 3)], **STEPS).fit()
    again = make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, 3)], resume_from=folder,
                         **STEPS).fit()
    assert again == ended and "accuracy" in again


def test_a_step_sum_adds_as_each_step_added_at_once_so_a_resumed_window_ends_on_the_same_bits():
    import torch
    from nlptrain.callbacks.step_sums import StepSum

    values = torch.rand(600, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    at_once = 0.0  # the sum as a logger adding each step's value at once makes it
    for value in values.tolist():
        at_once += value
    whole = StepSum()
    for value in values:
        whole.add(value.clone())
        assert len(whole._parts) < StepSum.FOLD  # joined: 600 steps keep few tensors
    assert float(whole) == at_once
    for cut in (1, 4, 255, 300):  # a checkpoint's sum after `cut` steps, the rest after resume
        resumed = StepSum(_summed(values[:cut]))
        for value in values[cut:]:
            resumed.add(value.clone())
        assert float(resumed) == at_once, cut
    assert float(StepSum()) == 0.0 and float(StepSum(2.5)) == 2.5


def _summed(values):
    from nlptrain.callbacks.step_sums import StepSum

    summed = StepSum()
    for value in values:
        summed.add(value.clone())
    return float(summed)
