"""The training logs (TensorBoard, metrics.jsonl) of a crashed and resumed run are those of the run
never stopped: nothing lost, nothing twice."""

from __future__ import annotations

import importlib.util

import pytest
from nlptrain.callbacks import TensorBoardLogger
from toy_trainer import crash_then_resume, make_trainer

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
