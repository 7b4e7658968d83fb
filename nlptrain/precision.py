"""`precision = "auto"`: the fastest safe precision for this device, decided by measuring.

On a CPU it depends on the chip (an EPYC with avx512_bf16 runs bf16 matmuls 4x faster than
fp32; a Xeon without AMX 0.7x), so a probe of a few tens of milliseconds at start-up times one
encoder-sized matmul in both and picks bf16 only when it is clearly faster. On a GPU bf16
matmuls are always faster, but a small model at a small batch is bound by kernel launches, and
autocast adds a cast kernel per weight (MiniLM at batch 16 on an H200 trains no faster in bf16
than in fp32; bench/README.md, "On a GPU"): there the probe times the job's own forward and
backward on a typical batch in both (`JobStep`) and picks bf16 unless it is slower. fp16 (which
needs a loss scaler) is never picked by itself. Under DDP every rank takes rank 0's measurement,
so all ranks train in the same precision.

`autocast(device, precision)` is the context of every forward, in training and evaluation;
`logits_in_fp32` keeps the model's last layer out of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from nlptrain.checkpoint import saved_precision
from nlptrain.distributed import Backend
from nlptrain.errors import ConfigError

log = logging.getLogger(__name__)
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
PIN_VARIABLE = "NLPTRAIN_AUTO_PRECISION"  # fp32 | bf16: what "auto" picks, without a probe
CLEARLY_FASTER = 1.5  # bf16 matmuls at least this many times fp32's: autocast then wins (~1.7x
                      # end to end at 4x, measured in bench/run.py); below, casts eat the gain
PROBE_SHAPE = (128, 384, 768)  # tokens x hidden x width, of MiniLM-sized layers
PROBE_BUDGET_S = 0.1  # after one timed round, stop once the probe has taken this long
PROBE_ATTEMPTS = 3  # probes at most while bf16 looks no faster (`probe_cpu`)
STEP_PROBE_BUDGET_S = 1.0  # the same for the job's own step, on a GPU
SLOWER_KEPT = 0.5  # eval/predict keep a model's precision down to this speed-up: its run's scores
                   # (a Xeon without AMX: bf16 0.7x); CPUs without its units are at 0.02-0.03x


@dataclass
class PrecisionChoice:
    """What training runs in, and why (logged, and written to the run's config.json)."""

    requested: str
    precision: str
    reason: str
    probe: dict[str, float] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        return {"requested": self.requested, "chosen": self.precision, "reason": self.reason,
                "probe": self.probe}


@dataclass
class JobStep:
    """The job's own forward and backward, to time: `logits(batch)` runs the model on a batch
    already on the device. It leaves no trace: the model runs in eval mode (no dropout draws from
    the RNG, no running statistics updated) and its gradients are cleared after."""

    model: torch.nn.Module
    batch: dict[str, torch.Tensor]
    logits: Callable[[dict[str, torch.Tensor]], torch.Tensor]

    def run(self, device: torch.device, precision: str) -> None:
        self.model.to(device)
        batch = {k: v.to(device) for k, v in self.batch.items()}
        was_training = self.model.training
        self.model.eval()
        try:
            with autocast(device, precision):
                logits = self.logits(batch)
            if logits.requires_grad:
                logits.float().sum().backward()
        finally:
            self.model.train(was_training)
            self.model.zero_grad(set_to_none=True)

    def shape(self) -> str:
        ids = self.batch.get("input_ids")
        return "x".join(map(str, ids.shape)) if ids is not None else "?"


def choose(requested: str, device: torch.device, dist: Backend | None = None,
           resumed_from: Path | None = None,
           job_step: Callable[[], JobStep | None] | None = None) -> PrecisionChoice:
    """`requested` as is unless it is "auto"; then the precision of the checkpoint it resumes
    from (`resumed_from`), else bf16 where it is supported and measurably faster, else fp32; the
    choice is logged. `job_step`: on a GPU, makes what is timed (without it, or where it makes
    none, bf16 where supported). `dist`: every rank gets rank 0's choice."""
    if requested not in PRECISIONS:
        raise ValueError(f"unknown precision {requested!r}; use one of {', '.join(PRECISIONS)}")
    if requested != "auto":
        if requested == "fp16" and device.type == "cpu" and (dist is None or dist.is_main):
            warn_if_fp16_is_slow_here()
        return PrecisionChoice(requested, requested, "asked for")
    # Rank 0 decides (its probe, its pin, its GPU) and every rank takes its choice: a
    # mistake in the pin is then said once, and ranks never train in two precisions.
    choice = dist.on_main(lambda: _auto(device, resumed_from, job_step)) if dist is not None \
        else _auto(device, resumed_from, job_step)
    log.info("precision auto: %s (%s)", choice.precision, choice.reason)
    return choice


def _auto(device: torch.device, resumed_from: Path | None,
          job_step: Callable[[], JobStep | None] | None) -> PrecisionChoice:
    """What "auto" picks here (see `choose`)."""
    kept = saved_precision(resumed_from) if resumed_from is not None else None
    if kept:  # the run goes on as it began, whatever this machine would pick now
        return PrecisionChoice("auto", kept, f"kept from {resumed_from.name}: a resume goes on in "
                               "the run's precision")
    pinned = os.environ.get(PIN_VARIABLE, "")
    if pinned:  # e.g. a test suite whose expected numbers are fp32's, on any CPU
        if pinned not in ("fp32", "bf16"):
            raise ConfigError(f"{PIN_VARIABLE}={pinned!r}: use fp32 or bf16, or unset it")
        return PrecisionChoice("auto", pinned, f"pinned by {PIN_VARIABLE}")
    if device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return PrecisionChoice("auto", "fp32", "this GPU has no bf16")
    if device.type == "cuda":
        step = job_step() if job_step is not None else None
        name = torch.cuda.get_device_name(device)
        # No step to time (evaluation; an iterable train set): bf16's matmuls are the faster.
        return choose_by_step(step, device, name) if step is not None else \
            PrecisionChoice("auto", "bf16", f"{name} supports bf16")
    if device.type == "cpu":
        probe = probe_cpu()
        faster = probe["bf16_speedup"] >= CLEARLY_FASTER
        return PrecisionChoice(
            "auto", "bf16" if faster else "fp32",
            f"bf16 matmuls {probe['bf16_speedup']:.2f}x fp32 on this CPU ({probe['bf16_ms']:.2f} "
            f"vs {probe['fp32_ms']:.2f} ms; bf16 needs >= {CLEARLY_FASTER}x)", probe)
    return PrecisionChoice("auto", "fp32", f"no probe for {device.type}")


def for_scoring(requested: str, trained_in: str | None, device: torch.device,
                dist: Backend | None = None) -> str:
    """The precision a saved model scores in (`eval`, `predict`): `requested`, but "auto" is the
    one the model was trained and tested in (`trained_in`, its config.json's record) where it has
    one: its scores then match its run's. Unless this device runs it far slower than fp32 (a
    model trained in fp16 on a GPU, scored on a CPU without fp16 units: 0.02x): then fp32, said.
    Every rank takes rank 0's."""
    if requested == "auto" and trained_in:
        def decide() -> tuple[str, str]:
            return _scoring_precision(trained_in, device)

        # Only a half precision is probed (rank 0's, for every rank); fp32 needs no collective.
        probed = dist is not None and trained_in != "fp32"
        chosen, reason = dist.on_main(decide) if probed else decide()
        log.info("precision auto: %s (%s)", chosen, reason)
        return chosen
    return choose(requested, device, dist).precision


def _scoring_precision(trained_in: str, device: torch.device) -> tuple[str, str]:
    """`trained_in` unless this device runs it far slower than fp32 (then fp32); and why."""
    kept = (trained_in, "the model was trained and tested in it")
    if trained_in == "fp32":
        return kept
    if device.type == "cuda":
        if trained_in == "bf16" and not torch.cuda.is_bf16_supported():
            return "fp32", "the model was trained in bf16, which this GPU lacks"
        return kept
    if device.type != "cpu" or trained_in not in ("bf16", "fp16"):
        return kept
    probe = probe_cpu_matmuls(precisions=("fp32", trained_in))
    speedup = probe[f"{trained_in}_speedup"]
    if speedup >= SLOWER_KEPT:
        return kept
    return "fp32", (f"the model was trained in {trained_in}, whose matmuls run {speedup:.2f}x "
                    f"as fast as fp32's on this CPU; --precision {trained_in} scores exactly as "
                    "its run did")


def probe_cpu(attempts: int = PROBE_ATTEMPTS) -> dict[str, float]:
    """`probe_cpu_matmuls`, again while bf16 comes out short of clearly faster, up to `attempts`
    times, keeping the fastest bf16 seen: other work on the machine slows a probe's bf16 timings
    as often as its fp32 ones and can hide bf16's speed, but never fakes it (under two busy
    processes on 2 cores a single probe missed a 3x bf16 in 8 of 40 runs; up to three, in none).
    A CPU without bf16 units stays far below (0.03x) and costs ~0.3 s of probing."""
    best = probe_cpu_matmuls()
    tried = 1
    while tried < attempts and best["bf16_speedup"] < CLEARLY_FASTER:
        probe = probe_cpu_matmuls()
        tried += 1
        if probe["bf16_speedup"] > best["bf16_speedup"]:
            best = probe
    return {**best, "attempts": tried}


def warn_if_fp16_is_slow_here() -> None:
    """fp16 asked for on a CPU: said when its matmuls are not clearly faster than fp32's (most
    CPUs have no fp16 units; this Xeon's AMX has bf16's), with what would be faster."""
    probe = probe_cpu_matmuls(precisions=("fp32", "bf16", "fp16"))
    if probe["fp16_speedup"] >= CLEARLY_FASTER:
        return
    faster = "bf16 (--precision bf16, or auto)" if probe["bf16_speedup"] >= CLEARLY_FASTER \
        else "fp32"
    log.warning("precision fp16 on a CPU: fp16 matmuls run %.2fx as fast as fp32's here (bf16's "
                "%.2fx), and fp16 adds a loss scaler; %s runs faster on this CPU",
                probe["fp16_speedup"], probe["bf16_speedup"], faster)


def probe_cpu_matmuls(repeats: int = 3,
                      precisions: tuple[str, ...] = ("fp32", "bf16")) -> dict[str, float]:
    """Best of up to `repeats` timings of one (tokens x hidden) @ (hidden x width) matmul in each
    of `precisions` (fp32 first), interleaved so that a noisy neighbour slows all alike. A CPU
    without bf16 units takes ~40x longer in bf16: the budget bounds that.

    On one thread: whether the cores have bf16 units is the question, and a multi-threaded matmul
    on a busy machine times the threads' waits for each other, not the units (two busy processes
    on 2 cores: at 2 threads 3 of 20 probes missed a 2.8x bf16, at 1 thread none did)."""
    tokens, hidden, width = PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    a32 = torch.randn(tokens, hidden, generator=generator)
    b32 = torch.randn(hidden, width, generator=generator)
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    inputs = {name: (a32.to(dtypes[name]), b32.to(dtypes[name])) for name in precisions}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        probe = best_of_interleaved(lambda name: torch.mm(*inputs[name]), repeats, PROBE_BUDGET_S,
                                    precisions)
    finally:
        torch.set_num_threads(threads)
    return {**probe, "threads": 1}


def choose_by_step(job_step: JobStep, device: torch.device, where: str) -> PrecisionChoice:
    """bf16 unless the job's own step runs slower in it than in fp32."""
    probe = probe_job_step(job_step, device)
    faster = probe["bf16_speedup"] >= 1.0
    return PrecisionChoice(
        "auto", "bf16" if faster else "fp32",
        f"the job's step (batch {job_step.shape()}) {probe['bf16_speedup']:.2f}x as fast in bf16 "
        f"as in fp32 on {where} ({probe['bf16_ms']:.1f} vs {probe['fp32_ms']:.1f} ms)", probe)


def probe_job_step(job_step: JobStep, device: torch.device, repeats: int = 5) -> dict[str, float]:
    """Best of up to `repeats` timings of the job's step in fp32 and in bf16 (`best_of_interleaved`;
    the untimed first round: kernel choice, allocator warm-up), each ended by a device sync."""
    def run(precision: str) -> None:
        job_step.run(device, precision)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return best_of_interleaved(run, repeats, STEP_PROBE_BUDGET_S)


def best_of_interleaved(run: Callable[[str], Any], repeats: int, budget_s: float,
                        precisions: tuple[str, ...] = ("fp32", "bf16")) -> dict[str, float]:
    """The best of up to `repeats` timings of `run(name)` for each of `precisions` (fp32 first),
    interleaved so that a noisy neighbour slows all alike, after one untimed round of each
    (warm-up); it stops after any timed round once `budget_s` has passed (a CPU without bf16
    units takes ~40x longer). Each other precision's speed-up is over fp32 (`bf16_speedup`)."""
    best = dict.fromkeys(precisions, float("inf"))
    began = time.perf_counter()
    for attempt in range(repeats + 1):
        for name in best:
            start = time.perf_counter()
            run(name)
            if attempt:
                best[name] = min(best[name], time.perf_counter() - start)
        if attempt and time.perf_counter() - began > budget_s:
            break
    return {**{f"{name}_ms": seconds * 1e3 for name, seconds in best.items()},
            **{f"{name}_speedup": best["fp32"] / best[name] for name in precisions[1:]},
            "probe_ms": (time.perf_counter() - began) * 1e3}


@contextlib.contextmanager
def autocast(device: torch.device, precision: str) -> Iterator[None]:
    """The context of every forward: autocast to `precision`; on a GPU in bf16/fp16 also the
    attention kernels that suit batches of changing shapes (`attention_kernels`)."""
    if precision not in ("fp32", "bf16", "fp16"):  # "auto" is decided before (`choose`)
        raise ValueError(f"autocast needs fp32, bf16 or fp16, not {precision!r}")
    if precision == "fp32":
        yield
        return
    dtype = torch.bfloat16 if precision == "bf16" else torch.float16
    kernels = attention_kernels() if device.type == "cuda" else contextlib.nullcontext()
    with torch.autocast(device_type=device.type, dtype=dtype), kernels:
        yield


def logits_in_fp32(model: torch.nn.Module, outputs: int | None) -> None:
    """Run the model's last layer, its last plain `nn.Linear` that gives `outputs` logits, in fp32
    under autocast: in bf16 its logits would be rounded to 8 bits (a regression's scores in steps
    of 1/64 near 3, ties among them; classes' probabilities tied, argmax then taking the lower
    id). The layer is a few outputs wide: fp32 costs nothing. In place (its class becomes
    `LogitsLinear`, which pickles and deep-copies as a Linear does; the weights keep their names);
    a model without such a layer (a module of the user's that ends otherwise) is left as it is."""
    if not outputs:
        return
    head = next((m for m in reversed(list(model.modules()))
                 if type(m) in (torch.nn.Linear, LogitsLinear) and m.out_features == outputs), None)
    if head is not None:
        head.__class__ = LogitsLinear


class LogitsLinear(torch.nn.Linear):
    """A Linear that computes in fp32 under autocast, as it is without it (`logits_in_fp32`)."""

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not torch.is_autocast_enabled(features.device.type):  # fp32: as a Linear, no extra op
            return super().forward(features)
        with torch.autocast(features.device.type, enabled=False):
            bias = None if self.bias is None else self.bias.float()
            return torch.nn.functional.linear(features.float(), self.weight.float(), bias)


def attention_kernels() -> contextlib.AbstractContextManager:
    """Scaled-dot-product attention without cuDNN's kernel. torch tries cuDNN's first on Hopper
    and Blackwell GPUs in bf16/fp16, and it builds a plan for each new (batch, length) shape,
    tenths of a second each: dynamic padding meets dozens of shapes an epoch, and on an H200
    those plans took more time than the training (bench/README.md, "On a GPU"). Flash and
    memory-efficient attention run any shape at once."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:  # torch < 2.3: no cuDNN attention either
        return contextlib.nullcontext()
    if not hasattr(SDPBackend, "CUDNN_ATTENTION"):
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
