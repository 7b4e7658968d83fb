"""The event order of a real run, stopping from a callback, and errors reaching on_exception."""

from __future__ import annotations

import math
import os
import re
import signal

import pytest
from conftest import REPO
from log_capture import nlptrain_messages
from toy_trainer import Recorder, make_trainer, toy_datasets

from nlptrain import EVENTS, Callback, TrainConfig, Trainer
from nlptrain.errors import ConfigError, Interrupted
from nlptrain.models import load_model

STEP = ["on_batch_start", "on_loss", "on_backward_start", "on_backward_end", "on_step_end",
        "on_batch_end"]


def test_events_fire_in_the_documented_order(tmp_path, tiny_model_dir):
    recorder = Recorder()
    make_trainer(tmp_path, tiny_model_dir, [recorder]).fit()  # 24 rows / 8 = 3 batches an epoch
    epoch = ["on_epoch_start", *STEP * 3, "on_valid_start", "on_valid_end", "on_epoch_end"]
    assert recorder.events == ["on_train_start", *epoch * 2, "on_train_end"]
    # What a callback can reach while training.
    assert recorder.seen["global_step"] == 6 and recorder.seen["epoch"] == 1
    assert recorder.seen["steps_per_epoch"] == 3 and recorder.seen["scheduler"] is not None


def test_readme_event_table_matches_the_recorded_order(tmp_path, tiny_model_dir):
    recorder = Recorder()
    make_trainer(tmp_path, tiny_model_dir, [recorder], epochs=1).fit()
    first_seen = list(dict.fromkeys(recorder.events))
    readme = (REPO / "README.md").read_text()
    table = re.findall(r"^\|\s*`(on_\w+)`", readme, flags=re.MULTILINE)
    assert table == list(EVENTS), "README's event table must list EVENTS in order"
    assert [e for e in EVENTS if e in first_seen] == first_seen


def test_is_update_step_is_true_on_update_steps_alone(tmp_path, tiny_model_dir):
    """Outside a micro-batch (an epoch's start and end, its evaluation) there is no update step:
    the epoch's last micro-batch's value used to stay until the next epoch's first."""
    seen: list[tuple[str, bool]] = []

    class Watch(Callback):
        def on_epoch_start(self, trainer):
            seen.append(("epoch_start", trainer.is_update_step))

        def on_backward_end(self, trainer):
            seen.append(("backward_end", trainer.is_update_step))

        def on_valid_end(self, trainer, metrics, is_best):
            seen.append(("valid_end", trainer.is_update_step))

        def on_epoch_end(self, trainer):
            seen.append(("epoch_end", trainer.is_update_step))

        def on_batch_end(self, trainer):
            seen.append(("batch_end", trainer.is_update_step))

    make_trainer(tmp_path, tiny_model_dir, [Watch()], grad_accum=2).fit()  # 3 batches an epoch
    epoch = [("epoch_start", False), ("backward_end", False), ("batch_end", False),
             ("backward_end", True), ("batch_end", True), ("backward_end", True),
             ("batch_end", True), ("valid_end", False), ("epoch_end", False)]
    assert seen == epoch * 2
    # An eval_every evaluation, inside the step's micro-batch (review 100: it saw True).
    seen.clear()
    make_trainer(tmp_path, tiny_model_dir, [Watch()], grad_accum=2, epochs=1, eval_every=1).fit()
    assert seen[-4:] == [("backward_end", True), ("valid_end", False), ("batch_end", True),
                         ("epoch_end", False)]


def test_gradient_accumulation_fires_step_end_once_per_update(tmp_path, tiny_model_dir):
    recorder = Recorder()
    trainer = make_trainer(tmp_path, tiny_model_dir, [recorder], epochs=1, grad_accum=2)
    trainer.fit()
    assert recorder.events.count("on_batch_end") == 3
    assert recorder.events.count("on_step_end") == 2  # batches 2 and 3 (the epoch's last) update
    assert trainer.global_step == 2


