"""Planner simulations: many steps of lengths drawn from a distribution, planned with hot
switching, with the best static layout and with free switches. Every figure here is a
prediction of the cost model, never a measurement.
"""

import random
import time
from typing import Dict, Optional, Sequence

from hotswitch import _C

__all__ = ["padded_static_seconds", "simulate", "simulate_moving_home", "static_run_seconds", "switch_share"]


def padded_static_seconds(planner: "_C.Planner", sequences: int, seq_length: Optional[int] = None) -> float:
    """Predicted seconds of the best static layout running ``sequences`` sequences each padded
    to ``seq_length`` tokens (default: the planner's max context), the way a trainer without
    packing runs them: the padded static baseline."""
    seq_length = seq_length or planner.max_context
    if not seq_length:
        raise ValueError("padded static needs a sequence length: the planner has no max_context")
    return planner.plan([seq_length] * sequences).best_static_seconds


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


def static_run_seconds(planner: "_C.Planner", batches: Sequence[Sequence[int]], **options) -> Dict[str, float]:
    """Predicted seconds of ``batches`` (one step each) under each of the planner's candidates
    and recompute modes fixed for the whole run, by ``"layout/recompute"``: what a user who
    picks one layout runs, each step packed per sequence in one phase, no switch. A pair that
    cannot hold some step's longest sequence is left out. ``options``: the planner's
    (``max_context``, ``long_sequences``, ...), as for ``free_planner``."""
    out = {}
    for i, layout in enumerate(planner.candidates):
        for mode in planner.recompute:
            alone = _C.Planner(planner.cost, [layout], 0, [[0.0]], [0.0], **dict(options, recompute=[mode]))
            try:
                out[f"{layout.name}/{mode}"] = sum(alone.plan(list(b)).total_seconds for b in batches)
            except ValueError:
                continue  # a step it cannot hold
    return out


def simulate(planner, lengths: Sequence[int], steps: int, global_batch: int, seed: int = 0,
             free: Optional["_C.Planner"] = None, fixed=None, static_run: Optional[dict] = None) -> dict:
    """Plans ``steps`` steps of ``global_batch`` lengths drawn from ``lengths``.

    Returns tokens and predicted seconds summed over the steps (exact packing): ``hot_s``
    (hot switching), ``static_s`` (per step the best single layout that holds its longest
    sequence: no worse than any one layout a user could fix for the whole run), ``free_s``
    (hot switching with free switches, when ``free`` is given), ``switch_s`` (of hot_s),
    ``plan_ms`` (median planning time), and the layouts the hot plans used; ``fixed_s`` (the
    fixed plan ``fixed``, ``Planner.plan_fixed`` entries, when given) and ``padded_s`` (per step
    the best static layout with every sequence padded to the planner's max context, when it has
    one). With ``static_run`` (the planner's options, ``static_run_seconds``): ``static_run_s``,
    the best layout and recompute mode fixed for the whole run, and ``static_run`` its name.
    ``static_s`` may pick another layout each step and pays no switch for it: no static run
    reaches it, so hot switching can lose to it and still beat every layout fixed for the run.
    """
    rng = random.Random(seed)
    out = {"steps": steps, "tokens": 0, "hot_s": 0.0, "static_s": 0.0, "free_s": 0.0, "fixed_s": 0.0, "padded_s": 0.0,
           "switch_s": 0.0,
           "layouts": {}}
    times = []
    batches = []
    for _ in range(steps):
        step = [rng.choice(lengths) for _ in range(global_batch)]
        batches.append(step)
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
        if fixed is not None:
            out["fixed_s"] += planner.plan_fixed(step, fixed).total_seconds
        if planner.max_context:
            out["padded_s"] += padded_static_seconds(planner, len(pieces))
    times.sort()
    out["plan_ms"] = times[len(times) // 2] * 1e3 if times else 0.0
    if static_run is not None:
        runs = static_run_seconds(planner, batches, **static_run)
        out["static_run"], out["static_run_s"] = min(runs.items(), key=lambda kv: kv[1])
    return out


def simulate_moving_home(planner_for, homes, lengths: Sequence[int], steps: int, global_batch: int, seed: int = 0,
                         window: int = 4, move_seconds=None, start: Optional[Sequence[Sequence[int]]] = None,
                         fixed=None) -> dict:
    """``simulate`` with a home that is chosen and moves (``hotswitch.planner.choose_home``).

    The first home is chosen over ``start`` (batches seen before the run, e.g. a probe drawn
    from the distribution; default: the first step's batch). After every step the home is
    chosen again over the last ``window`` batches, and moves when another saves more than
    ``move_seconds(a, b)`` over that window; each move's seconds are added to ``hot_s`` and
    ``move_s``. ``planner_for(h)``: the Planner with home h. Also returns ``homes`` (the home
    of every step), ``moves``, ``fixed_s`` and ``padded_s`` (as in ``simulate``, under the
    first home's planner). The steps are those ``simulate`` draws with the same seed."""
    rng = random.Random(seed)
    batches = [[rng.choice(lengths) for _ in range(global_batch)] for _ in range(steps)]
    from hotswitch.planner import choose_home
    recent = [list(b) for b in (start or batches[:1])][-window:]
    home, _ = choose_home(planner_for, homes, recent)
    out = {"steps": steps, "tokens": 0, "hot_s": 0.0, "static_s": 0.0, "switch_s": 0.0, "move_s": 0.0,
           "fixed_s": 0.0, "padded_s": 0.0, "moves": 0, "homes": [], "layouts": {}}
    times = []
    first = planner_for(home)
    for step in batches:
        planner = planner_for(home)
        out["homes"].append(planner.candidates[home].name)
        out["tokens"] += sum(p.length for p in planner.pieces(step))
        t0 = time.perf_counter()
        planned = planner.plan(step)
        times.append(time.perf_counter() - t0)
        out["hot_s"] += planned.total_seconds
        out["static_s"] += planned.best_static_seconds
        out["switch_s"] += switch_share(planned, planner)
        for ph in planned.phases:
            out["layouts"][ph.layout.name] = out["layouts"].get(ph.layout.name, 0) + 1
        if fixed is not None:
            out["fixed_s"] += first.plan_fixed(step, fixed).total_seconds
        if first.max_context:
            out["padded_s"] += padded_static_seconds(first, len(planned.pieces))
        recent = (recent + [step])[-window:]
        if len(out["homes"]) == steps:
            break  # no step left to gain from a move
        new, _ = choose_home(planner_for, homes, recent, current=home, move_seconds=move_seconds)
        if new != home:
            moved = move_seconds(home, new) if move_seconds else 0.0
            out["hot_s"] += moved
            out["move_s"] += moved
            out["switch_s"] += moved
            out["moves"] += 1
            home = new
    times.sort()
    out["plan_ms"] = times[len(times) // 2] * 1e3 if times else 0.0
    return out
