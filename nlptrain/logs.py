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


class _MarkedFormatter(logging.Formatter):
    """Rank 0's lines as they are, but a warning or an error says so ("warning: ..."), as the
    CLI's own "error: ..." lines do: else it reads as one more line of progress."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        return f"{record.levelname.lower()}: {text}" if record.levelno >= logging.WARNING else text


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
    prefix = "" if rank == 0 else f"[rank {rank}] "
    handler = _TqdmHandler(sys.stderr)
    handler.setFormatter(_MarkedFormatter("%(message)s") if rank == 0 else
                         logging.Formatter(prefix + "%(levelname)s %(name)s: %(message)s"))
    for name in ("nlptrain", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(number)
        logger.propagate = False
    logging.captureWarnings(True)  # warnings of every rank reach the log, with the rank
    for pattern in _NOISE:
        warnings.filterwarnings("ignore", message=pattern)
