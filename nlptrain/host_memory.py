"""CPU training: keep freed memory in the process, so the step's large buffers reuse it.

glibc serves allocations above its mmap threshold (128 KiB, rising at most to 32 MiB) with
fresh pages from the kernel and hands them back on free. A step frees and allocates the same
large buffers every time (MiniLM's 47 MB word-embedding gradient, the activations), so each
step faulted in ~20,000 zeroed pages again: on this project's CPU machines, 10-20% of a bf16
step (bench/README.md). Raising the mmap and trim thresholds keeps those pages in the heap for
the next step. Peak memory is the same (the buffers exist at once anyway); what changes is that
the process keeps its peak until it exits. Only glibc (Linux) has `mallopt`; elsewhere nothing
is done.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP_BELOW = 1 << 30  # allocations up to 1 GiB come from the heap and stay there once freed

_kept = False


def keep_freed_memory() -> bool:
    """Tell glibc to keep freed memory for reuse (once per process); whether it took."""
    global _kept
    if _kept:
        return True
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (macOS, musl): its own allocator decides
        return False
    _kept = bool(mallopt(M_MMAP_THRESHOLD, KEEP_BELOW)) and bool(mallopt(M_TRIM_THRESHOLD, KEEP_BELOW))
    if _kept:
        log.debug("host memory: freed buffers up to 1 GiB are kept for reuse (glibc mallopt)")
    return _kept
