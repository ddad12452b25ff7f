"""Planner simulations: many steps of lengths drawn from a distribution, planned with hot
switching, with the best static layout and with free switches. Every figure here is a
prediction of the cost model, never a measurement.
"""

import random
import time
from typing import Optional, Sequence

from hotswitch import _C

__all__ = ["simulate", "switch_share"]


def switch_share(plan: "_C.StepPlan", planner: "_C.Planner") -> float:
    """Seconds of a step plan spent switching: parameters in and back, and the gradients'
    switches (beyond the phase's own reduction)."""
    total = plan.switch_back_seconds
    for ph in plan.phases:
        total += ph.switch_in_seconds
        if ph.grad_method == "reduce":
            total += ph.grad_seconds - planner.candidate_model(ph.candidate).reduce_seconds
        elif ph.grad_method == "partial":
            total += ph.grad_seconds
    return total


def simulate(planner, lengths: Sequence[int], steps: int, global_batch: int, seed: int = 0,
             free: Optional["_C.Planner"] = None) -> dict:
    """Plans ``steps`` steps of ``global_batch`` lengths drawn from ``lengths``.

    Returns tokens and predicted seconds summed over the steps (exact packing): ``hot_s``
    (hot switching), ``static_s`` (per step the best single layout that holds its longest
    sequence: no worse than any one layout a user could fix for the whole run), ``free_s``
    (hot switching with free switches, when ``free`` is given), ``switch_s`` (of hot_s),
    ``plan_ms`` (median planning time), and the layouts the hot plans used.
    """
    rng = random.Random(seed)
    out = {"steps": steps, "tokens": 0, "hot_s": 0.0, "static_s": 0.0, "free_s": 0.0, "switch_s": 0.0,
           "layouts": {}}
    times = []
    for _ in range(steps):
        step = [rng.choice(lengths) for _ in range(global_batch)]
        pieces = planner.pieces(step)
        out["tokens"] += sum(p.length for p in pieces)
        t0 = time.perf_counter()
        planned = planner.plan(step)
        times.append(time.perf_counter() - t0)
        out["hot_s"] += planned.total_seconds
        out["static_s"] += planned.best_static_seconds
        out["switch_s"] += switch_share(planned, planner)
        for ph in planned.phases:
            out["layouts"][ph.layout.name] = out["layouts"].get(ph.layout.name, 0) + 1
        if free is not None:
            out["free_s"] += free.plan(step).total_seconds
    times.sort()
    out["plan_ms"] = times[len(times) // 2] * 1e3 if times else 0.0
    return out
