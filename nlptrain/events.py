"""Events and callbacks.

The trainer fires each event from exactly one place (see trainer.py): the loop's events in
`Trainer.fit`, the valid events in `validate`, the checkpoint events where the callbacks' state
is gathered and restored. A callback subclasses `Callback`, overrides the events it cares
about, and receives the trainer itself: it may read anything (model, optimizer, scheduler,
epoch, global_step, steps_per_epoch, metrics) and change what the trainer does (set
`trainer.train_data`, `trainer.should_stop = True`, `trainer.should_save = True`, ...).

Callbacks run on every rank, so one that calls a collective stays in step with the others. One
that only prints or writes files sets `main_process_only = True` and runs on rank 0 alone. They
run in the order given, except those that set `runs_last = True` (Checkpointer): a checkpoint
must hold what every other callback made of the step.
"""

from __future__ import annotations

import difflib
import inspect
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nlptrain.errors import ConfigError

if TYPE_CHECKING:
    from nlptrain.trainer import Trainer

log = logging.getLogger(__name__)
WRITTEN_BY = "written_by"  # in a checkpoint's callback states: the callbacks that wrote them

# In firing order; the README's event table is checked against a recorded run (tests/test_events).
EVENTS = (
    "on_train_start",
    "on_epoch_start",
    "on_batch_start",
    "on_loss",
    "on_backward_start",
    "on_backward_end",
    "on_step_end",
    "on_batch_end",
    "on_valid_start",
    "on_valid_end",
    "on_epoch_end",
    "on_save_checkpoint",
    "on_load_checkpoint",
    "on_exception",
    "on_train_end",
)
# Every callback gets these, even after an earlier one raised: each closes its own files, writes
# its checkpoint (Checkpointer on a signal), puts the weights back (EMA, FGM, Freeze).
CLEANUP_EVENTS = ("on_exception", "on_train_end")
STATE_EVENTS = ("on_save_checkpoint", "on_load_checkpoint")


class Callback:
    """Base class: every event is a no-op. Override the ones you need."""

    main_process_only: bool = False
    runs_last: bool = False  # after the other callbacks at every event, whatever the list order
    saves_on_stop: bool = False  # writes a checkpoint when a signal stops the run (Checkpointer)

    def on_train_start(self, trainer: Trainer) -> None:
        """Before the first epoch. The train data may be replaced here."""

    def on_epoch_start(self, trainer: Trainer) -> None:
        """Before each epoch. The train data may be replaced here; lengths are read after."""

    def on_batch_start(self, trainer: Trainer, batch: dict) -> None:
        """Before the forward pass of each micro-batch."""

    def on_loss(self, trainer: Trainer, loss: Any) -> None:
        """After the forward pass; `loss` is this rank's loss tensor."""

    def on_backward_start(self, trainer: Trainer) -> None:
        """Before `loss.backward()`."""

    def on_backward_end(self, trainer: Trainer) -> None:
        """After backward. On an update step (`trainer.is_update_step`) grads are complete, and
        clipped already where [train] max_grad_norm > 0: the trainer's GradClip runs before the
        callbacks given to it (its `last_norm` is the norm before clipping). To change the
        gradients before they are clipped, set max_grad_norm = 0 and pass your callback, then
        `GradClip(norm)`, in that order."""

    def on_step_end(self, trainer: Trainer) -> None:
        """After `optimizer.step()`; `trainer.global_step` counts optimizer steps."""

    def on_batch_end(self, trainer: Trainer) -> None:
        """After each micro-batch; `trainer.step_loss` is the latest optimizer step's loss (the
        mean over its rows, all ranks) on the device, `trainer.last_loss` the same read to the
        host (a sync on a GPU: read it at logged steps)."""

    def on_valid_start(self, trainer: Trainer) -> None:
        """Before an evaluation."""

    def on_valid_end(self, trainer: Trainer, metrics: dict, is_best: bool) -> None:
        """After an evaluation; `metrics` and `is_best` are the same on every rank."""

    def on_epoch_end(self, trainer: Trainer) -> None:
        """After each epoch (and its evaluation)."""

    def on_save_checkpoint(self, trainer: Trainer, state: dict) -> None:
        """A checkpoint is being written; add this callback's own tensors/numbers to `state`."""

    def on_load_checkpoint(self, trainer: Trainer, state: dict) -> None:
        """A checkpoint was loaded; read back what `on_save_checkpoint` stored."""

    def on_exception(self, trainer: Trainer, error: BaseException) -> None:
        """Training raised `error` (also KeyboardInterrupt); `on_train_end` follows."""

    def on_train_end(self, trainer: Trainer) -> None:
        """Always, last: after the final epoch, an early stop, or an error."""


