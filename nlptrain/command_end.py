"""How a command's end is said: an error, a timeout, another rank's failure, a closed pipe, a
stop; by which rank (one line, not N copies), with the exit code a shell reads and the launcher
told (`launch.tell_launcher`). `cli.main` maps each exception it catches to one of these."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

from nlptrain.errors import (
    Interrupted,
    NlptrainError,
    RemoteRankError,
    WorkerDied,
    WorkerStuck,
    dataloader_worker_death,
    dataloader_worker_stuck,
)
from nlptrain.launch import ERROR, INTERRUPTED_AT_ONCE, PIPE_CLOSED, local_report_came, tell_launcher
from nlptrain.signals import stopped_message

log = logging.getLogger("nlptrain")


def said_peer_error(error: RemoteRankError) -> int:
    """Another rank failed and reports it: this one only says why it ends."""
    log.debug("%s", error)
    tell_launcher(f"stopped: {str(error).split(':')[0]} (see the root cause)", follows=True)
    return 1


def said_error(error: NlptrainError) -> int:
    """A mistake the user can act on, in one line; said once where every rank raised it."""
    rank, local_rank = _ranks()
    left_to_another = (error.raised_on_every_rank and rank) or \
        (error.raised_on_every_local_rank and local_rank)
    if left_to_another and local_rank:  # the rank that says it is on this machine: it speaks,
        left_to_another = local_report_came()  # and is dated, first (none came: this one says it)
    if left_to_another:
        tell_launcher(f"stopped with {'rank 0' if error.raised_on_every_rank else 'local rank 0'} "
                      "(see the root cause)", follows=True)
    else:  # (a signal's agreed stop is what was asked for: no error)
        label = "" if isinstance(error, Interrupted) else "error: "
        print(f"{_rank_prefix()}{label}{error}", file=sys.stderr)
        tell_launcher(f"{ERROR}{error}" if label else str(error))  # (torchrun's summary shows it)
    return error.exit_code


def said_runtime_error(error: RuntimeError) -> int | None:
    """A rank that gave up waiting, or one that saw another fail, in a line; None for any other
    error, which the caller raises again (a traceback: a fault of nlptrain's, or of the user's
    code, with no frame of this module in it)."""
    from nlptrain.distributed import PeerFailed, peer_failure_in, timeout_message

    message = timeout_message(error)  # no rank reported an error: this one is the first to know
    if message:
        print(f"{_rank_prefix()}error: {message}", file=sys.stderr)
        tell_launcher(f"{ERROR}{message}")
        return 1
    peer = peer_failure_in(error)
    if peer is None:
        tell_launcher(None)
        return None
    said = str(error) if isinstance(error, PeerFailed) else \
        f"another rank failed (see its error); {str(peer).splitlines()[0][:160]}"
    print(f"{_rank_prefix()}stopping: {said}", file=sys.stderr)
    tell_launcher("stopped: another rank failed (see its error)", follows=True)
    return 1


def said_closed_pipe() -> int:
    """`predict ... | head`: the reader has all it wanted; no traceback."""
    _drop_stdout()
    return PIPE_CLOSED  # as a shell counts a process ended by SIGPIPE


def said_interrupt(args: argparse.Namespace, stop: KeyboardInterrupt) -> int:
    """A stop at once (a second Ctrl-C, or a signal before training began): where a train goes
    on from, said by one rank; exit code 130, as a shell's."""
    if getattr(stop, "by_launcher", False):  # its cleanup done; the agent says its own stop
        from nlptrain.launch import tell_stopped_by_launcher

        return tell_stopped_by_launcher(stop, stop.signum)
    said = _how_a_train_goes_on(args, stop) if args.command == "train" else \
        f"{args.command} stopped before it finished; run it again for its results"
    by = getattr(stop, "signal_name", "")  # SIGTERM, SIGHUP; else a Ctrl-C
    if _ranks()[0] == 0 or not under_agent():  # (a Ctrl-C reaches every rank; the agent's
        # summary names one stopped alone)
        print(f"{_rank_prefix()}interrupted{f' by {by}' if by else ''}: {said}", file=sys.stderr)
    tell_launcher(f"{INTERRUPTED_AT_ONCE}: {said}")  # not the agreed stop, exit code 130 too
    return 130