def test_a_callback_stops_training_cleanly(tmp_path, tiny_model_dir):
    class StopAtTwo(Callback):
        def on_step_end(self, trainer):
            if trainer.global_step == 2:
                trainer.should_stop = True

    recorder = Recorder()
    trainer = make_trainer(tmp_path, tiny_model_dir, [StopAtTwo(), recorder], epochs=5)
    trainer.fit()
    # Step 3's flags carry the stop (asked after step 2): every rank reads them one step late,
    # at step 4, which is undone. The run ends after step 3, on 1 rank as on N.
    assert trainer.global_step == 3
    assert recorder.events.count("on_step_end") == 3 and recorder.events.count("on_batch_end") == 3
    assert recorder.events[-4:] == ["on_valid_start", "on_valid_end", "on_epoch_end", "on_train_end"]
    assert recorder.events.count("on_epoch_start") == 1


def test_fit_without_eval_data_returns_the_epochs_steps_and_last_loss(tmp_path, tiny_model_dir):
    train, _ = toy_datasets(tmp_path, tiny_model_dir)  # 24 rows / 8 = 3 steps an epoch
    trainer = Trainer(load_model(str(tiny_model_dir), ["neg", "pos"]), train, None,
                      config=TrainConfig(epochs=2, batch_size=8, lr=1e-3))
    result = trainer.fit()
    assert result == {"epoch": 2, "step": 6, "train_loss": trainer.last_loss}
    assert math.isfinite(result["train_loss"]) and result["train_loss"] > 0


def test_an_error_fires_on_exception_then_on_train_end(tmp_path, tiny_model_dir):
    class Boom(Callback):
        def on_batch_end(self, trainer):
            if trainer.batch_in_epoch == 2:
                raise RuntimeError("callback bug")

    class Seen(Callback):
        error = None

        def on_exception(self, trainer, error):
            Seen.error = error

    recorder = Recorder()
    with pytest.raises(RuntimeError, match="callback bug"):
        make_trainer(tmp_path, tiny_model_dir, [recorder, Boom(), Seen()]).fit()
    assert recorder.events[-2:] == ["on_exception", "on_train_end"]
    assert isinstance(Seen.error, RuntimeError)


def test_each_event_is_fired_from_one_line_of_the_trainer_and_callbacks_are_typed():
    sources = {p: p.read_text() for p in [*(REPO / "nlptrain").rglob("*.py"),
                                          *(REPO / "callbacks").glob("*.py")]}
    for event in EVENTS:
        places = [(p.name, n) for p, text in sources.items()
                  for n, line in enumerate(text.splitlines()) if f'fire("{event}"' in line]
        assert len(places) == 1 and places[0][0] == "trainer.py", (event, places)
    untyped = [p.name for p, text in sources.items() if "callbacks" in p.parts
               and re.search(r"trainer: Any\b", text)]
    assert untyped == []


@pytest.mark.parametrize("sent", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_in_an_epochs_last_step_still_ends_that_epoch(tmp_path, tiny_model_dir, sent):
    """The epoch is all trained: its evaluation and on_epoch_end run before the stop, as in the run
    never stopped. Skipped, they would never run: a resume starts at the next epoch. SIGHUP (a
    closed terminal, passed on by --nproc's launcher) killed the process, with no checkpoint."""
    class SigtermInStep(Callback):
        def on_batch_start(self, trainer, batch):
            if trainer.global_step == 2:  # during step 3, the epoch's last (3 batches an epoch)
                os.kill(os.getpid(), sent)

    recorder = Recorder()
    trainer = make_trainer(tmp_path, tiny_model_dir, [SigtermInStep(), recorder])
    # No Checkpointer here: nothing to resume from, and the message does not offer it.
    with pytest.raises(Interrupted, match=r"after step 3; nothing was saved \(no Checkpointer"):
        trainer.fit()
    assert recorder.events[-7:] == ["on_step_end", "on_batch_end", "on_valid_start",
                                    "on_valid_end", "on_epoch_end", "on_exception", "on_train_end"]
    assert trainer.metrics["step"] == 3 and trainer.epoch == 1


def test_a_stop_says_how_to_resume_where_a_callback_of_ones_own_saves_on_it(tmp_path, tiny_model_dir):
    """`saves_on_stop`: the stop's message asks the callbacks, not for the Checkpointer class."""
    class OwnSaver(Callback):
        saves_on_stop = True

        def on_batch_start(self, trainer, batch):
            if trainer.global_step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    trainer = make_trainer(tmp_path, tiny_model_dir, [OwnSaver()])
    with pytest.raises(Interrupted, match=r"after step 2; continue with resume_from="):
        trainer.fit()


def test_a_signal_the_process_ignores_stays_ignored(tmp_path, tiny_model_dir):
    """nohup ignores SIGHUP: a closed terminal stopped the run once SIGHUP stopped runs."""
    class HangUp(Callback):
        def on_batch_start(self, trainer, batch):
            if trainer.global_step == 1:
                os.kill(os.getpid(), signal.SIGHUP)

    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        trainer = make_trainer(tmp_path, tiny_model_dir, [HangUp()])
        trainer.fit()
        assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, before)
    assert trainer.global_step == 6  # 2 epochs of 3 steps: all trained


