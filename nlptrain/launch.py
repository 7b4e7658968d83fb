"""`--nproc N` and `launch(fn, nproc)`: N workers on this machine, started by torch's elastic
agent (`torch.distributed.launcher.api.elastic_launch`, what torchrun runs): the same restarts
(`max_restarts`), the same failure handling (a failed worker stops the others; its error is
reported), the same variables in each worker. The rendezvous is c10d on port 0, as `torchrun
--standalone`: the agent binds a free port itself, so no port is picked first and raced for.
`tell_launcher` writes the error file a torchelastic launcher reads for its failure summary.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import signal
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nlptrain.environments import LAUNCHER_MARK, LAUNCHER_PID
from nlptrain.errors import ConfigError, Interrupted
from nlptrain.signals import STOPPED_AFTER_STEP

log = logging.getLogger(__name__)
AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def cpu_threads(nproc: int) -> int:
    """Threads per worker when OMP_NUM_THREADS is unset: the cores this process may use, shared
    (torchrun sets 1, which leaves most cores of a CPU-only machine idle)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, cores // nproc)


@contextlib.contextmanager
def _worker_environment(nproc: int) -> Iterator[None]:
    """The workers inherit this process's environment: mark it as ours while they start."""
    added = {LAUNCHER_MARK: "nproc", LAUNCHER_PID: str(os.getpid())}
    if "OMP_NUM_THREADS" not in os.environ:
        added["OMP_NUM_THREADS"] = str(cpu_threads(nproc))
    before = {key: os.environ.get(key) for key in added}
    os.environ.update(added)
    # The agent installs its own SIGTERM/SIGINT/... handlers and leaves them: put ours back, so
    # a program that calls launch() keeps its signal handling afterwards.
    handlers = {s: signal.getsignal(s) for s in AGENT_SIGNALS} \
        if threading.current_thread() is threading.main_thread() else {}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        for key, value in before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _config(nproc: int, max_restarts: int, start_method: str) -> Any:
    from torch.distributed.launcher.api import LaunchConfig

    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, not {nproc}")
    # The agent handles (and passes on to the workers) every signal it is told to, an ignored one
    # too: nohup's SIGHUP stays ignored, here and so in the workers, only if it is not told it.
    handled = [s.name for s in AGENT_SIGNALS if signal.getsignal(s) is not signal.SIG_IGN]
    return LaunchConfig(min_nodes=1, max_nodes=1, nproc_per_node=nproc,
                        run_id=f"nlptrain-{uuid.uuid4().hex[:12]}",
                        rdzv_backend="c10d", rdzv_endpoint="localhost:0",
                        max_restarts=max_restarts, monitor_interval=0.1,
                        start_method=start_method, signals_to_handle=",".join(handled))


def launch(fn: Callable[..., Any], nproc: int, *args: Any, max_restarts: int = 0,
           start_method: str = "spawn") -> list[Any]:
    """Run `fn(*args)` on `nproc` workers; returns their return values, by rank.

    In each worker `DistTrainer` (or `nlptrain.environments.detect()`) finds its rank and world
    size as under torchrun. `fn` and `args` must be picklable (`fn` a module-level function).
    A failed worker raises `torch.distributed.elastic.multiprocessing.errors.ChildFailedError`
    here (after `max_restarts` restarts of all workers).
    """
    from torch.distributed.launcher.api import elastic_launch

    with _worker_environment(nproc):
        results = elastic_launch(_config(nproc, max_restarts, start_method), fn)(*args)
    return [results[rank] for rank in range(nproc)]


def add_launch_options(parser: argparse.ArgumentParser) -> None:
    """`--nproc N` and `--max-restarts N`, for a command that runs as one process or many."""
    parser.add_argument("--nproc", type=int, metavar="N",
                        help="start N processes on this machine (DDP; torch's elastic agent, as "
                        "torchrun): no launcher needed")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="N",
                        help="with --nproc: restart all processes up to N times after a failure "
                        "(a restarted train resumes from its latest checkpoint; eval and predict start over; "
                        "default: 0)")


