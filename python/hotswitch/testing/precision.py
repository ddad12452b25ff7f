"""Layout parity under mixed precision: the same steps of the tiny model (``scenarios.TINY``)
trained under each of several static layouts, in fp32 and with 16-bit compute, shared by the
bf16 parity test and ``benchmarks.data``.

A layout changes the order of sums (tensor-parallel partial products, data-parallel
reductions) and so, under bf16 compute, which values are rounded to bf16's 8-bit mantissa
(unit roundoff 2**-8 ~ 3.9e-3). The losses of two layouts then differ by a few such
roundings at most, while fp32 runs agree to ~1e-6.
"""

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from hotswitch.model.config import TransformerConfig
from hotswitch.runtime import Runtime
from hotswitch.testing.scenarios import LR, MAX_CONTEXT, STEPS, TINY, batch, hardware

__all__ = ["BF16_LOSS_RTOL", "max_rel_diff", "parity"]

# Two steps of the tiny model under bf16 compute: losses of two layouts agree to this relative
# difference, ~2.5 units of bf16 roundoff (2**-8).
BF16_LOSS_RTOL = 1e-2


def parity(rank: int, world: int, layouts: Sequence[str], compute_dtypes: Sequence[Optional[str]],
           steps: int = 2) -> Dict[str, Dict[str, List[Tuple[float, float]]]]:
    """Rank function: trains ``steps`` steps (``STEPS[1:]``'s lengths) under each static
    layout of ``layouts`` (of this world) and each compute dtype (``None`` for fp32); returns
    ``{dtype name: {layout: [(loss, grad norm) per step]}}``, the same on every rank."""
    out: Dict[str, Dict[str, List[Tuple[float, float]]]] = {}
    for dtype in compute_dtypes:
        cfg = TransformerConfig(**TINY, tied_embedding=True, compute_dtype=dtype)
        runs = out.setdefault(dtype or "float32", {})
        for name in layouts:
            rt = Runtime(cfg, candidates=[name], hardware=hardware(1 << 40), max_context=MAX_CONTEXT, seed=7,
                         recalibrate=False, optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6))
            results = [rt.train_step(batch(STEPS[1 + i], i)) for i in range(steps)]
            runs[name] = [(r.loss, r.grad_norm) for r in results]
    return out


def max_rel_diff(runs: Dict[str, List[Tuple[float, float]]], reference: List[Tuple[float, float]],
                 field: int) -> float:
    """The largest ``|x - ref| / |ref|`` of field 0 (loss) or 1 (grad norm) over the runs' steps."""
    return max(abs(step[field] - ref[field]) / abs(ref[field]) for steps in runs.values()
               for step, ref in zip(steps, reference))
