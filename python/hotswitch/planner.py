"""Builds a step ``Planner`` for a model: its candidate layouts and the seconds of every
switch it weighs, taken from the redistribution plans of the model's parameters and gradients
between the layouts (largest per-rank send over the link it crosses) or, for large worlds,
from their per-rank receive volumes (``SwitchEstimate``). Nothing runs on devices.

The dry run over these is ``python -m hotswitch.cli.plan``; simulations of many steps are in
``hotswitch.analysis.simulate``.
"""

from typing import Dict, List, Tuple

from hotswitch import _C
from hotswitch.redistribute import plan_switch
from hotswitch.specs import llama_tensor_set

__all__ = [
    "PLANS_UP_TO_WORLD",
    "auto_candidates",
    "build_planner",
    "check_candidates",
    "free_planner",
    "plan_choice",
    "redistribution_seconds",
    "switch_costs",
    "tensor_switch_costs",
]

def plan_choice(plan: "_C.StepPlan", names: List[str], min_gain: float) -> str:
    """One line saying why ``plan`` (a ``StepPlan``) runs what it runs: the planned phases, or
    one phase because the phases were not ``min_gain`` faster than it (predicted seconds of
    both sides). ``names``: the candidates' layout names, by index."""
    program, one = plan.program_plan_seconds, plan.one_phase_seconds
    if plan.single_phase_fallback:
        phase = plan.phases[0]
        return (f"one phase under {names[phase.candidate]} ({one:.3f} s): the planned phases ({program:.3f} s) "
                f"were {one / program - 1:+.1%} faster, not the {min_gain:.1%} that switching must gain")
    if one > 0:
        return (f"planned phases ({program:.3f} s): {one / program - 1:.1%} faster than one phase ({one:.3f} s), "
                f"above the {min_gain:.1%} margin")
    return f"planned phases ({program:.3f} s): no single layout holds the step or it is one phase already"


# Worlds up to this size get switch costs from real redistribution plans by default.
PLANS_UP_TO_WORLD = 64


def auto_candidates(model, world: int, max_cp: int = 1) -> List["_C.Layout"]:
    """Every layout of the world with cp <= ``max_cp`` that the model (a ``ModelConfig`` or
    ``TransformerConfig``: anything with ``validate(layout)``) divides: heads, query groups,
    FFN and layers."""
    out = []
    for layout in _C.Layout.enumerate(world, max_cp):
        try:
            model.validate(layout)
        except ValueError:
            continue
        out.append(layout)
    return out


def check_candidates(model, world: int, candidates, max_cp: int = 1) -> List["_C.Layout"]:
    """The planner's candidate layouts from ``"auto"`` (``auto_candidates`` with cp up to
    ``max_cp``) or a non-empty list of layouts or names like ``"dp2tp2"``, each checked against
    the world and the model. ValueError naming the layout for one that does not fit, is listed
    twice, or when no layout is left."""
    if candidates == "auto":
        out = auto_candidates(model, world, max_cp)
        if not out:
            raise ValueError(f"no layout of world {world} divides the model")
        return out
    if isinstance(candidates, str) or not isinstance(candidates, (list, tuple)) or not candidates:
        raise ValueError(f'candidates must be "auto" or a non-empty list of layouts, got {candidates!r}')
    out = []
    for c in candidates:
        layout = _C.Layout.parse(c) if isinstance(c, str) else c
        if not isinstance(layout, _C.Layout):
            raise ValueError(f"candidate {c!r} is not a layout or layout name")
        try:
            layout.validate(world)
            model.validate(layout)
        except ValueError as e:
            raise ValueError(f"candidate layout {layout.name}: {e}") from None
        if layout.name in [l.name for l in out]:
            raise ValueError(f"candidate layout {layout.name} is listed twice")
        out.append(layout)
    return out


def redistribution_seconds(plan, hardware, topology) -> float:
    """The slowest rank of a plan's exchange: per rank, what it sends (and, separately, what
    it receives) within its node over the intra-node bandwidth plus across nodes over the
    inter-node bandwidth; links are full duplex."""
    world, per_node = topology.world, topology.ranks_per_node
    load = [[0.0, 0.0] for _ in range(world)]  # [send, recv] seconds
    for src, dst, size, _ in plan.messages():
        bandwidth = hardware.intra_node_bandwidth if src // per_node == dst // per_node \
            else hardware.inter_node_bandwidth
        load[src][0] += size / bandwidth
        load[dst][1] += size / bandwidth
    return max((max(r) for r in load), default=0.0)


