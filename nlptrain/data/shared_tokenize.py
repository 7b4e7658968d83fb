"""Tokenizing one set on all the ranks of a machine at once, into one token-cache entry.

Rank 0 alone used to read and tokenize while the other ranks waited inside a collective, which
`--timeout` bounds: a set of millions of rows timed out on them, and their CPUs idled. Now every
rank of a machine reads the rows (the cheap part), tokenizes its share of them (the costly part)
into a part folder, and the machine's first rank joins the parts by offsets into the cache entry
that every rank then maps. The ranks wait for each other through files in the cache folder,
polled with a progress line and no deadline of their own (a launcher ends a job whose rank died),
never inside a collective. A rank that fails leaves its error there, and the others raise it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nlptrain.data.tokenized import TokenizedDataset, cache_error, cached, entry_exists, write_entry
from nlptrain.distributed import Backend
from nlptrain.errors import DataError, RemoteRankError, every_local_rank

log = logging.getLogger(__name__)
POLL_S = 0.05
REPORT_EVERY_S = 10.0
STALE_PARTS_S = 24 * 3600.0
SHARE_MIN_BYTES = 1 << 20  # smaller files: one rank tokenizes them (a few tenths of a second)
# What the readers give back: (rows, cache meta, tokenize(begin, end) -> those rows tokenized).
Read = Callable[[], tuple[int, dict, Callable[[int, int], TokenizedDataset]]]


@dataclass(frozen=True)
class Share:
    """This rank's part in tokenizing a set with the other ranks of its machine."""

    index: int = 0  # this rank's place among the ranks of its machine
    count: int = 1  # ranks on this machine (they share its cache folder)
    tag: str = ""   # the same on those ranks; unique to this run and machine
    rank: int = 0   # this rank in the job (for messages)

    @classmethod
    def agree(cls, dist: Backend) -> Share:
        """Which ranks share a machine, from one small collective that every rank reaches at
        once (before any long work)."""
        seen = dist.gather_objects((socket.gethostname(), uuid.uuid4().hex))
        mates = [rank for rank, (host, _) in enumerate(seen) if host == seen[dist.rank][0]]
        return cls(mates.index(dist.rank), len(mates), f"{seen[0][1][:12]}-{mates[0]}", dist.rank)

    def rows(self, total: int) -> tuple[int, int]:
        """[begin, end) of this rank's rows out of `total`."""
        return total * self.index // self.count, total * (self.index + 1) // self.count


ALONE = Share()  # one rank builds the entry by itself


def cached_shared(folder: Path, read: Read, what: str, share: Share,
                  source_bytes: int = 0) -> tuple[TokenizedDataset, dict]:
    """The cache entry in `folder`, built by the ranks of `share` together when it is missing.
    Files under `SHARE_MIN_BYTES` (`source_bytes` in all) are tokenized by the first rank alone:
    splitting them costs more than it saves, and the others wait for it without reading."""
    if share.count == 1 or entry_exists(folder):
        return cached(folder, lambda: _whole(read), what)
    parts = folder.parent / f".parts-{folder.name}-{share.tag}"
    if share.index == 0:
        _remove_stale_parts(folder.parent)
    try:
        parts.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # on every rank of this machine: said once
        raise every_local_rank(cache_error(folder, "cannot be written", err)) from None
    try:
        if source_bytes < SHARE_MIN_BYTES:
            if share.index == 0:
                cached(folder, lambda: _whole(read), what)
        else:
            _tokenize_share(folder, parts, read, what, share)
    except BaseException as err:
        _leave_for_the_others(parts / f"error-{share.rank}", f"{type(err).__name__}: {err}")
        raise
    if share.index == 0:
        shutil.rmtree(parts, ignore_errors=True)
    else:
        _wait(lambda: (folder / "meta.json").is_file(), parts, what, "rank 0 to write the entry")
    return TokenizedDataset.load(folder), json.loads((folder / "meta.json").read_text())


def _whole(read: Read) -> tuple[TokenizedDataset, dict]:
    rows, meta, tokenize = read()
    dataset = tokenize(0, rows)
    return dataset, {**meta, "truncated": dataset.truncated}


