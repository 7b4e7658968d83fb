"""Other processes of the launch: whether one is still there, and ending with one's parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when its parent ends


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts: it is there)."""
    try:
        os.kill(pid, 0)  # no signal sent: only whether the process is there
    except (ProcessLookupError, OverflowError):  # (OverflowError: no pid is that large)
        return False
    except PermissionError:
        return True
    return True


def end_with_parent(sig: int = signal.SIGTERM) -> None:
    """Have the kernel send this process `sig` when its parent ends (Linux; elsewhere nothing)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
