"""A sum all-reduce through shared memory, for ranks on one host (DDP on a CPU).

gloo moves every byte through loopback TCP sockets and a thread of its own: on 2 ranks x 1
thread its all-reduce of 11M float32 gradients took 26 ms (1.7 GB/s), while one copy of those
44 MB took 1.8 ms. Ranks on one host can instead map one file in /dev/shm. Each rank copies the
parts that the other ranks sum into its own slot; each sums its own part from its values and the
others' slots and publishes it; each copies the others' sums back. gloo barriers order the
phases (0.1 ms on idle cores, about 1 ms while the other cores compute). One rank sums each
element, so every rank gets the same values, added in rank order (((a + b) + c) ...) wherever
the element lies. On 2 ranks these equal gloo's to the bit (a + b); on more, gloo's ring adds in
an order that depends on the element's place in the bucket, so only that order can differ. A
mean (DDP's gradients) is divided after the sum, in the last copies: on 2 ranks (a + b) / 2 is
a / 2 + b / 2, DDP's order, to the bit (subnormals and overflow aside: a + b
can overflow where the halves do not, near float32's 3.4e38 or float16's 65504).

`attach` falls back (returns None) when any rank cannot map the file (another host, another
/dev/shm, no room), so a job that spans hosts keeps gloo. The file is unlinked as soon as every
rank has mapped it, or as soon as attaching fails: a crash leaves nothing behind. A process
killed in those seconds (SIGKILL) leaves its file, which the next run on the host removes.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from pathlib import Path

import torch
import torch.distributed as dist

from nlptrain.processes import alive

log = logging.getLogger(__name__)

SHM = Path("/dev/shm")
# A slot holds each of MiniLM's DDP buckets whole (0.7M, 7.1M and 14.9M floats, the last with
# the 47 MB embedding), and each chunk costs three barriers: 64 MiB slots made a 2-rank bf16
# step 158-161 ms against 167.5 with 16 MiB (bench/README.md).
BYTES_PER_RANK = 64 << 20
MOST_BYTES = 256 << 20  # smaller slots on many ranks
LEAST_BYTES = 1 << 20  # below this, gloo: the barriers would cost more than the copies save
PREFIX = "nlptrain-allreduce-"  # then the maker's pid and a random name
STALE_S = 600  # a file this old, its maker gone, is a killed run's


class SharedMemoryAllReduce:
    """Sums a tensor in place over the ranks of `group`, through one mapped file."""

    def __init__(self, slots: torch.Tensor, group: dist.ProcessGroup | None = None) -> None:
        self.slots = slots  # uint8 [world, bytes per rank]: one slot per rank
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    @classmethod
    def attach(cls, group: dist.ProcessGroup | None = None, bytes_per_rank: int = 0,
               directory: Path = SHM) -> SharedMemoryAllReduce | None:
        """Map one file for every rank of `group` (a collective); None, on every rank, where
        some rank cannot. `bytes_per_rank`: one slot's size, a multiple of 8 (0: what fits in
        `directory`, up to BYTES_PER_RANK)."""
        world = dist.get_world_size(group)
        made: list[tuple[str, int] | None] = [None]  # the file's name in `directory`, its slots
        if dist.get_rank(group) == 0:
            made[0] = _create(Path(directory), world, bytes_per_rank)
        try:
            dist.broadcast_object_list(made, group=group, group_src=0)
            path, bytes_per_rank = (Path(directory) / made[0][0], made[0][1]) if made[0] else (None, 0)
            size = world * bytes_per_rank
            slots = _map(path, size) if path else None
            mapped = torch.tensor([int(slots is not None)], dtype=torch.int32)
            dist.all_reduce(mapped, op=dist.ReduceOp.MIN, group=group)
            dist.barrier(group=group)  # every rank has tried: the name is no longer needed
        finally:  # also where a peer died meanwhile: the file would hold its memory until a reboot
            if made[0] and dist.get_rank(group) == 0:
                (Path(directory) / made[0][0]).unlink(missing_ok=True)
        if not mapped.item() or slots is None:
            log.debug("ddp: a rank could not map %s: gradients all-reduced by gloo", path)
            return None
        log.debug("ddp: gradients all-reduced through shared memory (%s, %d x %.1f MiB)",
                  directory, world, bytes_per_rank / 2**20)
        return cls(slots.view(world, bytes_per_rank), group)

    def __call__(self, tensor: torch.Tensor, mean: bool = False) -> None:
        """`dist.all_reduce(tensor)` (a sum), in chunks of one slot; `tensor` is contiguous.
        `mean`: then divided by the world size, as DDP averages gradients."""
        flat = tensor.view(-1)
        per_chunk = self.slots.shape[1] // flat.element_size()
        for start in range(0, flat.numel(), per_chunk):
            self._sum(flat[start:start + per_chunk], self.world if mean else 1)

    def _sum(self, part: torch.Tensor, divisor: int) -> None:
        slot = [s[:part.numel() * part.element_size()].view(part.dtype) for s in self.slots]
        share = -(-part.numel() // self.world)
        spans = [(k, k * share, min(part.numel(), (k + 1) * share)) for k in range(self.world)]
        others = [(k, a, b) for k, a, b in spans if k != self.rank and a < b]
        _, a, b = spans[self.rank]
        for _k, lo, hi in others:  # what the others sum, from this rank
            slot[self.rank][lo:hi].copy_(part[lo:hi])
        dist.barrier(group=self.group)
        if a < b:  # this rank's share, summed in rank order: an element's sum is the same
            # whichever rank sums it, so it does not depend on where DDP's buckets split the
            # gradients (its first step's layout, then the rebuilt one: a resume is exact)
            values = [part[a:b] if k == self.rank else slot[k][a:b] for k in range(self.world)]
            total = slot[self.rank][a:b]  # (no other rank reads this span of this slot yet)
            torch.add(values[0], values[1], out=total)
            for value in values[2:]:
                total.add_(value)
            _copy(total, part[a:b], divisor)
        dist.barrier(group=self.group)
        for k, lo, hi in others:  # the others' sums
            _copy(slot[k][lo:hi], part[lo:hi], divisor)
        # No rank may write its slot again (the next chunk or call) while one still reads it.
        dist.barrier(group=self.group)


def _copy(source: torch.Tensor, to: torch.Tensor, divisor: int) -> None:
    """`to = source / divisor`, the division in the copy's pass: a pass of its own over a bucket
    (DDP divides before the all-reduce) cost 14 ms of MiniLM's step where a core copies 6 GB/s.
    For a world size that is a power of 2 a sum halved equals the halves summed, to the bit
    (short of subnormals, and of a sum that overflows where its halves do not); for others
    only the rounding differs."""
    if divisor == 1:
        to.copy_(source)
    else:
        torch.div(source, divisor, out=to)


def slot_bytes(free: int, world: int) -> int:
    """The slot each of `world` ranks gets in a file system with `free` bytes: at most half of
    them in all (Docker gives /dev/shm 64 MiB), up to BYTES_PER_RANK; 0 below LEAST_BYTES."""
    fits = min(BYTES_PER_RANK, MOST_BYTES // world, free // 2 // world) >> 12 << 12  # whole pages
    return fits if fits >= LEAST_BYTES else 0


def _create(directory: Path, world: int, bytes_per_rank: int) -> tuple[str, int] | None:
    """A new file in `directory` of `world` slots, its pages reserved, and its slots' size
    (`bytes_per_rank`, or what fits); None where there is no room or no such directory."""
    path = directory / f"{PREFIX}{os.getpid()}-{uuid.uuid4().hex}"
    try:
        remove_stale_files(directory)
        room = os.statvfs(directory)
        free = room.f_bavail * room.f_frsize
        if bytes_per_rank and 2 * world * bytes_per_rank > free:  # leave the rest to others
            return None
        bytes_per_rank = bytes_per_rank or slot_bytes(free, world)
        if not bytes_per_rank:
            return None
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return None
    try:  # reserved now, so that a full /dev/shm is ENOSPC here, not SIGBUS mid-step
        os.posix_fallocate(fd, 0, world * bytes_per_rank)
        return path.name, bytes_per_rank
    except OSError as err:  # ENOSPC, or a file system without fallocate: no file at all
        log.debug("ddp: no shared memory for the all-reduce (%s)", err)
        path.unlink()
        return None
    finally:
        os.close(fd)


def remove_stale_files(directory: Path, now: float | None = None) -> None:
    """Remove what a run killed between making its file and every rank mapping it (a SIGKILL, a
    power loss of the process) left: files of ours older than STALE_S whose maker (the pid in
    the name) is gone. A live run's file lives for seconds, so no job in flight loses one."""
    now = time.time() if now is None else now
    for path in directory.glob(f"{PREFIX}*"):
        maker = path.name[len(PREFIX):].split("-")[0]  # an older nlptrain's name: no digits
        try:
            info = path.stat()
            running = maker.isdigit() and alive(int(maker))
            if info.st_uid != os.getuid() or now - info.st_mtime < STALE_S or running:
                continue
            path.unlink()
        except OSError:  # another run removed it first
            continue
        log.info("removed %s (%.0f MiB of shared memory), left by a run that was killed",
                 path, info.st_size / 2**20)


def _map(path: Path, size: int) -> torch.Tensor | None:
    try:
        if path.stat().st_size != size:  # not the file rank 0 made for this job
            return None
        return torch.from_file(str(path), shared=True, size=size, dtype=torch.uint8)
    except (OSError, RuntimeError):
        return None
