"""CPU training keeps freed memory for the next step's buffers (`nlptrain.host_memory`)."""

from __future__ import annotations

import subprocess
import sys

import pytest

FAULTS = """
import resource, sys, torch
from nlptrain.host_memory import keep_freed_memory

def faults_of_steps() -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(10):  # a step's large buffer (MiniLM's word-embedding gradient), made and freed
        torch.zeros(30522, 384).sum()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

released = faults_of_steps()
kept = keep_freed_memory()
faults_of_steps()  # the first one after the change still takes its pages from the system
print(released, kept, faults_of_steps())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_buffers_are_reused_without_page_faults():
    out = subprocess.run([sys.executable, "-c", FAULTS], capture_output=True, text=True,
                         check=True).stdout.split()
    released, kept, reused = int(out[0]), out[1], int(out[2])
    assert kept == "True"
    # 10 x 47 MB: ~115,000 pages of 4 KiB faulted in again when each buffer goes back to the
    # system; kept in the heap, next to none.
    assert released > 50_000
    assert reused < released / 50, (released, reused)
