"""Megatron-style parallel layers: each holds one local shard as its ``weight``.

Shapes are local to this rank: ``tp`` splits a column-parallel weight ``[out, in]`` along
``out`` (each rank computes ``out / tp`` features of every token) and a row-parallel weight
along ``in`` (each rank computes a partial sum over its ``in / tp`` inputs).
"""

import math
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from hotswitch.model.comm import all_reduce

__all__ = ["Shard", "rms_norm", "rotary_tables", "llama3_frequencies", "apply_rotary", "vocab_parallel_embedding",
           "vocab_parallel_cross_entropy"]


class Shard(nn.Module):
    """A module holding one parameter shard as ``weight`` (so that ``named_parameters``
    yields the tensor set's names, e.g. ``layers.3.qkv.weight``)."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight)

    def extra_repr(self) -> str:
        return f"shape={tuple(self.weight.shape)}"


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x * weight / sqrt(mean(x^2) + eps)`` over the last dim, computed in float32."""
    xf = x.float()
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return y.to(x.dtype) * weight


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype,
                  scaling: Optional[dict] = None):
    """``cos, sin`` of shape ``[T, head_dim / 2]`` for int64 ``positions`` ``[T]``;
    ``scaling``: LLaMA 3.1's frequency scaling (``TransformerConfig.rope_scaling_dict``)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32,
                                             device=positions.device) / head_dim))
    if scaling is not None:
        inv_freq = llama3_frequencies(inv_freq, scaling)
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def llama3_frequencies(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    """LLaMA 3.1's rotary frequencies: wavelengths beyond ``original_max_position_embeddings /
    low_freq_factor`` are slowed by ``factor``, those below ``... / high_freq_factor`` kept,
    and the band between blended smoothly (Meta's ``apply_scaling``)."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    context = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= context / high) & (wavelen <= context / low)
    return torch.where(medium, blended, scaled)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotates ``x`` ``[T, heads, head_dim]`` by the tables of ``rotary_tables`` (the
    half-split pairing of LLaMA: element ``j`` pairs with ``j + head_dim / 2``), in the
    dtype of ``x`` (bf16 under autocast, whatever the tables' dtype)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :].to(x.dtype), sin[:, None, :].to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def vocab_parallel_embedding(tokens: torch.Tensor, weight: torch.Tensor, vocab_start: int) -> torch.Tensor:
    """Rows of this rank's vocabulary slice ``weight`` ``[V / tp, h]`` for ``tokens`` ``[T]``;
    zero for tokens of other slices. Summed over the TP ranks this is the embedding."""
    local = tokens - vocab_start
    outside = (local < 0) | (local >= weight.shape[0])
    out = F.embedding(local.masked_fill(outside, 0), weight)
    return out.masked_fill(outside[:, None], 0.0)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    """Cross entropy over logits split by vocabulary across the TP group (Megatron's): the
    max, the softmax denominator and the target logit are reduced over the group; the full
    ``[T, V]`` logits never exist on one rank."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        ctx.dtype = logits.dtype
        logits = logits.float()
        top = logits.max(dim=-1).values
        all_reduce(top, group, dist.ReduceOp.MAX)
        shifted = logits - top[:, None]
        local = target - vocab_start
        outside = (local < 0) | (local >= logits.shape[-1])
        local = local.masked_fill(outside, 0)
        rows = torch.arange(logits.shape[0], device=logits.device)
        picked = shifted[rows, local].masked_fill(outside, 0.0)
        all_reduce(picked, group)
        exp = shifted.exp()
        total = exp.sum(dim=-1)
        all_reduce(total, group)
        loss = total.log() - picked
        ctx.save_for_backward(exp.div_(total[:, None]), local, outside)
        return loss

    @staticmethod
    def backward(ctx, grad_loss):
        softmax, local, outside = ctx.saved_tensors
        grad = softmax
        rows = torch.arange(grad.shape[0], device=grad.device)
        grad[rows, local] -= (~outside).to(grad.dtype)
        grad.mul_(grad_loss[:, None])
        return grad.to(ctx.dtype), None, None, None


def vocab_parallel_cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int,
                                 group) -> torch.Tensor:
    """Per-token cross entropy ``[T]`` (float32) of this rank's logit slice ``[T, V / tp]``
    (vocabulary ids ``[vocab_start, vocab_start + V / tp)``) against int64 ``target`` ``[T]``."""
    return _VocabParallelCrossEntropy.apply(logits, target, vocab_start, group)
