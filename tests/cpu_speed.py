"""A CPU of chosen speeds, for tests whose expectations would otherwise depend on this machine's
(the CPU model changes between machines: bf16 units on one, none on the next)."""

from __future__ import annotations

from typing import Any


def pretend_cpu_speedups(monkeypatch: Any, **speedups: float) -> None:
    """`probe_cpu_matmuls` answers as a CPU whose matmuls in each precision (bf16=..., fp16=...)
    run that many times as fast as fp32's (those not given: as fast)."""
    import nlptrain.precision as precision

    def probe(repeats: int = 3, precisions: tuple[str, ...] = ("fp32", "bf16")) -> dict:
        found: dict[str, float] = {f"{p}_ms": 1.0 / speedups.get(p, 1.0) for p in precisions}
        found.update({f"{p}_speedup": speedups.get(p, 1.0) for p in precisions[1:]})
        return {**found, "threads": 1}

    monkeypatch.setattr(precision, "probe_cpu_matmuls", probe)