def start_workers(args: argparse.Namespace, argv: list[str], check_task: Callable[[], Any]
                  ) -> int | None:
    """`--nproc N`: start the workers and wait for them (the launcher's exit code), unless this
    process is one of them (then None: run the command). `check_task` checks what the command was
    given (a task, files), so that a mistake is reported once, before any worker starts."""
    from nlptrain.environments import detect

    if args.nproc < 1:
        raise ConfigError(f"--nproc {args.nproc}: give at least 1 process")
    if args.max_restarts < 0:
        raise ConfigError(f"--max-restarts {args.max_restarts}: give 0 or more")
    environment = detect()
    if environment.is_nproc_worker:
        return None
    if environment.world_size > 1:
        raise ConfigError(f"--nproc {args.nproc}: this process is already one of "
                          f"{environment.world_size} ranks ({environment.name}); drop --nproc, "
                          "or run without the other launcher")
    check_task()
    warn_more_processes_than_cores(args.nproc)
    # torch's agent logs each worker it stops or sees fail (W/E lines amid nlptrain's own, which
    # say it once); with restarts they tell which attempt failed, and debug shows everything.
    quiet = args.max_restarts == 0 and getattr(args, "log_level", "info") != "debug"
    training = args.command == "train"
    record = _record_stamp(args) if training else None  # (an --overwrite's old run: not this one)
    with _logs_off(quiet):
        return launch_command(argv, args.nproc, args.max_restarts,
                              lambda: _how_a_train_goes_on(args, record) if training else "")


def _record_stamp(args: argparse.Namespace) -> int | None:
    """When the run record in --output-dir was last written (None: there is none)."""
    from nlptrain.run_record import CONFIG_FILE

    try:
        return (Path(args.output_dir) / CONFIG_FILE).stat().st_mtime_ns if args.output_dir else None
    except OSError:
        return None


def _how_a_train_goes_on(args: argparse.Namespace, record_before: int | None) -> str:
    """After a stop outside the steps (a worker then says nothing: the agent's SIGTERM): where
    its run is, or that it wrote none (a new run stopped before it wrote anything is removed; an
    --overwrite stopped before it replaced the old run leaves that run's record as it was)."""
    if not args.output_dir:
        return ("; go on with train --resume --output-dir RUN_DIR (the run directory logged above; "
                "none logged: run the same command again)")
    now = _record_stamp(args)
    if now is not None and (getattr(args, "resume", False) or now != record_before):
        return f"; go on with train --resume --output-dir {args.output_dir}"
    return "; the run wrote nothing: run the same command again"


@contextlib.contextmanager
def _logs_off(off: bool) -> Iterator[None]:
    """This process's logging off in the block (the launcher's: the workers log on their own).
    The agent's loggers each set their own level, so only the global switch reaches them all."""
    if off:
        logging.disable(logging.CRITICAL)
    try:
        yield
    finally:
        if off:
            logging.disable(logging.NOTSET)


def warn_more_processes_than_cores(nproc: int) -> None:
    """On a CPU, N processes beyond the cores only take turns on them, each with its own copy of
    the model and optimizer: said before they start (64 of them on 2 cores ran five minutes
    until the kernel killed one for memory)."""
    import torch

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if nproc > cores and not torch.cuda.is_available():
        log.warning("--nproc %d on %d CPU core(s): more processes than cores take turns on them, "
                    "each with its own copy of the model and optimizer (memory grows with N); "
                    "--nproc %d trains faster", nproc, cores, cores)


