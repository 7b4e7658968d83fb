"""A callback's checkpoint state: kept apart from every other callback's (also of its own
class), resumed whatever the order, and refused at the save (not the resume) when a checkpoint
cannot hold it safely."""

from __future__ import annotations

import pytest
import torch
from numbered_rows import numbered_rows as rows
from transformers import AutoTokenizer

from nlptrain import TrainConfig, Trainer
from nlptrain.models import load_model


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(str(tiny_model_dir))


def test_a_callback_state_key_another_callback_writes_too_is_kept_apart_not_overwritten(
        tiny_model_dir, tokenizer, tmp_path):
    """The EMA of ema_decay keeps its weights under "ema": a user's callback writing "ema" too
    lost its state to it, found only at the resume (a dict where its float was)."""
    from nlptrain.callbacks import EMA, Checkpointer

    from nlptrain import Callback

    class LossEMA(Callback):
        def __init__(self) -> None:
            self.value = 0.5

        def on_save_checkpoint(self, trainer, state):
            state["ema"] = self.value

        def on_load_checkpoint(self, trainer, state):
            self.value = state["ema"]

    folder = tmp_path / "ckpt"

    def trainer_with(mine, **resume):
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), rows(tokenizer, [0, 1] * 4),
                       config=TrainConfig(epochs=1, batch_size=4, ema_decay=0.9),
                       callbacks=[mine, Checkpointer(folder)], **resume)

    trainer = trainer_with(LossEMA())
    trainer.fit()
    averaged = trainer.callbacks.find(EMA)[0].average
    trainer.close()
    mine = LossEMA()
    mine.value = None
    resumed = trainer_with(mine, resume_from=folder)
    assert mine.value == 0.5
    ema = resumed.callbacks.find(EMA)[0].average
    assert all(torch.equal(a, b) for a, b in zip(ema.values(), averaged.values(), strict=True))
    resumed.close()


def test_callbacks_of_one_class_with_keys_of_their_own_resume_in_any_order(tiny_model_dir,
                                                                          tokenizer, tmp_path):
    """Their keys do not clash: they stay flat, so a resume may list them otherwise."""
    from nlptrain.callbacks import Checkpointer

    from nlptrain import Callback

    class Named(Callback):
        def __init__(self, name: str) -> None:
            self.name, self.steps = name, 0

        def on_step_end(self, trainer) -> None:
            self.steps += 1

        def on_save_checkpoint(self, trainer, state) -> None:
            state[f"named-{self.name}"] = self.steps

        def on_load_checkpoint(self, trainer, state) -> None:
            self.steps = state.get(f"named-{self.name}")

    def trainer_with(named, **resume):
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), rows(tokenizer, [0, 1] * 4),
                       config=TrainConfig(epochs=1, batch_size=4),
                       callbacks=[*named, Checkpointer(tmp_path / "ckpt")], **resume)

    trainer = trainer_with([Named("a"), Named("b")])
    trainer.fit()
    trainer.close()
    for resumed in ([Named("b"), Named("a")], [Named("b")]):
        trainer_with(resumed, resume_from=tmp_path / "ckpt").close()
        assert [c.steps for c in resumed] == [2] * len(resumed)


def test_two_callbacks_of_one_class_keep_their_states_apart_and_resume_them(
        tiny_model_dir, tokenizer, tmp_path):
    """Two MetricLoggers, or a subclass of one beside the CLI's, write the same key: the run
    was refused at its first checkpoint, its work lost. Each now has its own, back on resume."""
    from nlptrain.callbacks import Checkpointer

    from nlptrain import Callback

    class Counter(Callback):
        def __init__(self, start: int) -> None:
            self.count = start

        def on_step_end(self, trainer) -> None:
            self.count += 1

        def on_save_checkpoint(self, trainer, state) -> None:
            state["counter"] = self.count

        def on_load_checkpoint(self, trainer, state) -> None:
            self.count = state["counter"]

    class Tally(Counter):
        pass

    def trainer_with(counters, **resume):
        return Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), rows(tokenizer, [0, 1] * 4),
                       config=TrainConfig(epochs=1, batch_size=4),
                       callbacks=[*counters, Checkpointer(tmp_path / "ckpt")], **resume)

    trainer = trainer_with([Counter(0), Counter(100), Tally(1000)])
    trainer.fit()  # 2 steps
    trainer.close()
    resumed = [Counter(-1), Counter(-1), Tally(-1)]
    trainer_with(resumed, resume_from=tmp_path / "ckpt").close()
    assert [c.count for c in resumed] == [2, 102, 1002]


def test_callback_state_of_numpy_values_resumes_and_an_object_is_refused_at_the_save(
        tiny_model_dir, tokenizer, tmp_path):
    """np.float64 in a callback's state made every checkpoint of the run unloadable (refused by
    torch.load(weights_only=True) at the resume); now it is stored as a number."""
    import numpy as np
    from nlptrain.callbacks import Checkpointer

    from nlptrain import Callback
    from nlptrain.errors import CheckpointError

    class Keeps(Callback):
        def __init__(self, value):
            self.value, self.loaded = value, None

        def on_save_checkpoint(self, trainer, state):
            state["keeps"] = {"score": self.value, "seen": np.arange(3), "where": tmp_path}

        def on_load_checkpoint(self, trainer, state):
            self.loaded = state["keeps"]

    def run(value, folder):
        keeps = Keeps(value)
        Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), rows(tokenizer, [0, 1] * 4),
                config=TrainConfig(epochs=1, batch_size=4),
                callbacks=[keeps, Checkpointer(folder)], resume_from=folder).fit()
        return keeps

    run(np.float64(0.5), tmp_path / "ckpt")
    loaded = run(np.float64(0.5), tmp_path / "ckpt").loaded
    assert loaded["score"] == 0.5 and loaded["seen"].tolist() == [0, 1, 2]
    assert loaded["where"] == str(tmp_path)
    with pytest.raises(CheckpointError, match=r"callback state\['keeps'\]\['score'\] is a "
                                              r"object, which a checkpoint cannot hold safely"):
        run(object(), tmp_path / "other")