def under_agent() -> bool:
    """A worker of torch's elastic agent: its SIGTERM may stop it for another rank's failure,
    which is said, and the agent says its own stop; a Ctrl-C's line would mislead."""
    from nlptrain.environments import detect

    try:
        return detect().has_agent
    except (KeyError, ValueError, NlptrainError):  # (said by the command itself)
        return False


def flush_stdout() -> int | None:
    """What a command wrote to stdout (`eval --json`, `predict`), flushed now: a full disk is
    one line here, not a traceback at exit."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        raise
    except OSError as err:
        _drop_stdout()
        print(f"error: stdout: cannot be written ({err.strerror or err})", file=sys.stderr)
        return 1
    return None


def _how_a_train_goes_on(args: argparse.Namespace, stop: KeyboardInterrupt) -> str:
    """Where a train command stopped by Ctrl-C goes on from: its run directory (`stop.run_dir`,
    which the run set; a resumed one's, if stopped before it was reopened), or nowhere."""
    resumed = Path(args.output_dir) if args.resume and args.output_dir else None
    run_dir = getattr(stop, "run_dir", resumed)
    if run_dir is None:
        return "stopped before the run wrote anything; run the same command again to start it"
    return ("stopped at once, without waiting for a step under way; the run goes on from its "
            f"last whole checkpoint, or from the start where it wrote none, with train --resume "
            f"--output-dir {run_dir}")


def _rank_prefix() -> str:
    rank = _ranks()[0]
    return "" if rank == 0 else f"[rank {rank}] "


def _ranks() -> tuple[int, int]:
    """This process's rank and local rank (0 where they cannot be read)."""
    from nlptrain.environments import detect

    try:
        found = detect()
        return found.rank, found.local_rank
    except (KeyError, ValueError, NlptrainError):  # (the error being reported, maybe)
        return 0, 0


def _drop_stdout() -> None:
    """Send what is left in stdout's buffer nowhere: the interpreter's flush at exit would
    raise the same error again, as a traceback."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file (a capture)
        pass


@contextlib.contextmanager
def resume_said(run_dir: Path) -> Iterator[None]:
    """A training stopped by a signal, or by the death of a DataLoader worker of its own (or one
    stuck), ends with the command that goes on from its last checkpoint."""
    try:
        yield
    except Interrupted as stop:
        raise Interrupted(stopped_message(stop.step, True, f"--resume --output-dir {run_dir}"),
                          stop.step) from None
    except RuntimeError as err:
        from nlptrain.distributed import peer_failure_in  # (torch: imported once training ran)

        stuck = dataloader_worker_stuck(err)
        if stuck:
            raise WorkerStuck(f"{stuck}: a DataLoader worker gave no batch in --timeout "
                              "seconds (its dataset waiting on a lock, a file or the network?); "
                              f"{_going_on(run_dir)}") from None
        died = dataloader_worker_death(err)
        if died is None or peer_failure_in(err) is not None:  # a worker ended as a peer's failure
            raise                                             # unwound this rank: that is said
        # The out-of-memory killer sends SIGKILL ("Killed"); an exit code is the worker's own end.
        # torch's other line ("pid(s) N exited unexpectedly") is one it found gone, cause unseen:
        # a SIGKILL too, in 2 of 5 kills measured.
        memory = " (the kernel's out-of-memory killer? dmesg names it)" if died.endswith("Killed.") \
            else " (how is not known here: the kernel's out-of-memory killer, if dmesg names it)" \
            if died.endswith("exited unexpectedly") else ""
        fewer = ", with fewer --num-workers (0 reads in this process)" if memory else ""
        raise WorkerDied(f"{died}{memory}; {_going_on(run_dir)}{fewer}") from None


def _going_on(run_dir: Path) -> str:
    """How a run its own DataLoader worker ended goes on: from its latest checkpoint; before the
    first, by running the command again (a new run's folder is then removed: no --resume)."""
    from nlptrain.checkpoint import list_checkpoints

    if list_checkpoints(run_dir / "checkpoints"):
        return f"what was saved before it is kept: train --resume --output-dir {run_dir}"
    return "no checkpoint was written before it: run the command again"
