"""The boxes of a placement on one rank, and which rank owns each element: what checkpoints
write once per element and what the global gradient norm sums once per element."""

from typing import Dict, List

import torch

from hotswitch import _C

__all__ = ["local_views", "owned_pieces"]


def local_views(tensor_set, layout, kind: str, rank: int, buffers: List[torch.Tensor]):
    """(tensor index, lo, hi, view of the local buffer) for every piece of this rank."""
    placement = _C.Placement(tensor_set, layout, kind)
    out = []
    for t, lo, hi, buffer, offset, strides, _ in placement.pieces(rank):
        sizes = [b - a for a, b in zip(lo, hi)]
        out.append((t, tuple(lo), tuple(hi), buffers[buffer].as_strided(sizes, strides, offset)))
    return out


def owned_pieces(tensor_set, layout, kind: str) -> Dict[int, set]:
    """Per rank, the pieces ``(tensor, lo, hi)`` it writes, so that every element is written
    exactly once: pieces of the first pipeline stage holding the tensor, of data replica 0
    under a ``sharded`` placement (every data index holds distinct chunks under ``zero``),
    each claimed by the lowest rank that holds it (replicated tensors sit on every TP rank)."""
    placement = _C.Placement(tensor_set, layout, kind)
    stages: Dict[int, int] = {}
    for r in range(layout.world):
        c = layout.coord(r)
        for t, *_ in placement.pieces(r):
            stages[t] = min(stages.get(t, c["pp"]), c["pp"])
    claimed = set()
    writers: Dict[int, set] = {}
    for r in range(layout.world):
        c = layout.coord(r)
        mine = writers.setdefault(r, set())
        if kind == "sharded" and (c["dp"] != 0 or c["cp"] != 0):
            continue
        for t, lo, hi, *_ in placement.pieces(r):
            key = (t, tuple(lo), tuple(hi))
            if stages[t] == c["pp"] and key not in claimed:
                claimed.add(key)
                mine.add(key)
    return writers