def launch_command(argv: list[str], nproc: int, max_restarts: int = 0,
                   go_on: Callable[[], str] = lambda: "") -> int:
    """`python -m nlptrain ARGV` on `nproc` workers (the CLI's `--nproc`); returns the exit code.
    The workers get the same ARGV: they see that the launch is theirs and run it. `go_on()`: how
    a run stopped by a signal goes on, said after the stop."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    try:
        with _worker_environment(nproc):
            elastic_launch(_config(nproc, max_restarts, "spawn"), sys.executable)(
                "-m", "nlptrain", *argv)
    except ChildFailedError as err:
        return reported_failure(err, nproc, max_restarts)
    except SignalException as err:  # Ctrl-C, SIGTERM: the agent has passed it on and stopped them
        workers = "worker was" if nproc == 1 else f"{nproc} workers were"
        print(f"stopped by {err.sigval.name}: the {workers} stopped{go_on()}", file=sys.stderr)
        return 128 + err.sigval  # as a shell reports a process ended by that signal
    return 0


def reported_failure(err: Any, nproc: int, max_restarts: int = 0) -> int:
    """The launcher's exit code for its workers' failure (`ChildFailedError`), and its line."""
    # `predict ... | head`: the reader has what it wanted. Whichever rank's failure is dated
    # first, and even where the writer was ended by the agent (SIGTERM) as it closed down after
    # another rank's stop: its record says the pipe closed.
    if any(failure.exitcode == PIPE_CLOSED or _record(failure).startswith(STDOUT_CLOSED)
           for failure in err.failures.values()):
        return PIPE_CLOSED
    rank, failure = err.get_first_failure()
    code, said = failure.exitcode, _record(failure)
    if said.startswith(INTERRUPTED_AT_ONCE):  # (the agent may have ended it with SIGTERM as
        code = Interrupted.exit_code         # it left)
    exited = re.fullmatch(rf"{re.escape(EXITED)}\((\d+)\)", said)
    if exited and code < 0:  # its sys.exit(n) told, then the agent's SIGTERM as it closed down
        code = int(exited.group(1))
    # Its stop or error said (the others' followed it), the agent's SIGTERM came as it was leaving.
    if code < 0 and said.removeprefix(ERROR).startswith(STOPPED_AFTER_STEP):
        code = Interrupted.exit_code  # the agreed stop
    elif code < 0 and said.startswith(ERROR):
        code = 1
    print(f"error: {failure_summary(rank, nproc, code, said)}"
          f"{f' (after {max_restarts} restart(s))' if max_restarts else ''}", file=sys.stderr)
    return code if code > 0 else 1


def _record(failure: Any) -> str:
    """A failed worker's record (`tell_launcher`), '' where it wrote none (torch then makes up
    a message: "To enable traceback see: ...")."""
    if not os.path.isfile(failure.error_file):
        return ""
    return failure.message.get("message", "") if isinstance(failure.message, dict) \
        else str(failure.message)


PIPE_CLOSED = 141  # a worker's exit code when its stdout's reader went away (cli.main)
STDOUT_CLOSED = "stdout closed"  # its record, written as it finds out (it may not get to exit)
INTERRUPTED_AT_ONCE = "interrupted"  # a worker's record: a KeyboardInterrupt, not the agreed stop
EXITED = "sys.exit"  # a worker's record: it ended by sys.exit(n), with no error to show
SIGNALLED = "stopped by"  # a worker's record: a signal outside the steps ended it, cleanly
ERROR = "error: "  # a worker's record: an error of its own, said on its stderr


def failure_summary(rank: int, nproc: int, exitcode: int, message: str = "") -> str:
    """The launcher's line for the first worker that failed (a negative exit code: a signal);
    `message`: the worker's record (`tell_launcher`)."""
    if exitcode == Interrupted.exit_code and message.startswith(INTERRUPTED_AT_ONCE):
        return (f"rank {rank} of {nproc} was interrupted (a second Ctrl-C, or a KeyboardInterrupt "
                "raised in it) and stopped at once, the others with it; the line above says how "
                "to go on")
    if exitcode == Interrupted.exit_code:  # no failure: a SIGTERM/SIGINT to one worker stops all
        return (f"the {nproc} workers stopped after the same step, on a signal sent to a worker "
                "(not to this launcher); the line above says how to go on")
    if exitcode > 128 and message.startswith(SIGNALLED):  # (a kill of one worker, a scheduler's)
        return (f"rank {rank} of {nproc} was ended by {message.removeprefix(SIGNALLED).strip()}"
                "; any error of its own is above")
    if exitcode >= 0 and message.startswith(EXITED):
        return f"rank {rank} of {nproc} ended by {message}, with no error of its own"
    if exitcode >= 0 and message:
        return f"rank {rank} of {nproc} failed (exit code {exitcode}); its error is above"
    if exitcode >= 0:  # no record: it ended before nlptrain's handling (os._exit, an import)
        return (f"rank {rank} of {nproc} failed (exit code {exitcode}) without reporting an "
                "error; any output of its own is above")
    name = signal.Signals(-exitcode).name if -exitcode in signal.valid_signals() else f"signal {-exitcode}"
    if -exitcode == signal.SIGKILL:  # no chance to say anything: the reason is outside
        return (f"rank {rank} of {nproc} was killed by SIGKILL, with no error of its own: by the "
                "kernel's out-of-memory killer (see `dmesg`; fewer processes or a smaller batch "
                "need less memory), or by a `kill -9`")
    return f"rank {rank} of {nproc} was ended by {name}; any error of its own is above"


