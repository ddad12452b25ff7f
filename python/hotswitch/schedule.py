"""Learning-rate schedules with Megatron-LM's semantics (its ``OptimizerParamScheduler``,
counted in iterations).

At iteration ``n`` (0-based: the first optimizer step runs at ``n = 0``), with peak ``lr``,
``warmup`` iterations and decay over ``decay_iters`` iterations:

- warm-up, ``n < warmup``:   ``lr * n / warmup``
- after ``decay_iters``:     ``min_lr``
- otherwise, with ``r = (n - warmup) / (decay_iters - warmup)``:
  - ``constant``: ``lr``
  - ``linear``:   ``min_lr + (lr - min_lr) * (1 - r)``
  - ``cosine``:   ``min_lr + (lr - min_lr) * 0.5 * (cos(pi * r) + 1)``

``constant`` ignores ``min_lr`` and decay, as Megatron's does (warm-up still applies).
"""

import math
from typing import Optional

import torch

from hotswitch._checks import check_choice, check_int

__all__ = ["DECAY_STYLES", "LearningRateSchedule"]

DECAY_STYLES = ("constant", "linear", "cosine")


class LearningRateSchedule:
    """``lr_at(n)`` of the formulas above; ``apply(optimizer, n)`` sets every parameter
    group's ``lr``. ValueError for a bad argument (naming it)."""

    def __init__(self, lr: float, *, style: str = "constant", min_lr: float = 0.0, warmup_iters: int = 0,
                 decay_iters: Optional[int] = None):
        for name, value in (("lr", lr), ("min_lr", min_lr)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        check_choice("lr decay style", style, DECAY_STYLES)
        check_int("warmup_iters", warmup_iters, 0)
        if min_lr > lr:
            raise ValueError(f"min_lr({min_lr}) must not exceed lr({lr})")
        if style != "constant":
            if decay_iters is None:
                raise ValueError(f"the {style} decay needs decay_iters")
            check_int("decay_iters", decay_iters, 1)
            if decay_iters <= warmup_iters:
                raise ValueError(f"decay_iters({decay_iters}) must exceed warmup_iters({warmup_iters})")
        self.lr, self.min_lr, self.style = float(lr), float(min_lr), style
        self.warmup_iters, self.decay_iters = warmup_iters, decay_iters

    def lr_at(self, n: int) -> float:
        """The learning rate of iteration ``n`` (0-based)."""
        check_int("iteration", n, 0)
        if n < self.warmup_iters:
            return self.lr * n / self.warmup_iters
        if self.style == "constant":
            return self.lr
        if n > self.decay_iters:
            return self.min_lr
        ratio = (n - self.warmup_iters) / (self.decay_iters - self.warmup_iters)
        coeff = 1.0 - ratio if self.style == "linear" else 0.5 * (math.cos(math.pi * ratio) + 1.0)
        return self.min_lr + coeff * (self.lr - self.min_lr)

    def apply(self, optimizer: torch.optim.Optimizer, n: int) -> float:
        """Sets ``lr_at(n)`` on every parameter group of ``optimizer``; returns it."""
        lr = self.lr_at(n)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
