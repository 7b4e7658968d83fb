"""What memory the process has not touched yet costs: `torch.zeros` of 400 MB chunks, kept, up to
3.2 GB, then all freed and, after a pause, the same again.

A training run's first step is the first to touch the optimizer state, DDP's buckets and the
longest batch's activations; the kernel zeroes each new page. On a bare machine that costs
about the same for any page. In a VM whose host takes back the pages the guest frees (free page
reporting, a balloon), a page the guest has not used lately costs several times more: the
bench's 2-rank first step then spends most of its time in the kernel (`bench/run.py` prints
each contender's first step, its kernel seconds and page faults).

    python bench/page_zeroing.py [--chunks 8] [--mb 400] [--pause 20]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402


def fill(chunks: int, mb: int) -> list[tuple[float, float, float]]:
    """(ms per MB, kernel ms per MB, ms per MB zeroing it again) of each chunk, all kept until
    the end: the last is the cost of memory the process already holds."""
    kept, found = [], []
    for _ in range(chunks):
        before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        kept.append(torch.zeros(mb << 18, dtype=torch.float32))  # mb MiB of float32
        seconds, after = time.perf_counter() - start, resource.getrusage(resource.RUSAGE_SELF)
        found.append((1000 * seconds / mb, 1000 * (after.ru_stime - before.ru_stime) / mb))
    for i, chunk in enumerate(kept):
        start = time.perf_counter()
        chunk.zero_()
        found[i] += (1000 * (time.perf_counter() - start) / mb,)
    return found


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--chunks", type=int, default=8)
    p.add_argument("--mb", type=int, default=400, help="MiB per chunk")
    p.add_argument("--pause", type=float, default=20, help="seconds between the two passes")
    args = p.parse_args()
    torch.set_num_threads(1)
    first = fill(args.chunks, args.mb)  # freed on return
    time.sleep(args.pause)
    again = fill(args.chunks, args.mb)
    print(f"{common.cpu_model()}, 1 thread, torch {torch.__version__}: torch.zeros of "
          f"{args.mb} MiB chunks, kept; the second pass {args.pause:g} s after the first freed all")
    print("| chunk | GB held | new: ms/MB | of it kernel | held: ms/MB | 2nd pass new | "
          "of it kernel | held |")
    print("|---|---|---|---|---|---|---|---|")
    for i, (a, b) in enumerate(zip(first, again, strict=True)):
        print(f"| {i + 1} | {(i + 1) * args.mb / 1024:.1f} | " +
              " | ".join(f"{x:.2f}" for x in (*a, *b)) + " |")
    new = [x[0] for x in first + again]
    held = statistics.median(x[2] for x in first + again)
    print(f"new pages: {min(new):.2f}-{max(new):.2f} ms/MB, {min(new) / held:.1f}-"
          f"{max(new) / held:.1f}x zeroing memory already held ({held:.2f} ms/MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
