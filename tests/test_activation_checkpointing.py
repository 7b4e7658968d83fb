"""`activation_checkpointing`: each encoder layer runs again in the backward instead of keeping its
activations, and the training is the same: the same dropout masks (the checkpoint restores the
RNG), the same gradients, the same weights; in one process and under DDP and FSDP2 on 2 ranks."""

from __future__ import annotations

import pytest
import torch
from ddp import run_ranks
from strategy_workers import make_trainer as dist_trainer
from strategy_workers import toy_set
from toy_trainer import make_trainer

from nlptrain import Callback, TrainConfig, Trainer, distributed
from nlptrain.errors import ConfigError


class CountLayerRuns(Callback):
    """How many times the first encoder layer's feed-forward runs (forwards and recomputations)."""

    def __init__(self) -> None:
        self.runs = 0

    def on_train_start(self, trainer) -> None:
        dense = trainer.unwrapped_model.bert.encoder.layer[0].intermediate.dense
        dense.register_forward_hook(lambda *_: setattr(self, "runs", self.runs + 1))


def trained(tmp_path, tiny_model_dir, **config) -> tuple[dict[str, torch.Tensor], int]:
    runs = CountLayerRuns()
    trainer = make_trainer(tmp_path, tiny_model_dir, [runs], batch_size=4, epochs=1,
                           precision="fp32", **config)  # dropout on: the masks must match
    trainer.fit()
    weights = {k: v.detach().clone() for k, v in trainer.unwrapped_model.state_dict().items()}
    trainer.close()
    return weights, runs.runs


def test_each_layer_runs_again_in_the_backward_and_the_weights_are_the_same(tmp_path,
                                                                            tiny_model_dir):
    plain, plain_runs = trained(tmp_path, tiny_model_dir)
    recomputed, recomputed_runs = trained(tmp_path, tiny_model_dir, activation_checkpointing=True)
    # 6 steps: the layer ran once a step without, twice with (the forward, then the backward's);
    # the evaluation runs it once a batch in both (no backward, nothing to recompute).
    assert recomputed_runs - plain_runs == 6
    assert plain.keys() == recomputed.keys()
    for name in plain:
        assert torch.equal(plain[name], recomputed[name]), name


def test_a_model_without_the_switch_is_refused_by_name(tmp_path):
    class OwnModel(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.linear = torch.nn.Linear(4, 2)

        def forward(self, input_ids, attention_mask):
            return self.linear(input_ids.float())

    with pytest.raises(ConfigError, match="activation_checkpointing: OwnModel has no transformers "
                                          "switch for it"):
        Trainer(OwnModel(), config=TrainConfig(activation_checkpointing=True),
                label_names=["a", "b"])


def _strategies_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    from pathlib import Path

    dist = distributed.from_env(60)
    train = toy_set(Path(folder) / str(rank), model_dir, "train", 48, seed=1)
    found, runs_of = {}, {}
    try:
        for strategy in ("ddp", "fsdp"):
            for checkpointed in (False, True):
                runs = CountLayerRuns()
                trainer = dist_trainer(dist, model_dir, train, None, strategy, [runs],
                                       activation_checkpointing=checkpointed, precision="fp32")
                trainer.fit()
                found[strategy, checkpointed] = trainer.strategy.full_state_dict(trainer.model)
                runs_of[strategy, checkpointed] = runs.runs
                trainer.close()
    finally:
        dist.close()
    if rank != 0:
        return {}
    return {strategy: (runs_of[strategy, False], runs_of[strategy, True],
                       max((found[strategy, True][k] - found[strategy, False][k]).abs().max().item()
                           for k in found[strategy, False]))
            for strategy in ("ddp", "fsdp")}


@pytest.mark.distributed
def test_ddp_and_fsdp2_train_alike_with_activation_checkpointing(tmp_path, tiny_model_dir):
    gaps = run_ranks(_strategies_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))[0]
    # 48 rows, 4 a rank a step: 6 steps; recomputed once each, and the same weights.
    assert gaps == {"ddp": (6, 12, 0.0), "fsdp": (6, 12, 0.0)}
