"""Run a function on N real processes joined by a gloo process group on loopback (no mocks)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from conftest import free_port


def _entry(rank: int, fn: Callable, world_size: int, port: int, out: str, args: tuple) -> None:
    os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
                       "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                       "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
    torch.set_num_threads(1)
    result = fn(rank, world_size, *args)
    torch.save(result, Path(out) / f"rank{rank}.pt")


def run_ranks(fn: Callable, world_size: int, out: Path, *args: Any, timeout: float = 180) -> list:
    """fn(rank, world_size, *args) on each rank; returns every rank's return value."""
    context = mp.start_processes(_entry, args=(fn, world_size, free_port(), str(out), args),
                                 nprocs=world_size, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            raise TimeoutError(f"{world_size} ranks did not finish in {timeout} s")
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
