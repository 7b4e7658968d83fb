"""Distributed plumbing the loop asks for: process group, collectives, rank-0 duties.

`Backend` is what the loop asks of its processes. `SingleProcess` is the backend of `Trainer`;
`Distributed` (a process group under any launcher that nlptrain/environments.py knows) is the
backend of `DistTrainer`. Both are a `Backend`, so the training loop never asks which one it has
and never tests `rank == 0` itself. Every collective here is called by every rank, in the same
order, from the same place in the loop. How the model is placed on them (DDP, FSDP2) is the
strategy's business: `nlptrain.strategies`; how the ranks find each other, `nlptrain.rendezvous`;
the CPU gradient sums, `cpu_gradient_sync` and `shared_memory`.
"""

from __future__ import annotations

import gc
import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Protocol

import torch
import torch.distributed as dist

from nlptrain import environments, rendezvous
from nlptrain.environments import Environment
from nlptrain.errors import RemoteRankError

log = logging.getLogger(__name__)
FAILED_TEARDOWN_S = 5.0  # how long a teardown after an error may take


def pick_device(local_rank: int = 0) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


class Backend(Protocol):
    """The processes a run trains on: who this one is, and the collectives, each called by every
    rank in the same order."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    environment: Environment

    @property
    def is_main(self) -> bool:
        """Rank 0: the one that prints, saves and exports."""
        return self.rank == 0

    def all_sum(self, values: list[float]) -> list[float]:
        """Sum a few host numbers over the ranks."""
        ...

    def all_sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum a small tensor over the ranks, on its device (no host sync)."""
        ...

    def agree_min(self, value: int) -> int:
        """The smallest of the ranks' values (e.g. the batches every rank can take)."""
        ...

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Every rank's rows, concatenated in rank order along dim 0 (lengths may differ)."""
        ...

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's (small, picklable) object, in rank order."""
        ...

    def broadcast_object(self, obj: Any, group: Any = None) -> Any:
        """Rank 0's (small, picklable) object, on every rank."""
        ...

    def barrier(self) -> None:
        """Wait until every rank is here."""
        ...

    def on_main(self, work: Callable[[], Any]) -> Any:
        """Run `work` on rank 0 alone while the others wait; all get its (small, picklable)
        result, and a failure there raises on every rank."""
        ...

    def close(self, failed: bool = False) -> None:
        """Release the processes' resources; after an error (`failed`), without waiting on peers."""
        ...


class SingleProcess(Backend):
    """One process, one device: every collective is the identity."""

    rank = 0
    local_rank = 0
    world_size = 1

    def __init__(self, device: torch.device | None = None,
                 environment: Environment | None = None) -> None:
        self.device = device or pick_device()
        self.environment = environment or environments.Local()

    def all_sum(self, values: list[float]) -> list[float]:
        return list(values)

    def all_sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def agree_min(self, value: int) -> int:
        return value

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor

    def gather_objects(self, obj: Any) -> list[Any]:
        return [obj]

    def broadcast_object(self, obj: Any, group: Any = None) -> Any:
        return obj

    def barrier(self) -> None:
        pass

    def on_main(self, work: Callable[[], Any]) -> Any:
        return work()

    def close(self, failed: bool = False) -> None:
        pass


MAIN_WORK_TIMEOUT_S = 3600.0  # the least the other ranks wait for rank 0's on_main work


