"""Logging: rank 0 speaks; other ranks are quiet but for warnings, which carry their rank."""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

LEVELS = ("debug", "info", "warning", "error")

# Warnings a user of nlptrain cannot act on.
_NOISE = (
    r".*TypedStorage is deprecated.*",
    r".*torch\.utils\._pytree.*",
    r".*No device id is provided via `init_process_group`.*",
)


class _TqdmHandler(logging.StreamHandler):
    """Writes through tqdm, so log lines do not break a progress bar. A line and its newline go
    in one write: ranks share the launcher's stderr, and tqdm's own two writes let another
    rank's line in between (`...64.0 MiB)ddp: gradients...`)."""

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record) + "\n", file=self.stream, end="")
        except Exception:  # logging must never raise
            self.handleError(record)


class _Formatter(logging.Formatter):
    """Rank 0's lines as they are, but a warning or an error says so ("warning: ..."), as the
    CLI's own "error: ..." lines do: else it reads as one more line of progress. Other ranks'
    carry their rank and logger. No trailing newline: a captured warning ends with one, and
    came with a blank line after it."""

    def __init__(self, rank: int) -> None:
        super().__init__("%(message)s" if rank == 0 else
                         f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
        self.rank = rank

    def format(self, record: logging.LogRecord) -> str:
        if record.name in _SHOWN_AS:  # (a copy: other handlers see the record as it was)
            record = logging.makeLogRecord({**record.__dict__, "name": _SHOWN_AS[record.name]})
        text = super().format(record).rstrip("\n")
        marked = self.rank == 0 and record.levelno >= logging.WARNING
        return f"{record.levelname.lower()}: {text}" if marked else text


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """`--log-level`, one of LEVELS (any case): a typo is argparse's one-line usage error."""
    parser.add_argument("--log-level", default="info", type=str.lower, choices=LEVELS,
                        metavar="LEVEL", help=f"{' | '.join(LEVELS)} (default: info; ranks > 0 "
                        "show warnings only)")


def setup_logging(rank: int = 0, level: str = "info") -> None:
    number = getattr(logging, level.upper(), None)
    if not isinstance(number, int):
        raise ValueError(f"unknown log level {level!r}")
    if rank != 0 and number > logging.DEBUG:
        number = logging.WARNING  # other ranks: warnings and errors only, unless debugging
    handler = _TqdmHandler(sys.stderr)
    handler.setFormatter(_Formatter(rank))
    for name in ("nlptrain", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(number)
        logger.propagate = False
    # Any other logger's lines (a library's warnings, a user's callback module's) the same way,
    # with their rank; at the root's own level (warnings), but for the callbacks' (heed_log_level).
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _TqdmHandler)] + [handler]
    logging.captureWarnings(True)  # warnings of every rank reach the log, with the rank
    for pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern)


_SHOWN_AS: dict[str, str] = {}  # logger name -> the name its lines show (a callback file's)


def heed_log_level(module: str, shown_as: str = "") -> None:
    """A user's callback module logs (`logging.getLogger(__name__)`) at nlptrain's level: its
    info lines show with --log-level info, on rank 0, as nlptrain's own do; `shown_as`: the
    name its lines carry (a --callback file's, for the module name made for it)."""
    if shown_as:
        _SHOWN_AS[module] = shown_as
    logger = logging.getLogger(module)
    if logger.level == logging.NOTSET:  # (a level the module set for itself stays)
        logger.setLevel(logging.getLogger("nlptrain").getEffectiveLevel())
