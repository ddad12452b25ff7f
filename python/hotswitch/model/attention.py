"""Causal attention over packed variable-length sequences, without a mask over the pack.

The sequences of a pack are grouped by length; each group runs as one batch of
``[sequences, heads, length, head_dim]`` blocks, so the work and memory are those of the
per-sequence causal blocks, never of a ``[T, T]`` mask. ``F.scaled_dot_product_attention``
does the blocks where the installed PyTorch has it (2.x); a plain softmax otherwise.
"""

import math
from typing import List

import torch
import torch.nn.functional as F

__all__ = ["LengthGroups", "varlen_attention"]

_HAS_SDPA = hasattr(F, "scaled_dot_product_attention")


class LengthGroups:
    """The sequences of a pack grouped by length, as token indices.

    ``groups``: for each distinct length ``n``, an int64 ``[B, n]`` tensor of the token
    positions of its ``B`` sequences. ``inverse``: int64 ``[T]`` that puts the tokens of
    the concatenated groups back in pack order.
    """

    def __init__(self, lengths: List[int], device: torch.device):
        starts, by_length = 0, {}
        for n in lengths:
            by_length.setdefault(n, []).append(starts)
            starts += n
        self.num_tokens = starts
        self.groups: List[torch.Tensor] = []
        for n, first in sorted(by_length.items()):
            first = torch.tensor(first, dtype=torch.int64, device=device)
            self.groups.append(first[:, None] + torch.arange(n, dtype=torch.int64, device=device))
        order = torch.cat([g.reshape(-1) for g in self.groups])
        self.inverse = torch.empty_like(order)
        self.inverse[order] = torch.arange(order.numel(), dtype=torch.int64, device=device)


def _causal_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``[B, h, n, d]`` blocks (k, v already expanded to h heads)."""
    if _HAS_SDPA:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    n = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-1, -2)) * (1.0 / math.sqrt(q.shape[-1]))
    future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu_(1)
    probs = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1, dtype=torch.float32)
    return torch.matmul(probs.to(v.dtype), v)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: LengthGroups) -> torch.Tensor:
    """Causal attention within each sequence of a pack.

    ``q`` ``[T, hq, d]``, ``k``/``v`` ``[T, hkv, d]`` with ``hq`` a multiple of ``hkv``
    (query head ``i`` reads key/value head ``i // (hq / hkv)``); returns ``[T, hq, d]``.
    """
    repeat = q.shape[1] // k.shape[1]
    outs = []
    for index in groups.groups:
        qb, kb, vb = (x[index].transpose(1, 2) for x in (q, k, v))  # [B, h, n, d]
        if repeat > 1:
            kb = kb.repeat_interleave(repeat, dim=1)
            vb = vb.repeat_interleave(repeat, dim=1)
        ob = _causal_blocks(qb, kb, vb)
        outs.append(ob.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2]))
    return torch.cat(outs).index_select(0, groups.inverse)
