"""`compile = true`: the model runs under torch.compile, compiled in place, and trains as eager
does, with the same weight names (checkpoints and exports stay loadable without it)."""

from __future__ import annotations

import pytest
import torch
from ddp import run_ranks
from strategy_workers import compile_worker
from toy_trainer import model_without_dropout, toy_datasets

from nlptrain import TrainConfig, Trainer


def test_compile_trains_like_eager_and_keeps_the_weight_names(tmp_path, tiny_model_dir):
    train, test = toy_datasets(tmp_path, tiny_model_dir)
    runs = {}
    for compiled in (False, True):
        model = model_without_dropout(tiny_model_dir)
        config = TrainConfig(epochs=1, batch_size=8, lr=1e-3, precision="fp32", compile=compiled)
        trainer = Trainer(model, train, test, config=config)
        try:
            metrics = trainer.fit()
        finally:
            trainer.close()
        assert (trainer.unwrapped_model._compiled_call_impl is not None) == compiled
        runs[compiled] = metrics, trainer.unwrapped_model.state_dict()
    (eager, eager_weights), (compiled, compiled_weights) = runs[False], runs[True]
    assert list(compiled_weights) == list(eager_weights)
    assert abs(compiled["loss"] - eager["loss"]) <= 1e-5 * abs(eager["loss"])
    assert compiled["accuracy"] == eager["accuracy"]
    for name, weight in eager_weights.items():
        torch.testing.assert_close(compiled_weights[name], weight, rtol=1e-4, atol=1e-5)


@pytest.mark.distributed
def test_compiled_fsdp2_on_two_ranks_trains_like_eager(tmp_path, tiny_model_dir):
    """FSDP2 hooks every encoder layer; the model compiled in place around them trains alike."""
    runs = [run_ranks(compile_worker, 2, tmp_path, str(tmp_path / str(compiled)),
                      str(tiny_model_dir), "fsdp", compiled, timeout=400)
            for compiled in (False, True)]
    (eager, eager_flag), (compiled, compiled_flag) = (list(zip(*run, strict=True)) for run in runs)
    assert eager_flag == (False, False) and compiled_flag == (True, True)
    assert eager[0] == eager[1] and compiled[0] == compiled[1]  # one loss, gathered
    assert abs(compiled[0] - eager[0]) <= 1e-5 * abs(eager[0])