def listed_callbacks(callbacks: Any) -> list[Callback]:
    """`Trainer(callbacks=...)` as a list; one callback (or a function, a class) given alone is
    refused with the cure, not as "object is not iterable"."""
    if isinstance(callbacks, Callback):
        raise ConfigError(f"callbacks= takes a list: callbacks=[{type(callbacks).__name__}(...)], "
                          "not the callback alone")
    if callable(callbacks) or not isinstance(callbacks, Iterable):
        name = getattr(callbacks, "__name__", "")
        raise ConfigError(f"callbacks= takes a list of Callback objects (subclasses of "
                          f"nlptrain.Callback), not a {type(callbacks).__name__}"
                          f"{f' ({name})' if name else ''}")
    return list(callbacks)


def check_callback(callback: Any) -> Callback:
    """Refuse now what would fail at its first event, maybe hours into training: an object that
    is not a Callback, or an event method that cannot take the event's arguments."""
    if isinstance(callback, type) and issubclass(callback, Callback):
        raise ConfigError(f"callback {callback.__name__} is a Callback class: pass an instance, "
                          f"{callback.__name__}()")
    name = type(callback).__name__
    if not isinstance(callback, Callback):
        raise ConfigError(f"callback {name} is not a Callback: subclass nlptrain.Callback and "
                          "override the events you need")
    for event in EVENTS:
        method = getattr(callback, event)
        arguments = list(inspect.signature(getattr(Callback, event)).parameters)[1:]
        try:
            inspect.signature(method).bind(*arguments)
        except ValueError:  # no signature to read (a builtin): called as it is
            continue
        except TypeError:
            raise ConfigError(f"callback {name}.{event}{inspect.signature(method)} cannot take the "
                              f"event's arguments ({', '.join(arguments)}){defined_at(method)}"
                              ) from None
    return callback


def defined_at(function: Any) -> str:
    """"; at FILE:LINE" where `function`'s source is found (a user's callback, from Python)."""
    try:
        file = inspect.getsourcefile(function)
        line = inspect.getsourcelines(function)[1]
    except (OSError, TypeError):  # a builtin, a class made by exec without a file
        return ""
    return f"; at {file}:{line}" if file else ""


def unknown_events(callback: Callback) -> list[str]:
    """The methods of `callback`'s own class named like an event but none (`on_epoch_ended`): a
    misspelt event would never fire, silently."""
    return [name for name, value in inspect.getmembers(type(callback), callable)
            if name.startswith("on_") and name not in EVENTS]


# Other trainers' names for an event (Lightning, transformers.Trainer): the nearest spelling
# may be another event (on_train_batch_end is nearest on_train_end, once a run).
OTHER_NAMES = {
    "on_fit_start": "on_train_start", "on_fit_end": "on_train_end",
    "on_train_epoch_start": "on_epoch_start", "on_train_epoch_end": "on_epoch_end",
    "on_train_batch_start": "on_batch_start", "on_train_batch_end": "on_batch_end",
    "on_validation_start": "on_valid_start", "on_validation_end": "on_valid_end",
    "on_validation_epoch_end": "on_valid_end", "on_evaluate": "on_valid_end",
    "on_step_begin": "on_batch_start", "on_before_backward": "on_backward_start",
    "on_after_backward": "on_backward_end", "on_save": "on_save_checkpoint",
}


def event_named_elsewhere(name: str) -> str | None:
    """The event another trainer calls `name`: fastNLP 0.x's and Keras's `*_begin` are our
    `*_start` (difflib's nearest is the `*_end`, the opposite), Lightning's and transformers'."""
    if name.endswith("_begin") and name.removesuffix("_begin") + "_start" in EVENTS:
        return name.removesuffix("_begin") + "_start"
    return OTHER_NAMES.get(name)


