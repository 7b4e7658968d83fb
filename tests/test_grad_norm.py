"""The global gradient norm and clipping (nlptrain.grad_norm): torch's computation, more exact on
a CPU and the same for any thread count; the clip's multiply by exactly 1 skipped on a CPU only."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from nlptrain import grad_norm

# A word embedding's gradient (long enough for float32 partial sums to drift), matrices, vectors,
# and sizes that are not a multiple of the chunk.
SHAPES = [(30522, 384), (1536, 384), (384,), (2, 384), (7,), (grad_norm.CHUNK * 2 + 5,)]


def _grads(scale: float = 1e-3) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    return [torch.randn(shape, generator=generator) * scale for shape in SHAPES]


def _parameters(grads: list[torch.Tensor]) -> list[torch.nn.Parameter]:
    parameters = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(parameters, grads, strict=True):
        p.grad = g.clone()
    return parameters


class _Ops(TorchDispatchMode):
    """The aten ops run inside it, by name."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))

    @property
    def in_place_multiplies(self) -> int:
        return sum(name.split(".")[0] in ("mul_", "_foreach_mul_") for name in self.names)


def test_the_cpu_norm_is_nearer_float64_than_torchs_and_the_same_bits_on_any_thread_count():
    exact = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double())
                                                  for g in _grads()]))
    threads = torch.get_num_threads()
    try:
        norms = []
        for count in (1, 2, 3):
            torch.set_num_threads(count)
            norms.append(grad_norm.total_norm(_grads()))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(norms[0], norm) for norm in norms[1:])
    ours = abs(float(norms[0].double() / exact) - 1)
    torchs = abs(float(torch.nn.utils.get_total_norm(_grads()).double() / exact) - 1)
    assert ours < 1e-6 < 1e-5 < torchs  # torch's one-pass float32 sum over 11.7M values drifts
    assert norms[0].dtype == torch.float32 and norms[0].shape == ()


def test_other_gradients_take_torchs_norm():
    halves = [g.to(torch.bfloat16) for g in _grads()]
    assert torch.equal(grad_norm.total_norm(halves), torch.nn.utils.get_total_norm(halves))
    assert torch.equal(grad_norm.total_norm([]), torch.nn.utils.get_total_norm([]))
    assert float(grad_norm.total_norm([torch.empty(0), torch.empty(0, 3)])) == 0.0


def test_one_tensor_is_clipped_as_torch_clips_it():
    ours, theirs = _parameters(_grads()[1:2]), _parameters(_grads()[1:2])
    norm = grad_norm.clip_grad_norm_(ours[0], 1e-3)  # one tensor, not its rows
    assert torch.allclose(norm, torch.nn.utils.get_total_norm([theirs[0].grad]), rtol=1e-5)
    torch.nn.utils.clip_grads_with_norm_(theirs[0], 1e-3, norm)
    assert torch.equal(ours[0].grad, theirs[0].grad)


@pytest.mark.parametrize("max_norm", [1e-3, 0.5])
def test_a_clip_scales_as_torch_does_given_the_norm(max_norm):
    ours, theirs = _parameters(_grads()), _parameters(_grads())
    norm = grad_norm.clip_grad_norm_(ours, max_norm)
    assert float(norm) > max_norm  # (the gradients' norm is about 3.5)
    torch.nn.utils.clip_grads_with_norm_(theirs, max_norm, norm)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(ours, theirs, strict=True))


def test_under_the_clip_a_cpu_skips_the_multiply_by_one_with_the_same_bits():
    parameters = _parameters(_grads())
    with _Ops() as ops:
        norm = grad_norm.clip_grad_norm_(parameters, 1e3)
    assert ops.in_place_multiplies == 0  # torch multiplies every gradient by 1.0
    assert all(torch.equal(p.grad, g) for p, g in zip(parameters, _grads(), strict=True))
    theirs = _parameters(_grads())
    torch.nn.utils.clip_grads_with_norm_(theirs, 1e3, norm)
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(parameters, theirs, strict=True))


def test_a_non_finite_norm_scales_the_gradients_as_torchs_clip_does():
    grads = _grads()
    grads[2][0] = torch.nan
    ours, theirs = _parameters(grads), _parameters(grads)
    assert grad_norm.clip_grad_norm_(ours, 1e3).isnan()
    torch.nn.utils.clip_grad_norm_(theirs, 1e3)
    assert all(torch.equal(p.grad.isnan(), q.grad.isnan()) for p, q in zip(ours, theirs, strict=True))
    assert all(p.grad.isnan().all() for p in ours)  # NaN >= 1 is false: scaled by NaN


def test_where_reading_would_stall_a_device_queue_the_multiply_stays(monkeypatch):
    monkeypatch.setattr(grad_norm, "reading_is_free", lambda device: False)  # as on a GPU
    parameters = _parameters(_grads())
    with _Ops() as ops:
        grad_norm.clip_grad_norm_(parameters, 1e3)
    assert ops.in_place_multiplies >= 1
    assert not grad_norm.reading_is_free(torch.device("cpu"))
    monkeypatch.undo()
    assert grad_norm.reading_is_free(torch.device("cpu"))
    assert not grad_norm.reading_is_free(torch.device("meta"))
