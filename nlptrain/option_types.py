"""Value types of command-line options that argparse checks itself (its usage line names the
option, exit code 2): counts and durations that must be positive, probabilities."""

from __future__ import annotations

import argparse
import math

# The longest wait torch's collectives take: milliseconds in a C int (2**31 ms, ~24.8 days).
MAX_WAIT_S = 2_000_000


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def probability(text: str) -> float:
    """A number strictly between 0 and 1 (a threshold: 0 would predict every label, 1 none)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a probability strictly between 0 and 1")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds > 0 (a wait of 0 or less fails at once, or never ends), at most
    MAX_WAIT_S (more overflowed inside torch: a traceback)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and 0 < value <= MAX_WAIT_S):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0 and <= "
                                         f"{MAX_WAIT_S:,} (~23 days)")
    return value
