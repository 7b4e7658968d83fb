"""What nlptrain logs inside a block: its logger stops propagating once a command has set up
logging in this process, so pytest's caplog (on the root logger) can miss it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def nlptrain_messages(level: int = logging.INFO) -> Iterator[list[str]]:
    messages: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: messages.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("nlptrain")
    logger.addHandler(handler)
    previous = logger.level
    logger.setLevel(level)
    try:
        yield messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(previous)
