"""Value types of command-line options that argparse checks itself (its usage line names the
option, exit code 2): counts and durations that must be positive."""

from __future__ import annotations

import argparse
import math


def positive_int(text: str) -> int:
    """A whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number >= 1")
    return value


def positive_seconds(text: str) -> float:
    """A number of seconds > 0 (a wait of 0 or less fails at once, or never ends)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds > 0")
    return value