def _tokenize_share(folder: Path, parts: Path, read: Read, what: str, share: Share) -> None:
    """Tokenize this rank's share into `parts`; the first rank then joins every share."""
    start = time.perf_counter()
    try:
        rows, meta, tokenize = read()
    except DataError as err:  # the same bytes on every rank (they are in the cache key):
        err.raised_on_every_rank = True  # every rank fails alike; rank 0 reports it
        raise
    begin, end = share.rows(rows)
    if share.index == 0:
        log.info("%s: %d rows, tokenized by the %d ranks of this machine (%d rows each)",
                 what, rows, share.count, end - begin)
    part = tokenize(begin, end)
    try:
        _write_part(parts / f"part-{share.index}", part)
    except OSError as err:  # a full disk, most often (numpy's short write says no errno)
        raise cache_error(folder, "cannot be written", err) from None
    if share.index != 0:
        return
    count = share.count
    _wait(lambda: _parts_done(parts, count) == count or (folder / "meta.json").is_file(),
          parts, what, "the other ranks' shares", lambda: f"{_parts_done(parts, count)} of {count}")
    if not (folder / "meta.json").is_file():  # else another job wrote it first
        whole = _join(parts, count)
        write_entry(folder, whole, {**meta, "truncated": whole.truncated})
    log.info("%s: %d rows read and tokenized on %d ranks in %.2f s, cached in %s", what, rows,
             count, time.perf_counter() - start, folder)


def _remove_stale_parts(cache: Path) -> None:
    """Part folders that a failed run left (runs never reuse them: each has its own tag)."""
    for stale in cache.glob(".parts-*"):
        if time.time() - stale.stat().st_mtime > STALE_PARTS_S:
            shutil.rmtree(stale, ignore_errors=True)


def _write_part(folder: Path, part: TokenizedDataset) -> None:
    """A part appears whole (renamed into place); no fsync: after a crash it is never read."""
    staging = folder.parent / f".tmp-{folder.name}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    part.save(staging)
    (staging / "truncated").write_text(str(part.truncated))
    os.replace(staging, folder)


def _leave_for_the_others(error_file: Path, said: str) -> None:
    """This rank's error, where the ranks waiting for its part raise it instead of waiting. On a
    full disk the file is still made (an inode, no block); what it says may be cut short."""
    if not error_file.parent.is_dir():
        return
    with contextlib.suppress(OSError), open(error_file, "w") as handle:
        handle.write(said)


def _parts_done(parts: Path, count: int) -> int:
    return sum((parts / f"part-{i}").is_dir() for i in range(count))


def _wait(ready: Callable[[], bool], parts: Path, what: str, for_what: str,
          status: Callable[[], str] | None = None) -> None:
    """Poll `ready` until true, raising another rank's error if one appears; a line every 10 s."""
    start = last = time.perf_counter()
    while not ready():
        errors = sorted(parts.glob("error-*")) if parts.is_dir() else []
        if errors:
            rank = errors[0].name.split("-")[1]
            raise RemoteRankError(f"rank {rank} failed: while preparing the {what} set: "
                                  f"{errors[0].read_text()}")
        now = time.perf_counter()
        if now - last >= REPORT_EVERY_S:
            done = f" ({status()} done)" if status else ""
            log.info("%s: waiting for %s%s, %.0f s", what, for_what, done, now - start)
            last = now
        time.sleep(POLL_S)


def _join(parts: Path, count: int) -> TokenizedDataset:
    """The parts back to back: ids, type ids and labels concatenated, offsets shifted."""
    pieces = [TokenizedDataset.load(parts / f"part-{i}") for i in range(count)]
    offsets, base = [np.zeros(1, dtype=np.int64)], 0
    for piece in pieces:
        offsets.append(np.asarray(piece.offsets[1:]) + base)
        base += int(piece.offsets[-1])
    typed = pieces[0].type_ids is not None
    whole = TokenizedDataset(
        np.concatenate([p.ids for p in pieces]), np.concatenate(offsets),
        np.concatenate([p.labels for p in pieces]),
        type_ids=np.concatenate([p.type_ids for p in pieces]) if typed else None)
    whole.truncated = sum(int((parts / f"part-{i}" / "truncated").read_text()) for i in range(count))
    return whole
