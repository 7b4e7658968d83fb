"""A training DataLoader's workers stuck for good (a dataset waiting on a lock, a file or the
network): the loader's timeout stops the rank, and the workers, which ignore SIGTERM (a Ctrl-C is
the main process's to handle: `signals.leave_stops_to_the_main_process`), are killed so that the
process can exit."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

from nlptrain.errors import dataloader_worker_stuck


def worker_timeout(num_workers: int, timeout: int) -> int:
    """The DataLoader's `timeout`: as long as ranks wait for each other. None without workers,
    and none off the main thread: there torch has no SIGCHLD watch, and a timeout replaces the
    5 s poll that finds a dead worker with one wait of the whole timeout."""
    return timeout if num_workers > 0 and threading.current_thread() is threading.main_thread() else 0


def stuck_workers_ended(batches: Iterator) -> Iterator:
    """A loader's batches; where its torch iterator has worker processes, read so that if one
    gave no batch in the loader's timeout, they are killed before torch's error goes on (a stuck
    one outlived torch's shutdown, and the process hung at exit, where multiprocessing joins its
    children). Without workers (or `batches` another iterator) it is `batches` itself: nothing
    is added to the loop."""
    return _killing_stuck_workers(batches) if hasattr(batches, "_workers") else batches


def _killing_stuck_workers(batches: Iterator) -> Iterator:
    try:
        yield from batches
    except RuntimeError as err:
        if dataloader_worker_stuck(err):
            kill_workers(batches)
        raise


class PassesEndingStuckWorkers:
    """`loader`, each pass read through `stuck_workers_ended` (where `repeat_forever` starts
    pass after pass, the torch iterator that holds the workers is each pass's own)."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator:
        return stuck_workers_ended(iter(self.loader))


def kill_workers(batches: Iterator) -> None:
    """SIGKILL the worker processes of torch's loader iterator `batches`, first taken off the
    list its SIGCHLD handler watches (which raises "killed by signal" for a watched worker's
    death). torch has no public call for either; without these attributes, nothing is done."""
    from torch.utils.data._utils import signal_handling

    workers = getattr(batches, "_workers", None)
    if workers is None or not hasattr(batches, "_worker_pids_set"):  # (torch changed them)
        return
    if batches._worker_pids_set:
        signal_handling._remove_worker_pids(id(batches))
        batches._worker_pids_set = False
    for worker in workers:
        worker.kill()