def switch_costs(model, hardware, topology, candidates, home, zero=True, method="auto",
                 cache=None) -> Tuple[List[List[float]], List[float], List[float]]:
    """Seconds of the switches the planner weighs, per candidate layout, for a ``ModelConfig``:
    bf16 parameters (fp32 when the model's parameters are), fp32 gradients, reduced ones
    ZeRO-sharded over the phase's data group when ``zero``. See ``tensor_switch_costs``."""
    shape = (model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads,
             model.num_query_groups, model.vocab_size)
    params = llama_tensor_set(*shape, dtype="bfloat16" if model.param_bytes == 2 else "float32")
    grads = llama_tensor_set(*shape, dtype="float32")
    kind = "zero" if zero else "sharded"
    return tensor_switch_costs(params, grads, hardware, topology, candidates, home, home_placement=kind,
                               reduced_placement=kind, method=method, cache=cache)


def tensor_switch_costs(params, grads, hardware, topology, candidates, home, home_placement="sharded",
                        reduced_placement="sharded", method="auto",
                        cache=None) -> Tuple[List[List[float]], List[float], List[float]]:
    """Seconds of the switches the planner weighs, per candidate layout, for the tensor sets
    ``params`` and ``grads``.

    Returns ``(params, reduced_grads, partial_grads)``: ``params[i][j]`` moves the parameters
    from candidate i to j; ``reduced_grads[i]`` moves a phase's gradients, already reduced
    over candidate i's data group (in ``reduced_placement``), into the home layout's
    accumulator (in ``home_placement``); ``partial_grads[i]`` moves the unreduced summands
    there instead, summed on arrival. Both are 0 for the home layout (index ``home``).
    ``method``: ``"plans"`` (the redistribution plan's slowest rank: its sends, or its receives,
    over the links they cross), ``"estimate"`` (the slowest rank's receives alone,
    ``SwitchEstimate``; no plan is built), or ``"auto"`` (plans up to ``PLANS_UP_TO_WORLD``
    ranks).
    """
    if method not in ("auto", "plans", "estimate"):
        raise ValueError(f"switch cost method must be auto, plans or estimate, got {method!r}")
    if method == "auto":
        method = "plans" if topology.world <= PLANS_UP_TO_WORLD else "estimate"
    homel = candidates[home]
    if method == "plans":
        cache = _C.PlanCache() if cache is None else cache

        def seconds(ts, a, ka, b, kb):
            plan = plan_switch(ts, a, b, src_kind=ka, dst_kind=kb, topology=topology, cache=cache)
            return redistribution_seconds(plan, hardware, topology)
    else:
        placements: Dict[tuple, "_C.Placement"] = {}

        def placement(ts, layout, kind):
            key = (id(ts), layout.name, kind)
            if key not in placements:
                placements[key] = _C.Placement(ts, layout, kind)
            return placements[key]

        def seconds(ts, a, ka, b, kb):
            est = _C.SwitchEstimate.of(ts, placement(ts, a, ka), placement(ts, b, kb), topology)
            return est.seconds(hardware.intra_node_bandwidth, hardware.inter_node_bandwidth)

    switch = [[0.0 if i == j else seconds(params, a, "sharded", b, "sharded")
               for j, b in enumerate(candidates)] for i, a in enumerate(candidates)]
    reduced = [0.0 if i == home else seconds(grads, l, reduced_placement, homel, home_placement)
               for i, l in enumerate(candidates)]
    partial = [0.0 if i == home else seconds(grads, l, "partial", homel, home_placement)
               for i, l in enumerate(candidates)]
    return switch, reduced, partial


def build_planner(model, hardware, topology, candidates, home, zero=True, method="auto", costs=None,
                  **options) -> "_C.Planner":
    """A Planner over the candidates with switch costs from ``switch_costs`` (or ``costs``,
    its result). ``options`` go to ``Planner`` (max_context, long_sequences, ...)."""
    switch, reduced, partial = costs or switch_costs(model, hardware, topology, candidates, home, zero, method)
    return _C.Planner(_C.CostModel(model, hardware, topology, zero=zero), candidates, home, switch, reduced,
                      partial, **options)


def free_planner(planner: "_C.Planner", **options) -> "_C.Planner":
    """The same planner with free switches: the upper bound of bucketing."""
    n = len(planner.candidates)
    options.setdefault("recompute", planner.recompute)
    return _C.Planner(planner.cost, planner.candidates, planner.home, [[0.0] * n for _ in range(n)], [0.0] * n,
                      [0.0] * n, **options)