def unread_state_methods(callback: Callback) -> list[str]:
    """`state_dict` / `load_state_dict` (Lightning's callback state) on a callback that does not
    override the event nlptrain calls instead: its state would be lost at a resume, silently."""
    events = {"state_dict": "on_save_checkpoint", "load_state_dict": "on_load_checkpoint"}
    own = type(callback)
    return [name for name, event in events.items()
            if callable(getattr(own, name, None)) and getattr(own, event) is getattr(Callback, event)]


class CallbackList:
    """Fires an event on each callback in order, skipping rank-0-only ones on other ranks."""

    def __init__(self, callbacks: list[Callback], is_main: bool) -> None:
        for callback in callbacks:
            check_callback(callback)
            for name in unknown_events(callback) if is_main else ():
                near = [known] if (known := event_named_elsewhere(name)) else \
                    difflib.get_close_matches(name, EVENTS, n=1)
                log.warning("callback %s.%s is no event, so it is never called%s%s",
                            type(callback).__name__, name,
                            f" (did you mean {near[0]}?)" if near else f"; the events: {', '.join(EVENTS)}",
                            defined_at(getattr(type(callback), name)))
            for name in unread_state_methods(callback) if is_main else ():
                log.warning("callback %s.%s is never called: a checkpoint keeps a callback's state "
                            "through on_save_checkpoint / on_load_checkpoint (trainer, state)",
                            type(callback).__name__, name)
        self.callbacks = sorted(callbacks, key=lambda c: c.runs_last)  # stable: order kept
        self.is_main = is_main
        # Each callback's checkpoint state is its own dict, kept flat in the checkpoint unless one
        # of its keys is another's already (two MetricLoggers, a subclass beside its parent):
        # then under "<class>#<n>", the n-th callback of that class, and read back from there.
        self.state_keys: dict[int, str] = {}
        count: dict[str, int] = {}
        for callback in self.callbacks:
            name = type(callback).__name__
            count[name] = count.get(name, 0) + 1
            self.state_keys[id(callback)] = f"{name}#{count[name]}"

    def fire(self, event: str, trainer: Trainer, *args: Any, failing: bool = False) -> None:
        """`failing`: the run is ending with an error, which goes on; a cleanup event's own errors
        are then logged. Otherwise a cleanup event raises its first error once all have run."""
        errors: list[Exception] = []
        for callback in self.callbacks:
            if callback.main_process_only and not self.is_main:
                continue
            try:
                if event in STATE_EVENTS:
                    self._state_event(callback, event, trainer, args[0])
                else:
                    getattr(callback, event)(trainer, *args)
            except Exception as error:  # a second Ctrl-C (KeyboardInterrupt) still ends it all
                if event not in CLEANUP_EVENTS:
                    raise
                errors.append(error)
                if failing or len(errors) > 1:
                    log.error("callback %s.%s raised: %r", type(callback).__name__, event, error,
                              exc_info=error)
        if errors and not failing:
            raise errors[0]

    def _state_event(self, callback: Callback, event: str, trainer: Trainer,
                     states: dict[str, Any]) -> None:
        key = self.state_keys[id(callback)]
        if event == "on_load_checkpoint":
            callback.on_load_checkpoint(trainer, states[key] if key in states else states)
            return
        mine: dict[str, Any] = {}
        callback.on_save_checkpoint(trainer, mine)
        if mine.keys() & states.keys():  # else one state would replace the other's
            states[key] = mine
        else:
            states.update(mine)

    def state_dict_to_fill(self) -> dict[str, Any]:
        """The dict `on_save_checkpoint` fills (with the names of the callbacks that write)."""
        return {WRITTEN_BY: self.stateful()}

    def stateful(self) -> list[str]:
        """The callbacks that put state in a checkpoint, by class name (recorded with it)."""
        return [type(c).__name__ for c in self.callbacks
                if type(c).on_save_checkpoint is not Callback.on_save_checkpoint]

    def check_states(self, states: dict[str, Any]) -> None:
        """Say which callbacks wrote state into a loaded checkpoint but are not in this run (a
        resume that left one out: an EMA, a user's own): their state is left unused."""
        present = self.stateful()
        missing = [name for name in states.get(WRITTEN_BY, []) if name not in present]
        if missing and self.is_main:
            log.warning("the checkpoint holds the state of callback(s) %s, which this run has not: "
                        "it goes on without them (to keep one, give it again, or the option that makes "
                        "it)", ", ".join(missing))

    def find(self, kind: type) -> list[Callback]:
        return [c for c in self.callbacks if isinstance(c, kind)]
