"""Log lines (nlptrain/logs.py): each is one write, so the lines of ranks that share a stderr
never cut into each other."""

from __future__ import annotations

import logging

from nlptrain.logs import setup_logging


class Writes:
    """A stream that keeps every write it is given."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        if text:
            self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_each_log_line_and_its_newline_are_one_write(monkeypatch):
    stream = Writes()
    monkeypatch.setattr("sys.stderr", stream)
    loggers = [logging.getLogger(name) for name in ("nlptrain", "py.warnings")]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in loggers]
    try:
        setup_logging(rank=1, level="warning")
        loggers[0].warning("ddp: a rank could not map the file")
        logging.getLogger("nlptrain.strategies").warning("second")
    finally:
        for logger, (handlers, level, propagate) in zip(loggers, saved, strict=True):
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
    assert stream.writes == ["[rank 1] WARNING nlptrain: ddp: a rank could not map the file\n",
                             "[rank 1] WARNING nlptrain.strategies: second\n"]


def test_other_loggers_lines_carry_the_rank_and_a_callback_files_name(monkeypatch):
    """A library's or a user's module's warnings came through the root's last-resort handler,
    without the rank; a --callback file's under the module name made for it."""
    from nlptrain.logs import heed_log_level

    stream = Writes()
    monkeypatch.setattr("sys.stderr", stream)
    touched = [logging.getLogger(name) for name in ("nlptrain", "py.warnings", "", "cb_0f")]
    saved = [(logger.handlers[:], logger.level, logger.propagate) for logger in touched]
    try:
        setup_logging(rank=1, level="warning")
        heed_log_level("cb_0f", "talk.py")
        logging.getLogger("somelib").warning("a library's warning")
        logging.getLogger("somelib").info("a library's info: not shown")
        logging.getLogger("cb_0f").warning("the callback's")
        logging.getLogger("py.warnings").warning("x.py:8: UserWarning: y\n  warn('y')\n")
    finally:
        for logger, (handlers, level, propagate) in zip(touched, saved, strict=True):
            logger.handlers[:], logger.level, logger.propagate = handlers, level, propagate
    assert stream.writes == ["[rank 1] WARNING somelib: a library's warning\n",
                             "[rank 1] WARNING talk.py: the callback's\n",
                             # (a captured warning ends with a newline: no blank line after it)
                             "[rank 1] WARNING py.warnings: x.py:8: UserWarning: y\n  warn('y')\n"]
