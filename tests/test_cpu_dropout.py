"""CPU training's dropout (`nlptrain/cpu_dropout.py`): masks from 16 random bits an element drop
at torch's rate and scale as torch's do; the backward uses the forward's mask; the seed decides
them; attention in training is eager attention with those masks and sdpa otherwise; a Trainer on
the CPU uses it unless told not to, and evaluation is untouched."""

from __future__ import annotations

import math

import pytest
import torch
from toy_trainer import make_trainer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from nlptrain.cpu_dropout import ATTENTION, CpuDropout, attention, dropout, dropout_noise


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_masks_drop_at_rate_p_and_scale_the_kept_as_torch_does(dtype, p):
    torch.manual_seed(0)
    x = torch.rand(1000, 1000, dtype=dtype) + 1  # no zeros of its own
    out = dropout(x, p)
    kept = out != 0
    # 1e6 draws: the drop rate's standard error is 5e-4 at most
    assert abs((1 - kept.float().mean().item()) - p) < 3e-3
    torch_scale = torch.ones(1, dtype=dtype).div_(1 - p)  # what torch's dropout multiplies by
    assert torch.equal(out[kept], x[kept] * torch_scale)
    assert torch.equal(dropout_noise(x, p).unique(), torch.cat([torch.zeros(1, dtype=dtype), torch_scale]))


def test_the_backward_drops_what_the_forward_dropped():
    torch.manual_seed(0)
    x = torch.randn(64, 384, dtype=torch.bfloat16, requires_grad=True)
    out = dropout(x, 0.1)
    out.backward(torch.ones_like(out))
    assert torch.equal(x.grad != 0, out != 0)
    assert x.grad.unique().tolist() == [0.0, pytest.approx(1 / 0.9, rel=4e-3)]


def test_the_seed_decides_the_masks_and_each_draw_is_new():
    x = torch.ones(4096)
    torch.manual_seed(1)
    first, second = dropout(x, 0.1), dropout(x, 0.1)
    torch.manual_seed(1)
    again = dropout(x, 0.1)
    torch.manual_seed(2)
    other = dropout(x, 0.1)
    assert torch.equal(first, again)
    assert not torch.equal(first, second)
    assert not torch.equal(first, other)


def test_outside_training_nothing_is_dropped_and_a_nan_stays_nan():
    x = torch.randn(256)
    assert torch.equal(dropout(x, 0.1, training=False), x)
    assert torch.equal(dropout(x, 0.0), x)
    assert dropout(torch.full((4096,), float("nan")), 0.5).isnan().all()  # as torch's: x * 0
    module = CpuDropout(0.1).eval()
    assert torch.equal(module(x), x)


def attention_inputs(dtype=torch.float32):
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, 5, 8, dtype=dtype) for _ in range(3))
    attended = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    attended[0, ..., 3:] = False  # the first row's last two tokens are padding
    return query, key, value, attended


class Encoder(torch.nn.Module):
    is_causal = False  # what transformers' BERT attention says of itself


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_in_training_is_eager_attention_with_these_masks(dtype):
    query, key, value, attended = attention_inputs(dtype)
    for t in (query, key, value):
        t.requires_grad_(True)
    torch.manual_seed(3)
    out, _ = attention(Encoder(), query, key, value, attended, dropout=0.1, scaling=0.25)
    torch.manual_seed(3)
    scores = (query @ key.transpose(2, 3) * 0.25).masked_fill(~attended, float("-inf"))
    weights = scores.softmax(-1, dtype=torch.float32).to(dtype)
    expected = ((weights * dropout_noise(weights, 0.1)) @ value).transpose(1, 2)
    torch.testing.assert_close(out, expected)
    # the backward of the in-place steps is autograd's own: the same gradients
    grads = torch.autograd.grad(out.float().square().sum(), (query, key, value))
    expected_grads = torch.autograd.grad(expected.float().square().sum(), (query, key, value))
    for got, want in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(got, want)
    # the padding's keys and values count for nothing
    with torch.no_grad():
        value[0, :, 3:] = 1e4
        key[0, :, 3:] = -1e4
    torch.manual_seed(3)
    padded, _ = attention(Encoder(), query, key, value, attended, dropout=0.1, scaling=0.25)
    torch.testing.assert_close(padded, out)


def test_attention_without_dropout_or_when_causal_is_transformers_sdpa():
    query, key, value, attended = attention_inputs()
    expected, _ = sdpa_attention_forward(Encoder(), query, key, value, attended, dropout=0.0,
                                         scaling=0.25)
    out, _ = attention(Encoder(), query, key, value, attended, dropout=0.0, scaling=0.25)
    assert torch.equal(out, expected)
    causal = Encoder()
    causal.is_causal = True
    torch.manual_seed(3)
    expected, _ = sdpa_attention_forward(causal, query, key, value, None, dropout=0.1)
    torch.manual_seed(3)
    out, _ = attention(causal, query, key, value, None, dropout=0.1)
    assert torch.equal(out, expected)


def plain_dropouts(model: torch.nn.Module) -> int:
    return sum(type(m) is torch.nn.Dropout for m in model.modules())


def test_a_cpu_trainer_uses_it_and_evaluation_is_unchanged(tmp_path, tiny_model_dir):
    trainer = make_trainer(tmp_path, tiny_model_dir, [], precision="fp32", epochs=1)
    twin = make_trainer(tmp_path, tiny_model_dir, [], precision="fp32", epochs=1, cpu_dropout=False)
    model, torch_model = trainer.unwrapped_model, twin.unwrapped_model
    assert plain_dropouts(model) == 0 and plain_dropouts(torch_model) > 0
    assert sum(isinstance(m, CpuDropout) for m in model.modules()) == plain_dropouts(torch_model)
    assert model.config._attn_implementation == ATTENTION
    assert torch_model.config._attn_implementation == "sdpa"
    batch = {"input_ids": torch.tensor([[101, 2023, 2003, 102, 0], [101, 2204, 3185, 2001, 102]]),
             "attention_mask": torch.tensor([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]])}
    model.eval(), torch_model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, torch_model(**batch).logits)
    model.train()
    torch.manual_seed(0)
    first = model(**batch).logits
    torch.manual_seed(0)
    assert torch.equal(model(**batch).logits, first)  # training: the seed's masks
    assert not torch.equal(model(**batch).logits, first)  # and new ones each step
    trainer.fit()
    assert math.isfinite(trainer.last_loss)
    trainer.close(), twin.close()
