"""Run a function on N real processes joined by a gloo process group on loopback (no mocks).

The processes are started by `nlptrain.launch` (torch's elastic agent, as torchrun): its c10d
rendezvous binds a free port itself, so parallel test runs never race for one.
"""

from __future__ import annotations

import faulthandler
import multiprocessing
import os
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

from nlptrain.environments import detect
from nlptrain.launch import launch


def _entry(fn: Callable, args: tuple) -> Any:
    # A crash in C++ prints every thread's Python stack, and so does a rank the agent terminates
    # because another failed or the watchdog fired: a hang or a segfault says where it was.
    faulthandler.enable(all_threads=True)
    faulthandler.register(signal.SIGTERM, all_threads=True, chain=True)
    os.environ.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    here = detect()
    return fn(here.rank, here.world_size, *args)


# The modules every worker needs, imported once by the fork server rather than by each worker.
FORKSERVER_PRELOAD = ["torch", "torch.distributed", "transformers", "nlptrain", "nlptrain.trainer"]


def start_method() -> str:
    """forkserver: each worker is forked from a single-threaded server that has imported torch
    and transformers once (a spawned worker spends ~8 s importing them). Never a fork of the test
    process: the elastic agent's store serves the first workers from a thread of this process
    while the next ones are forked, and a child forked while that thread holds a lock can hang
    or crash (measured: ~1 in 10 launches of 8 ranks hung connecting to the store)."""
    multiprocessing.set_forkserver_preload(FORKSERVER_PRELOAD)
    return "forkserver"


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


def own_group_worker(rank: int, world_size: int, model_dir: Path, out: Path, results: Any) -> None:
    """An `mp.spawn` worker that makes its own process group (no launcher's variables), then a
    DistTrainer: it trains as rank `rank` of `world_size`, and the group stays its own."""
    import torch.distributed as dist
    from toy_trainer import toy_datasets

    from nlptrain import DistTrainer
    from nlptrain.models import load_model

    os.environ.update({"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    (out / f"rank{rank}").mkdir()
    train, test = toy_datasets(out / f"rank{rank}", model_dir)  # the same rows on each rank
    trainer = DistTrainer(load_model(str(model_dir), ["neg", "pos"]), train, test,
                          config={"epochs": 1, "batch_size": 4}, progress=False)
    trainer.fit()
    trainer.close()
    results.put((rank, trainer.dist.world_size, trainer.global_step, dist.is_initialized()))
    dist.destroy_process_group()
