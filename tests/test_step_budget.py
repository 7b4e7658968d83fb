"""`[train] max_steps`: the run ends after exactly that many optimizer steps, inside an epoch too,
evaluated there, with its lr schedule ending there; resumed, it goes on to the same weights, and
a larger budget trains on."""

from __future__ import annotations

import pytest
import torch
from log_capture import nlptrain_messages
from nlptrain.callbacks import Checkpointer
from toy_trainer import crash_then_resume, make_trainer, toy_datasets

from nlptrain import Callback, TrainConfig, Trainer
from nlptrain.models import load_model


class Steps(Callback):
    """The lr each optimizer step uses, and the weights after step 5."""

    def __init__(self) -> None:
        self.lr: list[float] = []
        self.at_5: dict[str, torch.Tensor] = {}
        self.begun = 0  # micro-batches begun

    def on_batch_start(self, trainer, batch) -> None:
        self.begun += 1
        if trainer.batch_in_epoch % trainer.config.grad_accum == 0:
            self.lr.append(trainer.optimizer.param_groups[0]["lr"])

    def on_step_end(self, trainer) -> None:
        if trainer.global_step == 5:
            self.at_5 = weights(trainer)


def weights(trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}


@pytest.mark.parametrize("grad_accum, fused", [(1, True), (2, True), (1, False)])
def test_the_run_ends_after_max_steps_inside_an_epoch(tmp_path, tiny_model_dir, grad_accum, fused):
    """24 rows in batches of 4: 6 micro-batches an epoch, 3 epochs; at most 5 steps. Every rank
    knows the step count, so no micro-batch is begun past the budget (with fused AdamW, which
    reads the agreed flags a step late, a stop asked by a callback begins one more step and
    undoes it: its events would fire for rows never trained)."""
    train, test = toy_datasets(tmp_path, tiny_model_dir)
    torch.manual_seed(0)
    steps = Steps()
    sgd = None if fused else (lambda groups, config: torch.optim.SGD(groups, lr=config.lr))
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, test, callbacks=[steps],
                      optimizer=sgd, config=TrainConfig(batch_size=4, epochs=3, max_steps=5, lr=1e-3,
                                                        grad_accum=grad_accum, warmup_ratio=0.0))
    trainer.fit()
    assert trainer.global_step == 5 and trainer.metrics["step"] == 5  # evaluated where it ended
    final = weights(trainer)
    for name, weight in steps.at_5.items():  # nothing trained past the budget
        assert torch.equal(weight, final[name]), name
    # The linear decay ends at the budget: the 5 steps' lrs fall to 1/5 of the peak, then 0.
    assert steps.lr == pytest.approx([1e-3 * (5 - i) / 5 for i in range(5)])
    assert steps.begun == 5 * grad_accum
    assert trainer.optimizer.param_groups[0]["lr"] == 0.0


def test_a_resumed_budget_ends_as_the_uninterrupted_run_and_a_larger_one_trains_on(tmp_path,
                                                                                  tiny_model_dir):
    (tmp_path / "whole").mkdir()
    whole = make_trainer(tmp_path / "whole", tiny_model_dir, [], batch_size=4, epochs=3,
                         max_steps=8)
    whole.fit()
    resumed = crash_then_resume(tmp_path, tiny_model_dir, list, crash_after=5, every=2,
                                batch_size=4, epochs=3, max_steps=8)
    assert resumed.global_step == 8
    expected, found = weights(whole), weights(resumed)
    for name in expected:
        assert torch.equal(expected[name], found[name]), name

    folder = tmp_path / "checkpoints"
    with nlptrain_messages() as messages:
        done = make_trainer(tmp_path, tiny_model_dir, [Checkpointer(folder, every=2)], batch_size=4,
                            epochs=3, max_steps=8, resume_from=folder)
        done.fit()
    assert done.global_step == 8
    assert "max_steps 8: the run has done 8 steps; nothing left to train" in messages
    more = make_trainer(tmp_path, tiny_model_dir, [], batch_size=4, epochs=3, max_steps=11,
                        resume_from=folder)
    more.fit()
    assert more.global_step == 11


def _two_rank_budget(rank: int, world: int, folder: str, model_dir: str) -> tuple[int, float]:
    from pathlib import Path

    from strategy_workers import make_trainer as dist_trainer
    from strategy_workers import toy_set

    from nlptrain import distributed

    dist = distributed.from_env(60)
    try:
        train = toy_set(Path(folder) / str(rank), model_dir, "train", 64, seed=1)  # 8 steps an epoch
        trainer = dist_trainer(dist, model_dir, train, None, "ddp", [], epochs=2, max_steps=5)
        trainer.fit()
        total = sum(p.double().sum().item() for p in trainer.unwrapped_model.parameters())
        trainer.close()
        return trainer.global_step, total
    finally:
        dist.close()


@pytest.mark.distributed
def test_every_rank_ends_at_max_steps(tmp_path, tiny_model_dir):
    from ddp import run_ranks

    (step0, weights0), (step1, weights1) = run_ranks(_two_rank_budget, 2, tmp_path, str(tmp_path),
                                                     str(tiny_model_dir))
    assert step0 == step1 == 5 and weights0 == weights1


def test_a_budget_the_epochs_end_first_is_said(tmp_path, tiny_model_dir, caplog):
    """transformers' max_steps lengthens a run past its epochs, ours only ends one: 1 epoch of 6
    steps with max_steps 20 trained 6 without a word."""
    trainer = make_trainer(tmp_path, tiny_model_dir, [], epochs=1, batch_size=4, max_steps=20)
    with caplog.at_level("WARNING", logger="nlptrain"):
        trainer.fit()
    assert trainer.global_step == 6
    assert "max_steps 20: the run's 1 epoch(s) ended it first, at step 6 (max_steps stops a run, " \
        "it does not lengthen one: raise epochs for more steps)" in caplog.text


def test_a_run_a_callback_stops_in_its_last_epoch_is_not_said_to_be_ended_by_its_epochs(
        tmp_path, tiny_model_dir, caplog):
    """An early stop in the last epoch got 'the run's 1 epoch(s) ended it first ... raise epochs
    for more steps', advice that changes nothing."""

    class StopAtThree(Callback):
        def on_step_end(self, trainer):
            trainer.should_stop = trainer.global_step == 3

    trainer = make_trainer(tmp_path, tiny_model_dir, [StopAtThree()], epochs=1, batch_size=4,
                           max_steps=20)
    with caplog.at_level("WARNING", logger="nlptrain"):
        trainer.fit()
    assert trainer.global_step < 6 and "ended it first" not in caplog.text
