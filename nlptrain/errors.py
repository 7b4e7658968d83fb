"""Errors a user can act on. The CLI prints their message alone (no traceback) and exits non-zero."""


class NlptrainError(Exception):
    """Base class: something the user can fix (bad input, bad option, missing file)."""

    exit_code = 1
    raised_on_every_rank = False  # True: every rank raises it together; rank 0 alone reports it
    raised_on_every_local_rank = False  # every rank of a machine (its disk): local rank 0 reports


def every_rank(error: NlptrainError) -> NlptrainError:
    """Mark `error` as raised alike by every rank (from agreed or shared facts): said once."""
    error.raised_on_every_rank = True
    return error


def every_local_rank(error: NlptrainError) -> NlptrainError:
    """Mark `error` as raised alike by every rank of a machine (from its files and the options:
    a model folder, a max_length): said once a machine. Not every rank: another machine's copy
    of a folder may differ, and an error marked so would be said by no one."""
    error.raised_on_every_local_rank = True
    return error


class ConfigError(NlptrainError):
    """A task file or an option is wrong."""


class DataError(NlptrainError):
    """A data file is missing, empty or malformed; the message names the file and line."""


class CheckpointError(NlptrainError):
    """A checkpoint is missing, incomplete, unsafe, or from another model or task."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint or model folder cannot be written (a full disk, a read-only folder); the
    checkpoints written before it are kept."""


class OutOfSpace(NlptrainError):
    """A run's file cannot be written for want of space; nothing trained is lost."""


class TrainingError(NlptrainError):
    """Training cannot go on (e.g. the loss became NaN); the message names the step. All ranks
    agree on it before raising it."""

    raised_on_every_rank = True


class RemoteRankError(NlptrainError):
    """Another rank failed; the failing rank reports the cause, this one stops quietly."""


class Interrupted(NlptrainError):
    """SIGTERM/SIGINT: every rank stopped after the same step (a Checkpointer, as the CLI's
    runs have, then writes a checkpoint to resume from)."""

    exit_code = 130
    raised_on_every_rank = True

    def __init__(self, message: str, step: int = 0) -> None:
        super().__init__(message)
        self.step = step  # the last step done


class WorkerDied(NlptrainError):
    """A DataLoader worker of this process was killed (the kernel's out-of-memory killer, most
    often); the checkpoints written before it are kept."""


class WorkerStuck(NlptrainError):
    """A DataLoader worker of this process gave no batch in `[train] timeout` seconds; the
    checkpoints written before it are kept."""


def dataloader_worker_stuck(error: BaseException) -> str | None:
    """torch's line where a DataLoader worker gave no batch in the loader's `timeout`."""
    text = str(error).strip()
    return text.splitlines()[0] if isinstance(error, RuntimeError) and \
        text.startswith("DataLoader timed out after") else None


def dataloader_worker_death(error: BaseException | None) -> str | None:
    """torch's line for a DataLoader worker's death in `error`'s chain, if any. torch raises it
    from its SIGCHLD handler in whatever the main process was doing then (a step, a checkpoint
    write, a read from the worker's socket), so it must not be taken for that work's failure."""
    while error is not None:
        text = str(error)
        if isinstance(error, RuntimeError) and "DataLoader worker (pid" in text and \
                ("killed by signal" in text or "exited unexpectedly" in text):
            return text.strip().splitlines()[0]
        # As Python prints the chain: a context raised `from None` is not a cause.
        error = error.__cause__ or (None if error.__suppress_context__ else error.__context__)
    return None