def test_a_stop_signal_leaves_an_ignored_ctrl_c_ignored():
    """After a SIGTERM, a second Ctrl-C kills: SIGINT's default handler was put in place even
    where SIGINT was ignored (a script's `cmd &`), and stayed after the block."""
    from nlptrain.signals import stop_on_signals

    asked = []
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with stop_on_signals(lambda: asked.append(True), say=False):
            os.kill(os.getpid(), signal.SIGTERM)
            signal.getsignal(signal.SIGINT)  # (the handler runs between bytecodes)
        assert asked == [True] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, before)


def test_a_signal_sent_again_is_said_once(tmp_path, tiny_model_dir):
    """A launcher killed with SIGKILL: the kernel sends a worker the parent-death SIGTERM once
    per thread of the launcher it passes through (two lines said the same stop)."""
    class ThreeSigterms(Callback):
        def on_batch_start(self, trainer, batch):
            if trainer.global_step == 1:
                for _ in range(3):
                    os.kill(os.getpid(), signal.SIGTERM)

    with nlptrain_messages() as said, pytest.raises(Interrupted, match="after step 2"):
        make_trainer(tmp_path, tiny_model_dir, [ThreeSigterms()]).fit()
    assert [m for m in said if m.startswith("SIGTERM")] == [
        "SIGTERM: every rank stops after the step under way (the next, between steps)"]


class BrokenCleanup(Callback):
    def on_exception(self, trainer, error):
        raise OSError("notifier down")

    def on_train_end(self, trainer):
        raise OSError("notifier down")


def test_every_callback_gets_the_cleanup_events_when_one_raises(tmp_path, tiny_model_dir):
    """on_exception and on_train_end reach every callback (the checkpointer's save on a signal,
    the loggers closing their files) though an earlier one raises; the error raised is the run's."""
    class Boom(Callback):
        def on_step_end(self, trainer):
            raise RuntimeError("callback bug")

    recorder = Recorder()
    with nlptrain_messages() as messages, pytest.raises(RuntimeError, match="callback bug"):
        make_trainer(tmp_path, tiny_model_dir, [Boom(), BrokenCleanup(), recorder]).fit()
    assert recorder.events[-2:] == ["on_exception", "on_train_end"]
    assert sum("BrokenCleanup.on_" in m and "notifier down" in m for m in messages) == 2, messages
    # A run that ends well raises its callback's cleanup error, once every callback had its turn.
    recorder = Recorder()
    with pytest.raises(OSError, match="notifier down"):
        make_trainer(tmp_path, tiny_model_dir, [BrokenCleanup(), recorder], epochs=1).fit()
    assert recorder.events[-1] == "on_train_end" and "on_exception" not in recorder.events


class WrongArgs(Callback):
    def on_valid_end(self, trainer):  # the event passes metrics and is_best too
        pass


class NotACallback:
    def on_epoch_end(self, trainer):
        pass


@pytest.mark.parametrize("wrong, message", [
    (WrongArgs(), r"WrongArgs\.on_valid_end\(trainer\) cannot take the event's arguments "
                  r"\(trainer, metrics, is_best\); at .*test_events\.py:252$"),
    (NotACallback(), r"NotACallback is not a Callback: subclass nlptrain\.Callback"),
    (Recorder, r"Recorder is a Callback class: pass an instance, Recorder\(\)")])
def test_a_wrong_callback_is_refused_before_training_naming_it(tmp_path, tiny_model_dir, wrong,
                                                               message):
    with pytest.raises(ConfigError, match=message):
        make_trainer(tmp_path, tiny_model_dir, [wrong])


def on_step_end(trainer) -> None:  # a function, not a Callback
    pass


@pytest.mark.parametrize("alone, message", [
    (Recorder(), r"^callbacks= takes a list: callbacks=\[Recorder\(\.\.\.\)\], not the callback alone$"),
    (on_step_end, r"^callbacks= takes a list of Callback objects \(subclasses of nlptrain\.Callback\), "
                  r"not a function \(on_step_end\)$")])
