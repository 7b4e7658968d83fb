"""Every generator's state (Python's, NumPy's, torch's on every device): seeded at the start,
taken at each optimizer step and epoch (a stop undoes a step; a resume or a swap of the data
replays an epoch's order), and written into checkpoints."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    """Python's, NumPy's and torch's generators (every device's) from `seed`."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def rng_state() -> dict[str, Any]:
    """Every generator's state: taken at each optimizer step (StepWindow), so kept cheap
    (numpy's `get_state` costs ~35 us a call: called once)."""
    _, numpy_keys, numpy_pos, *_ = np.random.get_state()
    state = {"torch": torch.get_rng_state(), "python": random.getstate(),
             "numpy": torch.from_numpy(numpy_keys.astype(np.int64)), "numpy_pos": int(numpy_pos)}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    np.random.set_state(("MT19937", state["numpy"].numpy().astype(np.uint32), state["numpy_pos"]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
