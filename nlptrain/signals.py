"""SIGTERM / SIGINT / SIGHUP during training: ask the loop to stop after the step, on every rank.

A cluster's preemption (SLURM sends SIGTERM), a Ctrl-C or a closed terminal (SIGHUP, which
`--nproc`'s launcher passes on to its workers) then ends with a checkpoint instead of a
half-written step; a second Ctrl-C kills as usual. Outside the steps (reading the data, the
final scoring and export), each of them is a Ctrl-C: the command says how to go on.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, *([signal.SIGHUP] if hasattr(signal, "SIGHUP") else []))


@contextlib.contextmanager
def stop_on_signals(request_stop: Callable[[], None], say: bool = True) -> Iterator[None]:
    """Within the block, SIGTERM, SIGINT and SIGHUP call `request_stop` (the previous handlers come back
    after it). Outside the main thread, signals are left alone. `say`: warn of it (the main
    rank; a Ctrl-C reaches every rank, and one line says it for all)."""

    said: set[int] = set()

    def handle(signum: int, frame: Any) -> None:
        # Said once a signal: a launcher killed with SIGKILL sends its workers the parent-death
        # SIGTERM once per thread of it that the kernel hands them over to.
        if signum not in said:
            said.add(signum)
            (log.warning if say else log.info)("%s: every rank stops after the step under way "
                                               "(the next, between steps)", signal.Signals(signum).name)
        request_stop()
        if signal.SIGINT in previous:  # a second Ctrl-C kills (an ignored one stays ignored)
            signal.signal(signal.SIGINT, signal.default_int_handler)

    with _handled_by(handle) as previous:
        yield


class StoppedBySignal(KeyboardInterrupt):
    """SIGTERM or SIGHUP outside the training steps, raised as a Ctrl-C is. `by_launcher`: in a
    worker of torch's agent (torchrun, --nproc), which SIGTERMs every worker when one fails."""

    def __init__(self, signum: int, by_launcher: bool = False) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signal_name = signal.Signals(signum).name
        self.signum = int(signum)
        self.by_launcher = by_launcher


@contextlib.contextmanager
def interrupt_on_signals(by_launcher: bool = False) -> Iterator[None]:
    """Within the block, SIGTERM and SIGHUP raise StoppedBySignal as SIGINT raises
    KeyboardInterrupt: a preemption while the data is read or the results written ended the
    process at once, without a word and without the cleanup a Ctrl-C gets. In a worker of
    torch's agent too (`by_launcher`), whose SIGTERM for another rank's failure ended it before
    its cleanup: a new run that had written nothing stayed behind, and the same command, once
    fixed, was refused there ("already holds a run"). The command then ends without a line of
    its own: the failing rank's error and the agent's summary say what happened."""

    def handle(signum: int, frame: Any) -> None:
        if by_launcher:  # once: a second one (a scheduler's beside the agent's) would cut the
            for stop in stopping:  # cleanup short; the agent's SIGKILL ends a hang after it
                signal.signal(stop, signal.SIG_IGN)
        raise StoppedBySignal(signum, by_launcher)

    stopping = (signal.SIGTERM, *STOP_SIGNALS[2:])
    with _handled_by(handle, stopping):
        yield


@contextlib.contextmanager
def _handled_by(handle: Callable[[int, Any], None],
                signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> Iterator[dict]:
    """`handle` for `signals` within the block (the previous handlers, yielded, come back)."""
    try:
        # One ignored stays so (nohup ignores SIGHUP; a script's `cmd &`, SIGINT), as Python leaves
        # an ignored SIGINT: the run goes on past a closed terminal, as asked.
        previous = {s: signal.signal(s, handle) for s in signals
                    if signal.getsignal(s) is not signal.SIG_IGN}
    except ValueError:  # not the main thread
        previous = {}
    try:
        yield previous
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def leave_stops_to_the_main_process(worker_id: int) -> None:
    """A DataLoader worker's `worker_init_fn`: SIGTERM, SIGINT and SIGHUP ignored. A signal to
    the whole process group (a scheduler's preemption, a Ctrl-C in the terminal) ended the
    workers at once (torch's handler), and the main process's stop after the step then failed
    on a worker gone, with no checkpoint; the main process ends its workers itself."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


RESUME_FROM_PYTHON = "resume_from= the Checkpointer's folder"


STOPPED_AFTER_STEP = "stopped by a signal after step"  # the agreed stop's line (and record)


def stopped_message(step: int, checkpointed: bool, resume: str = RESUME_FROM_PYTHON) -> str:
    """What a run stopped by a signal after `step` says: how to go on (`resume`: the command
    line's options, say), where a Checkpointer (`checkpointed`) keeps its place."""
    return (f"{STOPPED_AFTER_STEP} {step}; " +
            (f"continue with {resume}" if checkpointed
             else "nothing was saved (no Checkpointer among the callbacks)"))
