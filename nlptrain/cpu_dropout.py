"""Dropout for CPU training: masks from 16 random bits an element, attention dropout outside SDPA.

torch's CPU dropout draws every element through `bernoulli_` (0.86 ms for one [16, 32, 384]
activation on this project's machines; a MiniLM step has 20 of them), and SDPA has no fused CPU
kernel with dropout: in training it takes its math path, which computes bf16 inputs in fp32.
Here, on the CPU only:

- a mask costs one 64-bit draw of torch's CPU generator for four elements; an element is kept
  where the 15 low bits of its 16 are >= round(p * 32768), so it is dropped with probability p
  (to 1.5e-5) and kept ones are scaled by 1/(1-p) as torch's are. The generator is torch's
  default one: seeded by the run's seed, saved in checkpoints, replayed by activation
  checkpointing.
- attention in training runs scores, an fp32 softmax, that dropout and the values, as
  transformers' eager attention does, with autocast's bf16 matmuls; in evaluation, on a GPU or
  in causal attention it is transformers' `sdpa`, unchanged.

The masks differ from torch's for the same seed; their distribution is the same.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn

log = logging.getLogger(__name__)

ATTENTION = "nlptrain_cpu_sdpa"  # the attention implementation's name in transformers' registry
_INT_OF_SIZE = {2: torch.int16, 4: torch.int32}  # bf16/fp16 and fp32 masks are bit masks


def dropout_noise(x: torch.Tensor, p: float) -> torch.Tensor:
    """A tensor like `x`: 0 where an element is dropped (probability p), 1/(1-p) where kept."""
    n = x.numel()
    # One buffer, worked in place (the bits become the noise): 0.19 ms for a [16, 32, 384] bf16
    # activation, against 0.42 with a new tensor for each operation and torch's 0.86.
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_().view(torch.int16)[:n]
    # (15 random bits - threshold) is negative, its sign bit set, exactly where dropped: >> 15
    # spreads the sign over all 16 bits, and ~ turns it into all ones where kept.
    kept = bits.bitwise_and_(0x7FFF).sub_(round(p * 32768)).bitwise_right_shift_(15).bitwise_not_()
    int_dtype = _INT_OF_SIZE[x.element_size()]
    scale_bits = torch.tensor(1.0 / (1.0 - p), dtype=x.dtype).view(int_dtype)
    return kept.to(int_dtype).bitwise_and_(scale_bits).view(x.dtype).view(x.shape)


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """`torch.nn.functional.dropout`, its masks drawn as above for CPU floats; torch's elsewhere.
    Like torch's, it multiplies: a NaN stays NaN where dropped."""
    if (not training or not 0.0 < p < 1.0 or x.device.type != "cpu"
            or not x.is_floating_point() or x.element_size() not in _INT_OF_SIZE):
        return nn.functional.dropout(x, p, training)
    return x * dropout_noise(x, p)


class CpuDropout(nn.Dropout):
    """`nn.Dropout` whose CPU masks come from `dropout` above (the same p, the same state)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)


def attention(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: torch.Tensor | None, dropout: float = 0.0,
              scaling: float | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' attention interface: sdpa, except CPU training with attention dropout."""
    causal = kwargs.get("is_causal", getattr(module, "is_causal", True))
    if (dropout == 0.0 or query.device.type != "cpu" or causal is not False
            or key.shape[1] != query.shape[1]):  # grouped keys: sdpa repeats them
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask,
                                      dropout=dropout, scaling=scaling, **kwargs)
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    # In place where autograd allows (a matmul keeps its inputs, not its output; a cast keeps
    # nothing; the softmax keeps its output): three buffers a layer fewer to allocate and fill.
    scores = torch.matmul(query, key.transpose(2, 3)).mul_(scale)
    if attention_mask is not None:  # sdpa's mask: True where a key is attended, or additive
        scores = (scores.masked_fill_(~attention_mask, torch.finfo(scores.dtype).min)
                  if attention_mask.dtype == torch.bool else scores.add_(attention_mask))
    probabilities = torch.softmax(scores, dim=-1, dtype=torch.float32)
    weights = probabilities.to(query.dtype)
    noise = dropout_noise(weights, dropout)
    weights = weights * noise if weights is probabilities else weights.mul_(noise)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), None


def use_cpu_dropout(model: nn.Module) -> int:
    """Give `model` the dropout above, in place: every plain `nn.Dropout` becomes `CpuDropout`,
    and transformers' `sdpa` attention becomes `attention`. Returns how many modules changed."""
    changed = 0
    for module in model.modules():
        # A subclass may do more than drop, an in-place one may be relied on to write x: left alone.
        if type(module) is nn.Dropout and not module.inplace:
            module.__class__ = CpuDropout
            changed += 1
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) == "sdpa" and hasattr(model, "set_attn_implementation"):
        from transformers import AttentionInterface, AttentionMaskInterface
        from transformers.masking_utils import sdpa_mask

        AttentionInterface.register(ATTENTION, attention)
        AttentionMaskInterface.register(ATTENTION, sdpa_mask)  # the masks sdpa is given
        model.set_attn_implementation(ATTENTION)
        changed += 1
    log.debug("dropout: %d modules draw CPU masks from 16 random bits an element", changed)
    return changed
