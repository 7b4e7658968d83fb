"""Fine-tuning techniques on 2 real ranks (gloo on loopback): freezing, EMA, class weights, label
smoothing, layer lr decay, R-Drop, exact resume in the middle of a freeze schedule; FGM and
R-Drop with one all-reduce per optimizer step under gradient accumulation."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from ddp import run_ranks
from finetune_setup import RecordSteps, StopAt, hand_ema, snapshot, tiny_model, toy_sets
from nlptrain.callbacks import EMA, FGM, Checkpointer, Freeze, RDrop
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from nlptrain import Callback, DistTrainer, TrainConfig, distributed
from nlptrain.checkpoint import checkpoint_name, load_checkpoint

pytestmark = pytest.mark.distributed


def freeze_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    dist = distributed.from_env()
    train, test = toy_sets(Path(folder) / f"rank{rank}", Path(model_dir), rows=24)
    # 12 rows a rank, 4 a batch: 3 steps an epoch, 6 in all.
    config = TrainConfig(epochs=2, batch_size=4, lr=1e-3, seed=3, timeout=60,
                         class_weights="balanced", label_smoothing=0.1, layer_lr_decay=0.8)

    def run(callbacks: list[Callback], resume: Path | None = None) -> dict[str, torch.Tensor]:
        trainer = DistTrainer(tiny_model(Path(model_dir)), train, test, config=config,
                              callbacks=callbacks, dist=dist)
        if resume is not None:
            load_checkpoint(trainer, resume)
        trainer.fit()
        trainer.close()
        return snapshot(trainer.unwrapped_model)

    def freeze() -> Freeze:  # one block more every 2 steps, from the top: the embeddings all along
        return Freeze(2, "steps", gradual=True)

    record, ema = RecordSteps(), EMA(0.9, export=False)
    whole = run([freeze(), RDrop(0.5), record, ema])  # R-Drop: dropout to resume exactly
    checkpoints = Path(folder) / "checkpoints"
    run([freeze(), RDrop(0.5), EMA(0.9, export=False), Checkpointer(checkpoints, every=2), StopAt(4)])
    resumed_ema = EMA(0.9, export=False)
    resumed = run([freeze(), RDrop(0.5), resumed_ema], resume=checkpoints / checkpoint_name(4))
    dist.close()
    return {"weights": record.weights, "whole": whole, "ema": ema.average, "resumed": resumed,
            "resumed_ema": resumed_ema.average}


def test_freeze_ema_and_resume_on_two_ranks(tmp_path, tiny_model_dir):
    results = run_ranks(freeze_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    first, second = results
    for key in ("whole", "ema", "resumed"):
        assert all(torch.equal(v, second[key][k]) for k, v in first[key].items()), key
    weights = first["weights"]
    assert len(weights) == 7  # the start and 6 steps
    start = weights[0]
    embeddings = [k for k in start if ".embeddings." in k]
    layer0 = [k for k in start if ".layer.0." in k]
    layer1 = [k for k in start if ".layer.1." in k]
    # Frozen: bit-identical; unfrozen from the top every 2 steps.
    assert all(torch.equal(start[k], w[k]) for w in weights for k in embeddings)
    assert all(torch.equal(start[k], weights[4][k]) for k in layer0)
    assert all(torch.equal(start[k], weights[2][k]) for k in layer1)
    assert any(not torch.equal(start[k], weights[3][k]) for k in layer1)
    assert any(not torch.equal(start[k], weights[5][k]) for k in layer0)
    assert not torch.equal(start["classifier.weight"], weights[2]["classifier.weight"])  # 1: warmup
    # The EMA: the same on both ranks (above), and the definition's.
    for name, value in hand_ema(weights, 0.9).items():
        torch.testing.assert_close(first["ema"][name], value, rtol=1e-6, atol=1e-7)
    # Stopped at step 4 mid-schedule and resumed: the same run, EMA included.
    for name, value in first["whole"].items():
        assert torch.equal(value, first["resumed"][name]), name
    for name, value in first["ema"].items():
        assert torch.equal(value, first["resumed_ema"][name]), name


class CountAllReduces(Callback):
    """Counts DDP's gradient all-reduces (one per bucket) through a comm hook."""

    def __init__(self) -> None:
        self.calls = 0

    def on_train_start(self, trainer) -> None:
        def counting(state, bucket):
            self.calls += 1
            return default_hooks.allreduce_hook(state, bucket)

        trainer.model.register_comm_hook(None, counting)


def adversarial_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    dist = distributed.from_env()
    train, test = toy_sets(Path(folder) / f"rank{rank}", Path(model_dir), rows=24)
    # 3 micro-batches a rank, 2 per step: 2 optimizer steps (the last one of a single batch).
    config = TrainConfig(epochs=1, batch_size=4, grad_accum=2, lr=1e-3, timeout=60)
    found = {}
    for name, callbacks in [("plain", []), ("fgm", [FGM(0.5)]), ("rdrop", [RDrop(1.0)]),
                            ("both", [FGM(0.5), RDrop(1.0)])]:
        counter = CountAllReduces()
        trainer = DistTrainer(tiny_model(Path(model_dir)), train, test, config=config,
                              callbacks=[*callbacks, counter], dist=dist)
        trainer.fit()
        trainer.close()
        found[name] = {"calls": counter.calls, "steps": trainer.global_step,
                       "weights": snapshot(trainer.unwrapped_model)}
    dist.close()
    return found


def test_fgm_and_rdrop_all_reduce_once_a_step_on_two_ranks(tmp_path, tiny_model_dir):
    first, second = run_ranks(adversarial_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    plain = first["plain"]
    assert plain["steps"] == 2 and plain["calls"] % 2 == 0
    for name in ("fgm", "rdrop", "both"):
        run = first[name]
        assert (run["steps"], run["calls"]) == (plain["steps"], plain["calls"]), name
        assert all(torch.equal(v, second[name]["weights"][k]) for k, v in run["weights"].items())
        assert any(not torch.equal(v, plain["weights"][k]) for k, v in run["weights"].items())


def hooked_freeze_worker(rank: int, world: int, folder: str, model_dir: str) -> dict:
    dist = distributed.from_env()
    train, test = toy_sets(Path(folder) / f"rank{rank}", Path(model_dir), rows=24)
    config = TrainConfig(epochs=2, batch_size=4, lr=1e-3, timeout=60)  # 3 steps an epoch
    found = {}
    for order in ("freeze first", "hook first"):
        counter = CountAllReduces()
        callbacks = [Freeze(2, "steps"), counter] if order == "freeze first" else \
            [counter, Freeze(2, "steps")]
        trainer = DistTrainer(tiny_model(Path(model_dir)), train, test, config=config,
                              callbacks=callbacks, dist=dist)
        trainer.fit()
        trainer.close()
        found[order] = counter.calls
    dist.close()
    return found


def test_a_comm_hook_a_callback_registered_outlives_freezes_rewrapping(tmp_path, tiny_model_dir):
    """Each unfreeze wraps the model in a new DDP wrapper: the user's hook was lost, and
    nlptrain's own put in its place (with Freeze listed last, from the first step)."""
    first, second = run_ranks(hooked_freeze_worker, 2, tmp_path, str(tmp_path), str(tiny_model_dir))
    assert first == second
    # Frozen for 2 steps (the head's gradients alone), then all: every step went through it.
    assert first["freeze first"] == first["hook first"] >= 6, first
