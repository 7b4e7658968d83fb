"""The loop's counters are one object: a checkpoint carries every field, the trainer reads them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from toy_trainer import make_trainer

from nlptrain.checkpoint import read_state, save_checkpoint
from nlptrain.progress import Progress
from nlptrain.step_agreement import StepWindow


def test_state_dict_carries_every_field_and_loads_back():
    names = [f.name for f in dataclasses.fields(Progress)]
    progress = Progress(**{name: i + 1 for i, name in enumerate(names)})
    state = progress.state_dict()
    assert list(state) == names  # a new field is in every checkpoint without more code
    restored = Progress()
    restored.load_state_dict(state)
    assert restored == progress
    older = Progress()
    older.load_state_dict({k: v for k, v in state.items() if k != "steps_per_epoch"})
    assert older.steps_per_epoch == 0 and older.global_step == progress.global_step


def test_the_trainer_reads_its_counters_from_progress(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, [], epochs=1)
    trainer.fit()
    assert trainer.global_step == trainer.progress.global_step == 3
    save_checkpoint(trainer, tmp_path / "checkpoint")  # the counters, saved whole
    assert read_state(tmp_path / "checkpoint" / "state.pt")["progress"] == trainer.progress.state_dict()
    with pytest.raises(AttributeError):
        trainer.global_step = 0  # one owner: the loop, through trainer.progress


@pytest.mark.parametrize("trained", [[[8, 8], [8, 8], [5, 4]], [[8, 6], [1, 8], [0, 4]]])
def test_a_steps_weights_are_its_planned_rows_and_add_up_to_one(trained):
    """Each rank's micro-batches weigh by their planned rows over the step's, all ranks: the
    weights add up to 1 also where a collate or callback of the user's changed a batch's rows
    (the second case), so the step's gradient keeps its scale."""
    plan = np.array([[8, 8], [8, 8], [5, 4]])  # [batch, rank]: 3 micro-batches, 2 ranks
    weights = np.zeros_like(plan, dtype=float)
    for rank in (0, 1):
        window = StepWindow()
        window.plan_rows(plan, first_batch=0, rank=rank)
        window.open(0, 3)
        for batch in range(3):
            weights[batch, rank] = 1 / (window.loss_divisor(world_size=2) * 2)  # DDP averages
            window.add(torch.tensor(0.5), trained[batch][rank])
    assert weights.sum() == pytest.approx(1.0)
    np.testing.assert_allclose(weights, plan / plan.sum())


def test_without_a_plan_a_steps_micro_batches_weigh_alike():
    window = StepWindow()
    window.plan_rows(None, first_batch=0, rank=0)
    window.open(0, 3)
    assert window.loss_divisor(world_size=2) == 3.0
