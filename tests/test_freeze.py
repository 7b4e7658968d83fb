"""Freezing on one process: Freeze's schedules (at once, gradual), what a user froze or unfroze
around them, and an optimizer state saved without the frozen parameters."""

from __future__ import annotations

import pytest
import torch
from finetune_setup import RecordSteps, tiny_model, toy_sets
from nlptrain.callbacks import Freeze

from nlptrain import TrainConfig, Trainer


def test_gradual_unfreezing_schedule():
    gradual = Freeze(until=2, unit="steps", gradual=True)
    assert [gradual.frozen_blocks(done, 3) for done in range(8)] == [3, 3, 2, 2, 1, 1, 0, 0]
    at_once = Freeze(until=2, unit="epochs")
    assert [at_once.frozen_blocks(done, 3) for done in range(4)] == [3, 3, 0, 0]


def test_frozen_encoder_stays_bit_identical_then_trains(tmp_path, tiny_model_dir):
    train, test = toy_sets(tmp_path, tiny_model_dir)
    record = RecordSteps()
    trainer = Trainer(tiny_model(tiny_model_dir), train, test, callbacks=[Freeze(2, "steps"), record],
                      config=TrainConfig(epochs=1, batch_size=6, lr=1e-3))
    trainer.fit()
    start, frozen_end, last = record.weights[0], record.weights[2], record.weights[-1]
    encoder = [k for k in start if not k.startswith(("classifier", "bert.pooler"))]
    assert all(torch.equal(start[k], frozen_end[k]) for k in encoder)  # 2 steps frozen
    assert not torch.equal(start["classifier.weight"], frozen_end["classifier.weight"])
    assert not torch.equal(frozen_end[encoder[-1]], last[encoder[-1]])  # then it trains
    assert all(p.requires_grad for p in trainer.unwrapped_model.parameters())


def test_what_you_froze_before_training_trains_once_you_unfreeze_it_and_freeze_keeps_it(
        tmp_path, tiny_model_dir):
    """The optimizer holds every parameter, so word embeddings frozen before the Trainer and
    unfrozen by a callback in epoch 2 train from then on (before: never, without a word); and
    Freeze, which freezes blocks for a while, leaves a parameter you froze frozen."""
    from nlptrain import Callback

    class UnfreezeInEpoch2(Callback):
        def on_epoch_start(self, trainer) -> None:
            if trainer.epoch == 1:
                embeddings.requires_grad_(True)

    train, test = toy_sets(tmp_path, tiny_model_dir)
    # With both, yours wins: Freeze neither freezes it again when it unfreezes its blocks, nor
    # at the end of training.
    for callbacks, trains in (([UnfreezeInEpoch2()], True), ([Freeze(1, "steps")], False),
                              ([Freeze(1, "steps"), UnfreezeInEpoch2()], True)):
        model = tiny_model(tiny_model_dir)
        embeddings = model.bert.embeddings.word_embeddings.weight
        embeddings.requires_grad_(False)
        before = embeddings.detach().clone()
        record = RecordSteps()
        Trainer(model, train, test, callbacks=[*callbacks, record],
                config=TrainConfig(epochs=2, batch_size=6, lr=1e-2, scheduler="constant")).fit()
        name = "bert.embeddings.word_embeddings.weight"
        assert torch.equal(record.weights[4][name], before)  # epoch 1: frozen
        assert torch.equal(embeddings.detach(), before) is not trains, callbacks
        assert embeddings.requires_grad is trains


def test_an_optimizer_state_saved_without_the_frozen_parameters_loads_into_one_with_them(
        tiny_model_dir):
    """Checkpoints of nlptrain 0.1.0 hold an optimizer of the trainable parameters alone: a run
    that froze some before the Trainer must still resume, each state on its own parameter."""
    from nlptrain.optim import adamw, make_optimizer, param_groups, state_of_trainable_only

    model = tiny_model(tiny_model_dir)
    frozen = model.bert.embeddings.word_embeddings.weight
    frozen.requires_grad_(False)
    config = TrainConfig(lr=1e-3)
    groups = [{**g, "params": [p for p in g["params"] if p.requires_grad]}
              for g in param_groups(model, config.lr, config)]
    old = adamw(groups, config)  # as 0.1.0 built it
    for param in model.parameters():
        param.grad = torch.randn_like(param) if param.requires_grad else None
    old.step()
    now = make_optimizer(model, config, 1)
    with pytest.raises(ValueError):
        now.load_state_dict(old.state_dict())
    now.load_state_dict(state_of_trainable_only(now, old.state_dict()))
    trainable = [p for p in model.parameters() if p.requires_grad]
    assert len(now.state) == len(trainable) and frozen not in now.state
    for param in trainable:
        assert torch.equal(now.state[param]["exp_avg"], old.state[param]["exp_avg"])
    assert state_of_trainable_only(now, {**old.state_dict(), "param_groups": []}) is None


def test_gradual_freeze_leaves_a_block_your_callback_unfroze_as_it_is(tmp_path, tiny_model_dir):
    """Freeze(2, steps, gradual) unfreezes a block every 2 steps: the embeddings, which a
    callback unfroze after step 1, were frozen again at step 2."""
    from nlptrain import Callback

    seen = []

    class UnfreezeAtStep1(Callback):
        def on_step_end(self, trainer) -> None:
            embeddings = trainer.unwrapped_model.bert.embeddings.word_embeddings.weight
            if trainer.global_step == 1:
                embeddings.requires_grad_(True)
            seen.append(embeddings.requires_grad)

    train, test = toy_sets(tmp_path, tiny_model_dir)
    Trainer(tiny_model(tiny_model_dir), train, test,
            callbacks=[Freeze(2, "steps", gradual=True), UnfreezeAtStep1()],
            config=TrainConfig(epochs=1, batch_size=6)).fit()
    assert len(seen) >= 3 and all(seen), seen
