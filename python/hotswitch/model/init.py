"""A counter-based initialiser: each weight element is a function of (seed, name, index).

Element ``i`` (flat index into the full, logical tensor) of parameter ``name`` is
``splitmix64(key(seed, name) + (i + 1) * golden)`` mapped to a uniform variate, so a rank
computes exactly the elements of its own shard — every layout starts from the same logical
weights, and no rank ever builds a full tensor.
"""

import hashlib
import math
from typing import Dict, Optional

import torch

from hotswitch import _C

__all__ = ["init_shards", "init_full", "uniform_at"]


def _signed(c: int) -> int:
    """A 64-bit constant as the int64 with the same bits."""
    return c - (1 << 64) if c >= 1 << 63 else c


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_CHUNK = 1 << 22  # elements hashed at once: bounds the int64 scratch per shard


def _shr(z: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of int64 bits (torch's ``>>`` is arithmetic)."""
    return (z >> k) & ((1 << (64 - k)) - 1)


def _key(seed: int, name: str) -> int:
    digest = hashlib.blake2b(f"{seed}:{name}".encode(), digest_size=8).digest()
    return _signed(int.from_bytes(digest, "little"))


def uniform_at(seed: int, name: str, index: torch.Tensor) -> torch.Tensor:
    """Uniform variates in [0, 1) (float64, the shape of ``index``) of elements ``index``
    (int64 flat indices into the full tensor) of parameter ``name``. Integer arithmetic
    wraps modulo 2^64, as splitmix64 does; the result is the same on every device."""
    z = (index + 1) * _GOLDEN + _key(seed, name)
    z = (z ^ _shr(z, 30)) * _MIX1
    z = (z ^ _shr(z, 27)) * _MIX2
    z = z ^ _shr(z, 31)
    return _shr(z, 11).to(torch.float64) * (1.0 / (1 << 53))


def _fill(config, name: str, seed: int, lo, hi, full_shape, device) -> torch.Tensor:
    """The float64 values of box [lo, hi) of parameter ``name``."""
    sizes = [b - a for a, b in zip(lo, hi)]
    if name.endswith("norm.weight"):
        return torch.ones(sizes, dtype=torch.float64, device=device)
    std = config.init_std
    if name.endswith("proj.weight") or name.endswith("down.weight"):
        std /= math.sqrt(2.0 * config.num_layers)
    bound = std * math.sqrt(3.0)  # a uniform variate on [-b, b] has std b / sqrt(3)
    strides = [1] * len(full_shape)
    for d in range(len(full_shape) - 2, -1, -1):
        strides[d] = strides[d + 1] * full_shape[d + 1]
    out = torch.empty(sizes, dtype=torch.float64, device=device)
    rows = max(1, _CHUNK // max(1, math.prod(sizes[1:])))
    for r0 in range(lo[0], hi[0], rows):
        r1 = min(hi[0], r0 + rows)
        index = torch.arange(r0, r1, dtype=torch.int64, device=device) * strides[0]
        for d in range(1, len(sizes)):
            step = torch.arange(lo[d], hi[d], dtype=torch.int64, device=device) * strides[d]
            index = index.unsqueeze(-1) + step
        out[r0 - lo[0]:r1 - lo[0]] = (uniform_at(seed, name, index) * 2.0 - 1.0) * bound
    return out


def init_shards(config, layout: "_C.Layout", rank: int, seed: int = 0,
                device: Optional[torch.device] = None) -> Dict[str, torch.Tensor]:
    """This rank's initial local shards under ``layout`` (``name -> tensor`` with the shapes
    of the sharded placement, in the config's dtype, on ``device``), computed from the
    placement's index boxes alone."""
    tensor_set = config.tensor_set()
    placement = _C.Placement(tensor_set, layout, "sharded")
    dtype = getattr(torch, config.dtype)
    specs = tensor_set.specs
    buffers = [(specs[t], torch.empty(shape, dtype=dtype, device=device))
               for t, shape, _ in placement.buffers(rank)]
    for tensor, lo, hi, buffer, offset, strides, _ in placement.pieces(rank):
        spec, local = buffers[buffer]
        sizes = [b - a for a, b in zip(lo, hi)]
        values = _fill(config, spec.name, seed, lo, hi, spec.shape, device)
        local.view(-1).as_strided(sizes, strides, offset).copy_(values)
    return {spec.name: local for spec, local in buffers}


def init_full(config, seed: int = 0, device: Optional[torch.device] = None) -> Dict[str, torch.Tensor]:
    """The full initial tensors (the single-rank layout's shards); for references and tests."""
    return init_shards(config, _C.Layout(), 0, seed, device)