def tell_exit(ended: SystemExit) -> None:
    """sys.exit(n) in a user's code: no traceback, no record of its own, so the launcher would
    name a rank that only followed it. Told once, as soon as it is known (`exit_told_at_once`)."""
    global _exit_told
    if ended.code in (None, 0) or _exit_told:
        return
    _exit_told = True
    tell_launcher(f"{EXITED}({ended.code})" if isinstance(ended.code, int) else str(ended.code))


_exit_told = False


@contextlib.contextmanager
def exit_told_at_once() -> Iterator[None]:
    """Around training: a sys.exit(n) is told before the process group closes, since the other
    ranks then fail at once and the agent may end this one (SIGTERM) before cli.main tells it."""
    try:
        yield
    except SystemExit as ended:
        tell_exit(ended)
        raise


def tell_launcher(message: str | None, follows: bool = False) -> None:
    """Write torchelastic's error file (torchrun sets TORCHELASTIC_ERROR_FILE), so that the
    launcher's summary shows nlptrain's one-line message as the root cause, or the traceback
    of an unexpected error (`message` None, called while handling it). A rank that only
    follows another's failure dates its record a second later: the launcher names the earliest
    record as the root cause."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    import json
    import time
    import traceback

    when = int(time.time()) + int(follows)
    text = message or traceback.format_exc()
    record = {"message": {"message": (message or traceback.format_exc(limit=0)).strip(),
                          "extraInfo": {"py_callstack": text, "timestamp": str(when)}}}
    global _told
    try:
        Path(path).write_text(json.dumps(record))
        _told = True
    except OSError:  # never hide the error itself
        pass


_told = False  # a record was written (an early one: a closed pipe, sys.exit)


def local_report_came(timeout_s: float = 15.0) -> bool:
    """A rank that leaves an error to local rank 0 to say waits (up to `timeout_s`) for that
    rank's record, written once it has said it: exiting first, it had the launcher stop local
    rank 0 before it spoke (no error shown at all). False where none came (the error was not
    local rank 0's after all: this rank says it). Under torchrun and --nproc the ranks' records
    are files side by side (`ATTEMPT_DIR/LOCAL_RANK/error.json`); elsewhere none is awaited."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return True
    import time

    reporter = Path(path).parent.parent / "0" / "error.json"
    deadline = time.monotonic() + timeout_s
    while not reporter.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return reporter.exists()


def tell_stopped_by_launcher(stop: BaseException, signum: int) -> int:
    """A worker of torch's agent stopped by its SIGTERM (`StoppedBySignal.by_launcher`), its
    cleanup done: the exit code, and a record where it wrote none. A rank unwinding from an
    end of its own when the agent stopped it (a closed pipe, sys.exit(n): told at once, as the
    agent's SIGTERM may come before the command ends) keeps that record and its exit code."""
    import signal

    cause = stop.__context__
    while cause is not None:
        if isinstance(cause, SystemExit):
            return cause.code if isinstance(cause.code, int) else 1
        if isinstance(cause, BrokenPipeError):
            return PIPE_CLOSED
        cause = cause.__context__
    if not _told:
        tell_launcher(f"{SIGNALLED} {signal.Signals(signum).name} outside the training steps",
                      follows=True)
    return 128 + signum  # as a shell reports a process ended by that signal