def test_one_callback_not_in_a_list_is_refused_with_the_cure(tmp_path, tiny_model_dir, alone, message):
    with pytest.raises(ConfigError, match=message):
        make_trainer(tmp_path, tiny_model_dir, alone)


def test_a_misspelt_event_is_warned_of_with_the_event_it_is_near(tmp_path, tiny_model_dir, caplog):
    class Typo(Callback):
        def on_epoch_ended(self, trainer) -> None:  # never fired: no such event
            raise AssertionError("not an event")

    with caplog.at_level("WARNING", logger="nlptrain"):
        make_trainer(tmp_path, tiny_model_dir, [Typo()]).fit()
    line = Typo.on_epoch_ended.__code__.co_firstlineno
    assert "callback Typo.on_epoch_ended is no event, so it is never called (did you mean " \
           f"on_epoch_end?); at {__file__}:{line}" in caplog.text


@pytest.mark.parametrize("name, meant", [
    ("on_epoch_begin", "on_epoch_start"),  # fastNLP 0.x, Keras: difflib's nearest is on_epoch_end
    ("on_batch_begin", "on_batch_start"),
    ("on_train_batch_end", "on_batch_end"),  # Lightning's per-batch hook, not once a run
    ("on_validation_end", "on_valid_end"),
    ("on_fit_start", "on_train_start")])
def test_another_trainers_name_for_an_event_is_warned_of_with_ours(name, meant, caplog):
    from nlptrain.events import CallbackList

    typo = type("Elsewhere", (Callback,), {name: lambda self, trainer: None})()
    with caplog.at_level("WARNING", logger="nlptrain"):
        CallbackList([typo], is_main=True)
    assert f"callback Elsewhere.{name} is no event, so it is never called (did you mean " \
           f"{meant}?)" in caplog.text


def test_lightnings_state_methods_on_a_callback_are_warned_of(tmp_path, tiny_model_dir, caplog):
    """A callback written the Lightning way lost its state at a resume, unsaid."""
    class Counted(Callback):  # Lightning's names: never called here
        def state_dict(self) -> dict:
            return {}

        def load_state_dict(self, state: dict) -> None:
            pass

    class Kept(Counted):  # its own state_dict, used by the events nlptrain calls: no warning
        def on_save_checkpoint(self, trainer, state: dict) -> None:
            state.update(self.state_dict())

        def on_load_checkpoint(self, trainer, state: dict) -> None:
            self.load_state_dict(state)

    with caplog.at_level("WARNING", logger="nlptrain"):
        make_trainer(tmp_path, tiny_model_dir, [Counted(), Kept()])
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"callback Counted.{name} is never called: a checkpoint keeps a callback's "
                    "state through on_save_checkpoint / on_load_checkpoint (trainer, state)"
                    for name in ("state_dict", "load_state_dict")], said


@pytest.mark.parametrize("ending", ["stop", "error"])
def test_on_train_end_sees_the_counters_where_a_stop_or_error_left_them(tmp_path, tiny_model_dir, ending):
    """As the README's event table says, and as the checkpoint written at a stop holds them: a
    stop or an error in epoch 1 (from 0) leaves it at batch 2. A stop used to move the counters
    to the next epoch's start, and a later fit() skipped the rest of the stopped epoch."""
    seen: dict[str, int] = {}

    class EndAtStepFive(Callback):  # mid-epoch: epoch 1 has steps 4, 5 and 6
        def on_step_end(self, trainer):
            if trainer.global_step == 5 and ending == "error":
                raise RuntimeError("at step 5")
            trainer.should_stop |= trainer.global_step == 4  # rides step 5's flags: ends there

        def on_train_end(self, trainer):
            seen.update(epoch=trainer.epoch, batch=trainer.batch_in_epoch, step=trainer.global_step)

    trainer = make_trainer(tmp_path, tiny_model_dir, [EndAtStepFive()], epochs=3)  # 3 steps an epoch
    if ending == "error":
        with pytest.raises(RuntimeError, match="at step 5"):
            trainer.fit()
        assert seen == {"epoch": 1, "batch": 2, "step": 5}
    else:
        trainer.fit()
        assert seen == {"epoch": 1, "batch": 2, "step": 5}
