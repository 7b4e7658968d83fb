"""Run a function on N real processes joined by a gloo process group on loopback (no mocks).

The processes are started by `nlptrain.launch` (torch's elastic agent, as torchrun): its c10d
rendezvous binds a free port itself, so parallel test runs never race for one.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import signal
import sys
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from nlptrain.environments import detect
from nlptrain.launch import launch


def _as_a_new_process() -> None:
    """A forked worker starts with the test process's state; give it back what a new process
    has: logs and warnings on its own stderr (not in pytest's capture of the test, closed by
    now), and the default signal actions (not the agent's handlers, which raise)."""
    for name in ("", "nlptrain", "py.warnings"):
        logger = logging.getLogger(name)
        logger.handlers.clear()
        logger.propagate = True
    logging.captureWarnings(False)
    warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
        sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)


def _entry(fn: Callable, args: tuple) -> Any:
    _as_a_new_process()
    os.environ.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    here = detect()
    return fn(here.rank, here.world_size, *args)


def start_method() -> str:
    """fork: a worker starts with the test process's imports (torch, transformers: ~8 s a
    worker under spawn); spawn once CUDA is initialized here, which a fork cannot inherit."""
    return "spawn" if torch.cuda.is_initialized() else "fork"


def run_ranks(fn: Callable, world_size: int, out: Path, *args: Any, timeout: float = 180) -> list:
    """fn(rank, world_size, *args) on each rank; returns every rank's return value.
    (`out` is where fn's callers keep their files; the results come back through the launcher.)"""
    timed_out = threading.Event()

    def stop_workers() -> None:  # the launcher has no deadline of its own
        timed_out.set()
        for worker in multiprocessing.active_children():
            worker.kill()

    watchdog = threading.Timer(timeout, stop_workers)
    watchdog.start()
    try:
        return launch(_entry, world_size, fn, args, start_method=start_method())
    except ChildFailedError:
        if timed_out.is_set():
            raise TimeoutError(f"{world_size} ranks did not finish in {timeout} s") from None
        raise
    finally:
        watchdog.cancel()


def report_place(restart_failure: bool) -> tuple[int, int, int]:
    """A worker of `launch` (here, not in a test module: a spawned worker imports its module)."""
    here = detect()
    if restart_failure and here.rank == 1 and here.restart_count == 0:
        raise RuntimeError("rank 1 fails on the first attempt")
    return here.rank, here.world_size, here.restart_count