class Distributed(Backend):
    """One process per device; rank, world and rendezvous come from the launcher's environment
    (torchrun, SLURM, Open MPI, `--nproc`: see nlptrain/environments.py)."""

    def __init__(self, timeout_s: float = 600.0, device: torch.device | None = None,
                 environment: Environment | None = None) -> None:
        self.environment = environment or environments.detect()
        self.rank = self.environment.rank
        self.world_size = self.environment.world_size
        self.local_rank = self.environment.local_rank
        self.device = device or pick_device(self.local_rank)
        self.owns_group = not dist.is_initialized()
        if self.owns_group:
            backend = "nccl" if self.device.type == "cuda" else "gloo"
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            rendezvous.join(self.environment, backend, timedelta(seconds=timeout_s))
        # A CPU group for objects and flags: cheap, and never blocks a GPU stream.
        self.cpu_group = dist.new_group(backend="gloo", timeout=timedelta(seconds=timeout_s)) \
            if self.device.type == "cuda" else None  # (new_group's own default: 30 minutes)
        # Rank 0's file work (a checkpoint, an export, plots) is bounded by the disk, not a hang:
        # the others wait for it in a group of their own, longer than a short collective timeout
        # meant to catch hangs.
        self.main_work_group = dist.new_group(backend="gloo", timeout=timedelta(
            seconds=max(timeout_s, MAIN_WORK_TIMEOUT_S)))

    def _flags(self, values: list[float], op: dist.ReduceOp) -> list[float]:
        tensor = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(tensor, op=op, group=self.cpu_group)
        return tensor.tolist()

    def all_sum(self, values: list[float]) -> list[float]:
        return self._flags(values, dist.ReduceOp.SUM)

    def all_sum_tensor(self, tensor: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(tensor)  # the default group: nccl on a GPU, where the tensor is
        return tensor

    def agree_min(self, value: int) -> int:
        return int(self._flags([value], dist.ReduceOp.MIN)[0])

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate every rank's tensor along dim 0; the ranks may hold different lengths,
        and a rank with none may not know the other dimensions (a 0-row block of any width)."""
        tensor = tensor.to(self.device).contiguous()
        shape = torch.tensor(tensor.shape, device=self.device)
        shapes = [torch.zeros_like(shape) for _ in range(self.world_size)]
        dist.all_gather(shapes, shape)
        lengths = [int(s[0]) for s in shapes]
        widest = torch.stack(shapes).amax(dim=0).tolist()  # the rows' shape, from ranks with rows
        padded = tensor.new_zeros(widest)
        padded[: tensor.shape[0]] = tensor.reshape(tensor.shape[0], *widest[1:])
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded)
        return torch.cat([p[:n] for p, n in zip(parts, lengths, strict=True)]).cpu()

    def gather_objects(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.cpu_group)
        return out

    def broadcast_object(self, obj: Any, group: Any = None) -> Any:
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=group or self.cpu_group)
        return box[0]

    def barrier(self) -> None:
        dist.barrier(group=self.cpu_group)

    def on_main(self, work: Callable[[], Any]) -> Any:
        result, error = None, None
        if self.is_main:
            try:
                result = work()
            except Exception as err:  # shared below, then raised on rank 0 as is
                error = err
        failure = None if error is None else f"{type(error).__name__}: {error}"
        try:
            failure, result = self.broadcast_object((failure, result), self.main_work_group)
        except RuntimeError as err:  # gloo's "closed by peer ... GLHF" alone would not say why
            if self.is_main and error is None:
                err.add_note("rank 0 had done its part of a collective call (an export, a "
                             "checkpoint, ...) and the other ranks did not join it: call it on "
                             "every rank, not under `if trainer.is_main` (rank 0 alone writes), "
                             "or see the other ranks' logs for their failure")
            raise
        if error is not None:
            raise error
        if failure is not None:
            raise RemoteRankError(f"rank 0 failed: {failure}")
        return result

    def close(self, failed: bool = False) -> None:
        """Tear the process group down, also after an error."""
        if not self.owns_group or not dist.is_initialized():
            return
        # gloo on CPU can hang at exit while DDP's reducer is freed against a gloo worker thread;
        # the trainer has dropped its DDP reference by now, and collecting first cures it.
        gc.collect()
        if not failed:
            dist.destroy_process_group()
            return
        # After an error a peer may sit in a collective that never completes, and a teardown
        # could wait on it. Give it a few seconds on the side: closing our sockets is what frees
        # the peers, and the process exit closes them in any case.
        teardown = threading.Thread(target=dist.destroy_process_group, daemon=True)
        teardown.start()
        teardown.join(FAILED_TEARDOWN_S)
        if teardown.is_alive():
            log.warning("process group teardown still waiting after %.0f s; exiting without it",
                        FAILED_TEARDOWN_S)


def timed_out(error: BaseException) -> bool:
    """Did a collective or the rendezvous give up waiting for another rank (stuck, or never
    started), rather than hear of its failure? gloo says "Timed out waiting 600000ms for recv"
    (or, from a collective in a DDP comm hook, "Application timeout caused pair closure"; from
    its mesh, waiting for a rank that never connects, "Connect timeout"), the
    store "Timed out after 601 seconds waiting for clients", "has timed out after" or, for a key
    never written, "wait timeout after 600000ms, keys: ..."."""
    text = str(error)
    if isinstance(error, RanksTimedOut):
        return True
    if "Application timeout caused pair closure" in text or "Connect timeout" in text:
        return True
    waited = "timed out" in text.lower() or "wait timeout after" in text
    return waited and (isinstance(error, dist.DistError) or "gloo" in text)


def timeout_message(error: BaseException, option: str = "--timeout (eval: --set train.timeout="
                    "SECONDS)") -> str | None:
    """The one line for a rank that gave up waiting (`timed_out`), else None; `option` is what
    sets the wait, as the user gave it."""
    if isinstance(error, RanksTimedOut):  # the command line's words, not the Python API's
        error = error.waited
    if not timed_out(error):
        return None
    return (f"no answer from the other rank(s) in time ({str(error).splitlines()[0][:200]}): one "
            "is stuck, or died or never started without a word (see the other ranks' logs); "
            f"{option} sets how long ranks wait for each other")


class RanksTimedOut(RuntimeError):
    """A collective of this rank gave up waiting for another (`waited`: the transport's error):
    said in one line, not as the transport's traceback."""

    def __init__(self, waited: BaseException) -> None:
        super().__init__(timeout_message(waited, "TrainConfig(timeout=SECONDS)"))
        self.waited = waited


def as_timeout(error: BaseException) -> RanksTimedOut | None:
    """`error` as a RanksTimedOut, where a collective gave up waiting (`timed_out`)."""
    if isinstance(error, RanksTimedOut) or not timed_out(error):
        return None
    return RanksTimedOut(error)


class PeerFailed(RuntimeError):
    """A collective of this rank failed because another rank ended, whose own error is reported
    there: said in one line (`as_peer_failure`), not as the transport's traceback."""


def peer_failure_in(error: BaseException | None) -> BaseException | None:
    """The error in `error`'s chain (itself, then what it was raised from or while handling)
    that says another rank ended, if any. An OSError (Python's ConnectionResetError) is not one:
    it is this process's own socket, to a DataLoader worker of its own that died; gloo's and the
    store's transports raise a DistError (a RuntimeError) that says "reset by peer"."""
    while error is not None:
        text = str(error)
        if isinstance(error, (PeerFailed, dist.DistError)) or not isinstance(error, OSError) and (
                "closed by peer" in text or "reset by peer" in text):
            return error
        error = error.__cause__ or error.__context__
    return None


def as_peer_failure(error: BaseException, rank: int, step: int) -> PeerFailed | None:
    """`error` as a PeerFailed, where it is another rank's failure seen here (not a timeout,
    which `timeout_message` says)."""
    peer = peer_failure_in(error)
    if isinstance(error, PeerFailed) or peer is None or timed_out(peer):
        return None
    return PeerFailed(f"another rank failed (see its error); rank {rank} stopped at step {step} "
                      f"({str(peer).splitlines()[0][:160]})")


def from_env(timeout_s: float = 600.0, environment: Environment | None = None) -> Backend:
    """`Distributed` when the launcher's environment (detected, unless given) has more than one
    rank, else `SingleProcess`."""
    environment = environment or environments.detect()
    environment.tie_to_launcher()
    if environment.world_size > 1:
        backend: Backend = Distributed(timeout_s, environment=environment)
    else:
        backend = SingleProcess(pick_device(environment.local_rank), environment)
    if backend.is_main:
        log.info("%s", environment.describe())
    return backend
