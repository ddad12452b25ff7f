"""Builds a step ``Planner`` for a model: its candidate layouts and the seconds of every
switch it weighs, taken from the redistribution plans of the model's parameters and gradients
between the layouts (largest per-rank send over the link it crosses) or, for large worlds,
from their per-rank receive volumes (``SwitchEstimate``). Nothing runs on devices.

The dry run over these is ``python -m hotswitch.cli.plan``; simulations of many steps are in
``hotswitch.analysis.simulate``.
"""

import json
import os
from typing import Callable, Dict, List, Optional, Sequence, Tuple, TypeVar, Union

from hotswitch import _C
from hotswitch.redistribute import plan_switch
from hotswitch.specs import llama_tensor_set

T = TypeVar("T")

__all__ = [
    "PLANS_UP_TO_WORLD",
    "auto_candidates",
    "auto_graph_layouts",
    "build_planner",
    "choose_home",
    "choose_model_orders",
    "choose_orders",
    "home_move_seconds",
    "layout_orders",
    "order_keeps_locality",
    "check_candidates",
    "fixed_plan_entries",
    "keep_graph_layouts",
    "free_planner",
    "load_fixed_plan",
    "plan_choice",
    "redistribution_seconds",
    "switch_costs",
    "tensor_switch_costs",
    "with_fixed_layouts",
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
    if 0 < one < 1e29:  # 1e30: a one-phase plan the step cannot run (a layout left out)
        return (f"planned phases ({program:.3f} s): {one / program - 1:.1%} faster than one phase ({one:.3f} s), "
                f"above the {min_gain:.1%} margin")
    return f"planned phases ({program:.3f} s): no single layout holds the step or it is one phase already"


_RECOMPUTE = ("none", "selective", "full")


def load_fixed_plan(source: Union[str, os.PathLike, Sequence], world: Optional[int], model=None,
                    max_context: int = None) -> List[Tuple[int, "_C.Layout", str]]:
    """A fixed plan, the bucket bounds and layouts a HotSPa user writes by hand, from a JSON
    file (or the list it holds): entries ``[upper_bound, layout, recompute]`` or
    ``{"upper_bound": 4096, "layout": "dp8", "recompute": "none"}`` (recompute optional,
    default ``"none"``), bounds increasing. A length runs under the first entry whose bound
    holds it. Returns ``(bound, Layout, recompute)`` per entry. ValueError naming the entry for
    a malformed entry, bounds that do not increase, a layout that does not fit ``world`` or the
    model (``model.validate``), or, with ``max_context``, a last bound below it (lengths left
    uncovered). Whether each layout holds its bound in memory is the planner's check
    (``Planner.plan_fixed``). ``world`` None: the entries' form alone is checked."""
    where = "fixed plan"
    if isinstance(source, (str, os.PathLike)):
        where = f"fixed plan {os.fspath(source)}"
        try:
            with open(source) as f:
                source = json.load(f)
        except OSError as e:
            raise ValueError(f"{where}: cannot read it ({e.strerror})") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not JSON ({e})") from None
    if not isinstance(source, (list, tuple)) or not source:
        raise ValueError(f"{where}: expected a non-empty JSON list of [upper_bound, layout, recompute] entries, "
                         f"got {source!r}")
    out = []
    for k, entry in enumerate(source):
        if isinstance(entry, dict):
            unknown = sorted(set(entry) - {"upper_bound", "layout", "recompute"})
            if unknown or "upper_bound" not in entry or "layout" not in entry:
                raise ValueError(f"{where}, entry {k} {entry!r}: expected the keys upper_bound, layout and "
                                 f"optionally recompute")
            bound, name, recompute = entry["upper_bound"], entry["layout"], entry.get("recompute", "none")
        elif isinstance(entry, (list, tuple)) and len(entry) in (2, 3):
            bound, name, recompute = (*entry, "none")[:3]
        else:
            raise ValueError(f"{where}, entry {k} {entry!r}: expected [upper_bound, layout, recompute]")
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise ValueError(f"{where}, entry {k} {entry!r}: the upper bound must be an integer >= 1, got {bound!r}")
        if out and bound <= out[-1][0]:
            raise ValueError(f"{where}, entry {k} {entry!r}: upper bounds must increase, {bound} follows {out[-1][0]}")
        if recompute not in _RECOMPUTE:
            raise ValueError(f"{where}, entry {k} {entry!r}: recompute must be one of {', '.join(_RECOMPUTE)}, "
                             f"got {recompute!r}")
        if not isinstance(name, str):
            raise ValueError(f"{where}, entry {k} {entry!r}: the layout must be a name like \"dp2tp4\", got {name!r}")
        try:
            layout = _C.Layout.parse(name)
            if world is not None:
                layout.validate(world)
            if model is not None:
                model.validate(layout)
        except ValueError as e:
            raise ValueError(f"{where}, entry {k} {entry!r}: {e}") from None
        out.append((bound, layout, recompute))
    if max_context is not None and out[-1][0] < max_context:
        raise ValueError(f"{where}: the last upper bound {out[-1][0]} leaves lengths up to the max context "
                         f"{max_context} uncovered")
    return out


def fixed_plan_entries(fixed, candidates) -> List[Tuple[int, int, str]]:
    """``Planner.plan_fixed``'s entries, ``(bound, candidate index, recompute)``, for a fixed
    plan from ``load_fixed_plan`` over the planner's candidate layouts. ValueError naming the
    layout when it is not a candidate."""
    names = [c.name for c in candidates]
    out = []
    for bound, layout, recompute in fixed:
        if layout.name not in names:
            raise ValueError(f"fixed plan layout {layout.name} is not among the candidates {names}")
        out.append((bound, names.index(layout.name), recompute))
    return out


def with_fixed_layouts(candidates, fixed) -> List["_C.Layout"]:
    """The candidates plus every layout of a fixed plan that is not among them."""
    out = list(candidates)
    for _, layout, _ in fixed:
        if layout.name not in [c.name for c in out]:
            out.append(layout)
    return out


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


def _shape(model) -> tuple:
    """``llama_tensor_set``'s arguments for a ``ModelConfig``."""
    return (model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads,
            model.num_query_groups, model.vocab_size)


def switch_costs(model, hardware, topology, candidates, home, zero=True, method="auto",
                 cache=None, params_switch=None) -> Tuple[List[List[float]], List[float], List[float]]:
    """Seconds of the switches the planner weighs, per candidate layout, for a ``ModelConfig``:
    bf16 parameters (fp32 when the model's parameters are), fp32 gradients, reduced ones
    ZeRO-sharded over the phase's data group when ``zero``. See ``tensor_switch_costs``."""
    shape = _shape(model)
    params = llama_tensor_set(*shape, dtype="bfloat16" if model.param_bytes == 2 else "float32")
    grads = llama_tensor_set(*shape, dtype="float32")
    kind = "zero" if zero else "sharded"
    return tensor_switch_costs(params, grads, hardware, topology, candidates, home, home_placement=kind,
                               reduced_placement=kind, method=method, cache=cache, params_switch=params_switch)


def tensor_switch_costs(params, grads, hardware, topology, candidates, home, home_placement="sharded",
                        reduced_placement="sharded", method="auto", cache=None,
                        params_switch=None) -> Tuple[List[List[float]], List[float], List[float]]:
    """Seconds of the switches the planner weighs, per candidate layout, for the tensor sets
    ``params`` and ``grads``.

    Returns ``(params, reduced_grads, partial_grads)``: ``params[i][j]`` moves the parameters
    from candidate i to j; ``reduced_grads[i]`` moves a phase's gradients, already reduced
    over candidate i's data group (in ``reduced_placement``), into the home layout's
    accumulator (in ``home_placement``); ``partial_grads[i]`` moves the unreduced summands
    there instead, summed on arrival. Both are 0 for the home layout (index ``home``).
    ``params_switch``: the ``params`` matrix of an earlier call over the same candidates,
    reused (it does not depend on the home).
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

    if params_switch is not None:
        if len(params_switch) != len(candidates) or any(len(row) != len(candidates) for row in params_switch):
            raise ValueError(f"params_switch must be a {len(candidates)}x{len(candidates)} matrix")
        switch = [list(row) for row in params_switch]
    else:
        switch = [[0.0 if i == j else seconds(params, a, "sharded", b, "sharded")
                   for j, b in enumerate(candidates)] for i, a in enumerate(candidates)]
    reduced = [0.0 if i == home else seconds(grads, l, reduced_placement, homel, home_placement)
               for i, l in enumerate(candidates)]
    partial = [0.0 if i == home else seconds(grads, l, "partial", homel, home_placement)
               for i, l in enumerate(candidates)]
    return switch, reduced, partial


def home_move_seconds(model, hardware, topology, candidates, src: int, dst: int, zero=True, method="auto",
                      cache=None) -> float:
    """Seconds to move the home from candidate ``src`` to ``dst``: the fp32 master weights and
    Adam's two moments (three fp32 copies of the parameters), ZeRO-sharded over the data group
    when ``zero``, each switched between the two homes' placements. 0 when src == dst."""
    if src == dst:
        return 0.0
    shape = _shape(model)
    masters = llama_tensor_set(*shape, dtype="float32")
    kind = "zero" if zero else "sharded"
    a, b = candidates[src], candidates[dst]
    if method == "auto":
        method = "plans" if topology.world <= PLANS_UP_TO_WORLD else "estimate"
    if method == "plans":
        plan = plan_switch(masters, a, b, src_kind=kind, dst_kind=kind, topology=topology,
                           cache=_C.PlanCache() if cache is None else cache)
        one = redistribution_seconds(plan, hardware, topology)
    else:
        est = _C.SwitchEstimate.of(masters, _C.Placement(masters, a, kind), _C.Placement(masters, b, kind), topology)
        one = est.seconds(hardware.intra_node_bandwidth, hardware.inter_node_bandwidth)
    return 3 * one


def choose_home(planner_for, homes, batches, current=None, move_seconds=None,
                horizon: Optional[int] = None) -> Tuple[int, Dict[int, float]]:
    """The home layout from the expected cost over a window of recent batches.

    ``planner_for(h)``: the Planner whose home is candidate h; ``homes``: the candidate indices
    that may be home; ``batches``: the window, lists of lengths. The predicted seconds of every
    home are the sum of its planned steps (``StepPlan.total_seconds``) over the window. Without
    ``current`` the cheapest home is returned; with it, another home only when its saving over
    the window exceeds ``move_seconds(current, h)``, the seconds of moving there
    (``home_move_seconds``); with ``horizon``, when its mean saving per batch over ``horizon``
    batches does (a window not yet full still speaks for a full one). Returns ``(home, seconds per home)``. ValueError for no homes, an
    empty window, or a window no home can plan (naming the planner's reason)."""
    homes = list(homes)
    if not homes:
        raise ValueError("choose_home needs at least one candidate home")
    if not batches:
        raise ValueError("choose_home needs a window of at least one batch")
    totals, error = {}, None
    for h in homes:
        planner = planner_for(h)
        try:
            totals[h] = sum(planner.plan(batch).total_seconds for batch in batches)
        except ValueError as e:
            error = error or e  # a home whose planner cannot plan the window
    if not totals:
        raise ValueError(f"no candidate home can plan the window's batches: {error}")
    best = min(totals, key=lambda h: (totals[h], h))
    if current is None or current not in totals or best == current:
        return best, totals
    if horizon is not None and (isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1):
        raise ValueError(f"choose_home's horizon must be a number of batches >= 1, got {horizon!r}")
    per = (horizon or len(batches)) / len(batches)
    gain = {h: (totals[current] - t) * per - (move_seconds(current, h) if move_seconds else 0.0)
            for h, t in totals.items()}
    moved = max(gain, key=lambda h: (gain[h], -h))
    return (moved if gain[moved] > 0 else current), totals


_AXES = ("tp", "cp", "dp", "pp")


def layout_orders(layout: "_C.Layout") -> List["_C.Layout"]:
    """Every rank order of ``layout``'s degrees that places ranks differently, ``layout``
    itself first: the permutations of its axes of degree > 1 (an axis of degree 1 places
    nothing), one layout per distinct placement of ranks."""
    import itertools

    def placement(l):
        return tuple(tuple(sorted(l.coord(r).items())) for r in range(l.world))
    used = [a for a in _AXES if getattr(layout, a) > 1]
    rest = [a for a in _AXES if a not in used]
    out, seen = [layout], {placement(layout)}
    for perm in itertools.permutations(used):
        variant = _C.Layout(dp=layout.dp, tp=layout.tp, pp=layout.pp, cp=layout.cp, order="-".join(list(perm) + rest))
        key = placement(variant)
        if key not in seen:
            seen.add(key)
            out.append(variant)
    return out


def _nodes_per_group(layout, axis: str, topology) -> int:
    """The most nodes one of ``layout``'s groups along ``axis`` spans."""
    return max(len({topology.node(r) for r in group}) for group in layout.groups(axis))


def order_keeps_locality(variant, layout, topology) -> bool:
    """Whether ``variant``'s tensor-, context- and pipeline-parallel groups span no more nodes
    than ``layout``'s: a rank order may save switch bytes, never move a layer's collectives or
    its pipeline's sends off the node."""
    return all(_nodes_per_group(variant, a, topology) <= _nodes_per_group(layout, a, topology)
               for a in ("tp", "cp", "pp"))


def choose_orders(params, grads, hardware, topology, candidates, home, home_placement="sharded",
                  reduced_placement="sharded", method="auto", cache=None) -> Tuple[List["_C.Layout"], List[float]]:
    """Per candidate the rank order (``layout_orders``) whose use costs the least switch
    seconds to and from the home, given the node size: the parameters switched in and back,
    plus the phase's gradients into the home accumulator (the cheaper of reduced and partial),
    priced as ``tensor_switch_costs`` prices them. Only orders whose tp, cp and pp groups span
    no more nodes than the candidate's own are weighed (``order_keeps_locality``), so the
    phase's own run is not made slower. The home keeps its order; ties keep the candidate's.
    Returns ``(candidates, seconds saved per candidate)``."""
    homel = candidates[home]
    cache = _C.PlanCache() if cache is None else cache
    out, saved = [], []
    for i, layout in enumerate(candidates):
        if i == home:
            out.append(layout)
            saved.append(0.0)
            continue
        best, best_s, first_s = None, None, None
        for variant in layout_orders(layout):
            if not order_keeps_locality(variant, layout, topology):
                continue
            sw, reduced, partial = tensor_switch_costs(params, grads, hardware, topology, [homel, variant], 0,
                                                       home_placement=home_placement,
                                                       reduced_placement=reduced_placement, method=method,
                                                       cache=cache)
            seconds = sw[0][1] + sw[1][0] + min(reduced[1], partial[1])
            if first_s is None:
                first_s = seconds
            if best_s is None or seconds < best_s * (1 - 1e-9):
                best, best_s = variant, seconds
        out.append(best)
        saved.append(first_s - best_s)
    return out, saved


def choose_model_orders(model, hardware, topology, candidates, home, zero=True, method="auto",
                        cache=None) -> Tuple[List["_C.Layout"], List[float]]:
    """``choose_orders`` for a ``ModelConfig``'s tensors, as ``switch_costs`` prices them."""
    shape = _shape(model)
    params = llama_tensor_set(*shape, dtype="bfloat16" if model.param_bytes == 2 else "float32")
    grads = llama_tensor_set(*shape, dtype="float32")
    kind = "zero" if zero else "sharded"
    return choose_orders(params, grads, hardware, topology, candidates, home, home_placement=kind,
                         reduced_placement=kind, method=method, cache=cache)


def build_planner(model, hardware, topology, candidates, home, zero=True, method="auto", costs=None,
                  graphs: Optional[dict] = None, tp_overlap: float = 1.0, recompute_chunk_layers: int = 0,
                  **options) -> "_C.Planner":
    """A Planner over the candidates with switch costs from ``switch_costs`` (or ``costs``,
    its result). ``graphs``: the cost model's CUDA graph options (``RuntimeConfig.graph_options``);
    ``tp_overlap``: its share of the tp backward's collectives hidden (``RuntimeConfig.tp_overlap``);
    ``recompute_chunk_layers``: its full recomputation's early-stopping chunks
    (``RuntimeConfig.recompute_chunk_layers``; 0: Megatron-LM's whole rerun).
    ``options`` go to ``Planner`` (max_context, long_sequences, ...)."""
    switch, reduced, partial = costs or switch_costs(model, hardware, topology, candidates, home, zero, method)
    cost = _C.CostModel(model, hardware, topology, zero=zero, tp_overlap=tp_overlap,
                        recompute_chunk_layers=recompute_chunk_layers, **(graphs or {}))
    return _C.Planner(cost, candidates, home, switch, reduced, partial, **options)


def auto_graph_layouts(planner: "_C.Planner", batches: Sequence[Sequence[int]],
                       fixed_entries: Optional[Sequence[Tuple[int, int, str]]] = None) -> List[str]:
    """The layouts ``graph_layouts="auto"`` names: ``planner``'s home and every layout its
    plans of ``batches`` (sequence lengths per batch) run, by name in candidate order; with
    ``fixed_entries`` (``fixed_plan_entries``) its fixed plans' layouts. ``planner`` plans
    without graph buckets (``ValueError`` otherwise): under graphs every capturing layout's
    weight copies take memory from all, which is what the choice is for."""
    if planner.cost.graph_buckets:
        raise ValueError(f"auto_graph_layouts needs a planner without graph buckets, got one with "
                         f"{list(planner.cost.graph_buckets)}")
    if isinstance(batches, (str, bytes)) or not isinstance(batches, (list, tuple)) or not batches:
        raise ValueError(f"batches must be a non-empty list of batches of sequence lengths, got {batches!r}")
    used = {planner.home}
    for batch in batches:
        plan = planner.plan(list(batch)) if fixed_entries is None else planner.plan_fixed(list(batch), fixed_entries)
        used.update(ph.candidate for ph in plan.phases)
    return [c.name for i, c in enumerate(planner.candidates) if i in used]


def keep_graph_layouts(chosen: Sequence[str], home: str, check: Callable[[List[str]], T]
                       ) -> Tuple[List[str], T, List[Tuple[List[str], ValueError]]]:
    """``graph_layouts="auto"``'s fallback, as the runtime and the dry run apply it: of
    ``chosen`` (``auto_graph_layouts``), the ``home`` alone, and none, the first set whose
    weight copies ``check(names)`` accepts; ``check`` raises ``ValueError`` naming what they
    break (the max context, a fixed plan's bound). Returns that set, what ``check`` returned
    for it, and each set refused before it with its error. Raises the last error when even
    none is refused."""
    refused: List[Tuple[List[str], ValueError]] = []
    for names in [list(chosen)] + ([[home]] if list(chosen) != [home] else []):
        if not names:
            break
        try:
            return names, check(names), refused
        except ValueError as e:
            refused.append((names, e))
    return [], check([]), refused


def free_planner(planner: "_C.Planner", **options) -> "_C.Planner":
    """The same planner with free switches: the upper bound of bucketing."""
    n = len(planner.candidates)
    options.setdefault("recompute", planner.recompute)
    return _C.Planner(planner.cost, planner.candidates, planner.home, [[0.0] * n for _ in range(n)], [0.0] * n,
                      [0.0] * n, **options)
