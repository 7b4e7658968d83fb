"""`fit()` called again on the same trainer: after a stop, an error, a signal or a non-finite
step, it trains on from where the first call ended, each row of the epoch once."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from toy_trainer import assert_trained_as_the_whole_run, make_trainer

from nlptrain import Callback


def test_fit_again_after_a_callbacks_stop_says_it_trains_nothing(tmp_path, tiny_model_dir, caplog):
    class StopAtTwo(Callback):
        def on_step_end(self, trainer) -> None:
            trainer.should_stop = trainer.should_stop or trainer.global_step == 2

    trainer = make_trainer(tmp_path, tiny_model_dir, [StopAtTwo()], epochs=3, batch_size=4)
    trainer.fit()
    stopped = trainer.global_step
    with caplog.at_level("WARNING", logger="nlptrain"):
        trainer.fit()
    assert trainer.global_step == stopped
    assert f"this trainer's run was stopped at step {stopped} (should_stop)" in caplog.text
    assert (trainer.epoch, trainer.batch_in_epoch) == (0, stopped)  # where it stopped
    trainer.should_stop = False  # trains on: the rest of the stopped epoch, then the others, as a
    trainer.fit()  # resume from there would (the rest of epoch 1 used to be skipped)
    assert (trainer.epoch, trainer.global_step) == (3, 3 * trainer.steps_per_epoch)
    assert_trained_as_the_whole_run(trainer, tmp_path, tiny_model_dir, epochs=3, batch_size=4)


def test_fit_again_after_a_stop_trains_on_from_the_trained_weights_not_an_emas_average(
        tmp_path, tiny_model_dir):
    """EMA(export=True) puts its average in at every fit's end: the next fit trained on from the
    average, not from the weights the stopped one had trained (review 120), nor those of a run
    given more epochs after it ended (review 123)."""
    from dataclasses import replace

    from nlptrain.callbacks import EMA

    class StopAtTwo(Callback):
        def on_step_end(self, trainer) -> None:
            trainer.should_stop = trainer.should_stop or trainer.global_step == 2

    constant = dict(batch_size=4, scheduler="constant", warmup_ratio=0.0)  # (more epochs: the
    stopped = make_trainer(tmp_path, tiny_model_dir, [StopAtTwo(), EMA(0.5)], epochs=1,  # same lr)
                           **constant)
    stopped.fit()
    stopped.should_stop = False
    stopped.fit()  # the rest of epoch 1, then (its run ended) one more epoch from the trained
    stopped.config = replace(stopped.config, epochs=2)  # weights, not from the average
    stopped.fit()
    (tmp_path / "whole").mkdir()
    whole = make_trainer(tmp_path / "whole", tiny_model_dir, [EMA(0.5)], epochs=2, **constant)
    whole.fit()
    expected = whole.unwrapped_model.state_dict()
    for name, value in stopped.unwrapped_model.state_dict().items():
        assert torch.equal(value, expected[name]), name


def test_a_steps_per_epoch_lowered_below_the_steps_done_ends_the_epoch_there(tmp_path,
                                                                           tiny_model_dir):
    """A resume given --steps-per-epoch under the batches its epoch had done: a negative count
    reached islice, a traceback, and every later resume failed alike (review 121)."""
    from dataclasses import replace

    class StopAtFour(Callback):  # (asked at step 3, read with step 4's flags)
        def on_step_end(self, trainer) -> None:
            trainer.should_stop = trainer.should_stop or trainer.global_step == 3

    trainer = make_trainer(tmp_path, tiny_model_dir, [StopAtFour()], epochs=2, batch_size=4)
    trainer.fit()
    assert (trainer.epoch, trainer.batch_in_epoch) == (0, 4)
    trainer.config = replace(trainer.config, steps_per_epoch=2)
    trainer.should_stop = False
    trainer.fit()
    assert (trainer.epoch, trainer.global_step) == (2, 4 + 2)


def test_fit_again_after_an_error_or_a_signal_trains_each_row_of_the_epoch_once(tmp_path,
                                                                                tiny_model_dir):
    """After a failed fit the next went on unaware of where the epoch stood (22 steps for 18, an
    epoch of 8 batches for 6); after a signal's stop the next fit raised the signal's Interrupted
    again, with no signal sent."""
    from nlptrain.errors import Interrupted

    class Ending(Callback):
        at: dict[int, str] = {2: "error", 9: "signal"}

        def on_batch_start(self, trainer, batch) -> None:  # inside a step: one cut short
            if self.at.get(trainer.global_step) == "error" and trainer.batch_in_epoch == 2:
                del self.at[trainer.global_step]
                raise RuntimeError("mid-step")
            if self.at.get(trainer.global_step) == "signal":
                del self.at[trainer.global_step]
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = make_trainer(tmp_path, tiny_model_dir, [Ending()], epochs=3, batch_size=4)  # 6 a epoch
    with pytest.raises(RuntimeError, match="mid-step"):
        trainer.fit()
    with pytest.raises(Interrupted):
        trainer.fit()
    assert trainer.global_step == 10
    trainer.fit()
    assert (trainer.epoch, trainer.global_step, trainer.batches_per_epoch) == (3, 18, 6)


def test_fit_again_after_an_error_in_a_steps_first_backward_trains_as_the_whole_run(
        tmp_path, tiny_model_dir):
    """At a step's first micro-batch nothing was undone: its gradient stayed, and the next fit's
    first step added it in."""
    class FailInBackward(Callback):
        failed = False

        def on_backward_end(self, trainer) -> None:
            if trainer.global_step == 2 and not self.failed:
                self.failed = True
                raise RuntimeError("in backward")

    trainer = make_trainer(tmp_path, tiny_model_dir, [FailInBackward()], epochs=3, batch_size=4)
    with pytest.raises(RuntimeError, match="in backward"):
        trainer.fit()
    trainer.fit()
    assert_trained_as_the_whole_run(trainer, tmp_path, tiny_model_dir, epochs=3, batch_size=4)


def test_fit_again_after_a_non_finite_step_goes_on_after_it(tmp_path, tiny_model_dir):
    """Read a step late (fused AdamW skips it on the device), the step was counted but its rows
    were not: the next fit trained them again, in an epoch one batch longer (19 steps for 18)."""
    from nlptrain.errors import TrainingError

    class NonFiniteOnce(Callback):
        done = False

        def on_batch_start(self, trainer, batch) -> None:
            if trainer.global_step == 2 and not self.done:
                self.done, own = True, trainer.loss_fn

                def not_finite(logits, targets):
                    trainer.loss_fn = own
                    return own(logits, targets) * float("nan")
                trainer.loss_fn = not_finite

    trainer = make_trainer(tmp_path, tiny_model_dir, [NonFiniteOnce()], epochs=3, batch_size=4)
    with pytest.raises(TrainingError, match="the loss is not finite at epoch 1, batch 3"):
        trainer.fit()
    trainer.fit()
    assert (trainer.epoch, trainer.global_step, trainer.batches_per_epoch) == (3, 18, 6)
