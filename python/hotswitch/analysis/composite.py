"""Concurrent heterogeneous layouts, priced by the cost model: the world cut into contiguous
groups of ranks, each group under its own layout running its own share of a step's sequences
at the same time, the step ending with one gradient reduction across the groups. Every figure
here is a prediction of the cost model, never a measurement.

A group of ``g`` ranks is priced as the same model on a world of ``g`` ranks (the same
compute, memory and collective terms, ZeRO over the group's data ranks), under the best of its
own candidate layouts (cp allowed) for its sequences with exact packing. A composite phase
lasts as long as its slowest group; on top come

- the gradient reduction across groups: each group's gradients reduced over the whole world
  as its layout replicated to the world would reduce them (the layout with dp scaled to the
  world), in place of the group's own reduction, the slowest group's;
- the parameters' switch from the home into the groups' layouts and back, estimated as the
  switch into that replicated layout (each group needs one copy), the dearest group's.

``composite_step`` searches the partitions of the world into at most ``max_groups`` groups of
power-of-two sizes, assigns the sequences longest first to the group whose estimated load
grows least (each to a group that holds it), rebalances on the exact times, and returns the
best partition against the best static layout of the whole world and our sequential plan.
"""

import itertools
import math
from typing import Dict, List, Optional, Sequence, Tuple

from hotswitch import _C
from hotswitch.planner import auto_candidates, switch_costs

__all__ = ["GroupModel", "composite_step", "exact_composite", "partitions"]


def partitions(world: int, max_groups: int, smallest: int = 1) -> List[Tuple[int, ...]]:
    """Multisets of power-of-two group sizes >= ``smallest`` summing to ``world``, largest
    first, with 2..max_groups groups."""
    sizes = [s for s in (2 ** k for k in range(world.bit_length())) if smallest <= s < world]
    out = []
    for n in range(2, max_groups + 1):
        for combo in itertools.combinations_with_replacement(sorted(sizes, reverse=True), n):
            if sum(combo) == world:
                out.append(combo)
    return out


class GroupModel:
    """The cost model of one group size: a planner over the group's own candidate layouts
    (switch costs zero: a group runs one layout per step), marginal per-sequence estimates for
    the assignment, and the exact time of a set of sequences under its best layout."""

    def __init__(self, model, hardware, group: int, gpus_per_node: int, max_context: int, max_cp: int,
                 recompute: Sequence[str]):
        self.size = group
        self.topology = _C.Topology(group, min(gpus_per_node, group))
        self.cost = _C.CostModel(model, hardware, self.topology, zero=True)
        self.candidates = auto_candidates(model, group, max_cp)
        n = len(self.candidates)
        self.planner = _C.Planner(self.cost, self.candidates, 0, [[0.0] * n for _ in range(n)], [0.0] * n,
                                  max_context=max_context, recompute=list(recompute), long_sequences="reject")
        self.longest = max([self.planner.micro_batch_budget(i) for i in range(n)] + [0])
        self._marginal: Dict[int, float] = {}
        # The group's own sequential hot plan: its home the best static layout for its longest
        # sequence, switch costs estimated.
        self.hot = None
        if self.longest >= 1 and n > 1:
            home = self.planner.plan([min(self.longest, max_context)]).best_static_candidate
            params, reduced, partial = switch_costs(model, hardware, self.topology, self.candidates, home,
                                                    method="estimate")
            self.hot = _C.Planner(self.cost, self.candidates, home, params, reduced, partial, max_context=max_context,
                                  recompute=list(recompute), long_sequences="reject")

    def holds(self, length: int) -> bool:
        return length <= self.longest

    def marginal(self, length: int) -> float:
        """Estimated seconds one more sequence of ``length`` adds (lengths bucketed to 1/16
        octaves): the best static time of 8 such sequences less that of 8 one-token ones, / 8."""
        key = length if length < 64 else int(round(2 ** (round(16 * math.log2(length)) / 16)))
        if key not in self._marginal:
            t = self.planner.plan([min(key, self.longest)] * 8).best_static_seconds
            base = self.planner.plan([1] * 8).best_static_seconds
            self._marginal[key] = max((t - base) / 8, 1e-9)
        return self._marginal[key]

    def seconds(self, lengths: Sequence[int], hot: bool = False) -> Tuple[float, "_C.Layout", float]:
        """(exact seconds of ``lengths`` under the group's best static layout with its own
        gradient reduction, or with ``hot`` its sequential hot plan when faster; that
        (home) layout; its reduction seconds)."""
        plan = self.planner.plan(list(lengths))
        layout = self.candidates[plan.best_static_candidate]
        seconds = plan.best_static_seconds
        if hot and self.hot is not None:
            hot_plan = self.hot.plan(list(lengths))
            if hot_plan.total_seconds < seconds:
                seconds, layout = hot_plan.total_seconds, self.candidates[self.hot.home]
        reduce_s = self.cost.data_collective_seconds(layout, self.cost.gradient_bytes(layout), False)
        return seconds, layout, reduce_s


def _assign(lengths: Sequence[int], groups: Sequence[GroupModel], scale: Sequence[float]) -> Optional[List[List[int]]]:
    """Longest first, each sequence to the group (that holds it) whose load grows least."""
    loads = [0.0] * len(groups)
    out: List[List[int]] = [[] for _ in groups]
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        best = None
        for k, g in enumerate(groups):
            if not g.holds(lengths[i]):
                continue
            after = loads[k] + scale[k] * g.marginal(lengths[i])
            if best is None or after < best[0]:
                best = (after, k)
        if best is None:
            return None
        loads[best[1]] = best[0]
        out[best[1]].append(i)
    return out


def _improve(lengths, groups, assignment, total, cross_terms, hot_groups, moves):
    """First-improvement local search over the ``moves`` longest sequences: each moved to, or
    swapped with a sequence of, another group, kept when the composite time falls."""
    assignment = [list(a) for a in assignment]

    def evaluate(assign):
        if any(not a for a in assign):
            return None, None
        timed = [g.seconds([lengths[i] for i in a], hot_groups) for g, a in zip(groups, assign)]
        reduce_s, switch_s = cross_terms([(layout, g.size) for g, (_, layout, _) in zip(groups, timed)])
        return max(t - r for t, _, r in timed) + reduce_s + switch_s, timed

    total, timed = evaluate(assignment)
    where = {i: k for k, a in enumerate(assignment) for i in a}
    for i in sorted(where, key=lambda i: -lengths[i])[:moves]:
        for k in range(len(groups)):
            src = where[i]
            if k == src or not groups[k].holds(lengths[i]):
                continue
            options = [None] + [j for j in assignment[k] if groups[src].holds(lengths[j])][:4]
            for j in options:
                trial = [list(a) for a in assignment]
                trial[src].remove(i)
                trial[k].append(i)
                if j is not None:
                    trial[k].remove(j)
                    trial[src].append(j)
                t, tm = evaluate(trial)
                if t is not None and t < total - 1e-12:
                    assignment, total, timed = trial, t, tm
                    where[i] = k
                    if j is not None:
                        where[j] = src
                    break
            if where[i] != src:
                break
    return assignment, total, timed


def composite_step(model, hardware, world: int, gpus_per_node: int, lengths: Sequence[int], max_context: int,
                   max_cp: int = 8, max_groups: int = 4, recompute: Sequence[str] = ("none", "selective", "full"),
                   rounds: int = 3, cache: Optional[dict] = None, hot_groups: bool = True, moves: int = 16) -> dict:
    """The best composite layout for one step's ``lengths`` (truncated to ``max_context``).

    Returns ``static_s`` (the best static layout of the whole world, cp allowed),
    ``sequential_s`` (our sequential hot plan over the world's candidates, switch costs
    estimated, home = the best static layout), ``composite_s`` and its ``groups`` (size,
    layout, sequences, seconds), ``reduce_s`` and ``switch_s`` (the cross-group terms),
    and the speedups over both."""
    cache = {} if cache is None else cache
    lengths = [min(int(n), max_context) for n in lengths]
    key = ("world", world, gpus_per_node, max_context, max_cp)
    if key not in cache:
        topology = _C.Topology(world, min(gpus_per_node, world))
        candidates = auto_candidates(model, world, max_cp)
        n = len(candidates)
        cost = _C.CostModel(model, hardware, topology, zero=True)
        probe = _C.Planner(cost, candidates, 0, [[0.0] * n for _ in range(n)], [0.0] * n, max_context=max_context,
                           recompute=list(recompute))
        home = probe.plan([max_context]).best_static_candidate
        params, reduced, partial = switch_costs(model, hardware, topology, candidates, home, method="estimate")
        planner = _C.Planner(cost, candidates, home, params, reduced, partial, max_context=max_context,
                             recompute=list(recompute))
        cache[key] = (topology, candidates, cost, planner, home, params)
    topology, candidates, cost, planner, home, params = cache[key]
    plan = planner.plan(lengths)
    static_s, sequential_s = plan.best_static_seconds, plan.total_seconds
    names = [c.name for c in candidates]

    def group_model(size):
        gk = ("group", size, gpus_per_node, max_context, max_cp)
        if gk not in cache:
            cache[gk] = GroupModel(model, hardware, size, gpus_per_node, max_context, max_cp, recompute)
        return cache[gk]

    def cross_terms(layouts_sizes):
        """(reduction, switch) seconds across groups: the dearest group's, its layout scaled to the world."""
        reduce_s = switch_s = 0.0
        for layout, size in layouts_sizes:
            wide = _C.Layout(dp=world // (layout.tp * layout.pp * layout.cp), tp=layout.tp, pp=layout.pp, cp=layout.cp)
            reduce_s = max(reduce_s, cost.data_collective_seconds(wide, cost.gradient_bytes(wide), False))
            if wide.name in names:
                j = names.index(wide.name)
                there_and_back = params[home][j] + params[j][home]
            else:
                pair = switch_costs(model, hardware, topology, [candidates[home], wide], 0, method="estimate")[0]
                there_and_back = pair[0][1] + pair[1][0]
            switch_s = max(switch_s, there_and_back)
        return reduce_s, switch_s

    best = None
    for sizes in partitions(world, max_groups):
        groups = [group_model(s) for s in sizes]
        if max(lengths) > max(g.longest for g in groups):
            continue
        scale = [1.0] * len(groups)
        for _ in range(rounds):
            assignment = _assign(lengths, groups, scale)
            if assignment is None or any(not a for a in assignment):
                break
            timed = [g.seconds([lengths[i] for i in a], hot_groups) for g, a in zip(groups, assignment)]
            own = [t - r for t, _, r in timed]
            reduce_s, switch_s = cross_terms([(layout, g.size) for g, (_, layout, _) in zip(groups, timed)])
            total = max(own) + reduce_s + switch_s
            if best is None or total < best["composite_s"]:
                best = {"composite_s": total, "reduce_s": reduce_s, "switch_s": switch_s,
                        "groups": [{"size": g.size, "layout": layout.name, "sequences": len(a),
                                    "tokens": sum(lengths[i] for i in a), "seconds": o}
                                   for g, a, (_, layout, _), o in zip(groups, assignment, timed, own)]}
            # Local search on exact times: move each of the longest sequences to another group
            # (or swap it with one there) when that shortens the slowest group.
            assignment, total, timed = _improve(lengths, groups, assignment, total, cross_terms, hot_groups, moves)
            own = [t - r for t, _, r in timed]
            if total < best["composite_s"]:
                reduce_s, switch_s = cross_terms([(layout, g.size) for g, (_, layout, _) in zip(groups, timed)])
                best = {"composite_s": total, "reduce_s": reduce_s, "switch_s": switch_s,
                        "groups": [{"size": g.size, "layout": layout.name, "sequences": len(a),
                                    "tokens": sum(lengths[i] for i in a), "seconds": o}
                                   for g, a, (_, layout, _), o in zip(groups, assignment, timed, own)]}
            # Rebalance: scale each group's estimates by how far its exact time is from the mean.
            mean = sum(own) / len(own)
            scale = [s * (o / mean) ** 0.5 if mean > 0 else s for s, o in zip(scale, own)]
    out = {"static_s": static_s, "sequential_s": sequential_s, "best_static": names[plan.best_static_candidate],
           "tokens": sum(lengths)}
    if best is None:
        out.update(composite_s=None, speedup_vs_static=1.0, speedup_vs_sequential=1.0, groups=None)
        return out
    out.update(best)
    composite = min(best["composite_s"], static_s)  # the planner keeps the best of composite and static
    out["speedup_vs_static"] = static_s / composite
    out["speedup_vs_sequential"] = sequential_s / composite
    return out


def exact_composite(model, hardware, world: int, gpus_per_node: int, lengths: Sequence[int], max_context: int,
                    max_cp: int = 8, max_groups: int = 3, recompute: Sequence[str] = ("none", "selective", "full"),
                    hot_groups: bool = True, cache: Optional[dict] = None) -> dict:
    """The exhaustive reference of ``composite_step`` for a handful of sequences: every
    partition and every assignment of the sequences to its groups, each group timed exactly,
    with the same cross-group terms. Returns ``composite_s`` and ``groups`` (size, sequence
    indices)."""
    cache = {} if cache is None else cache
    lengths = [min(int(n), max_context) for n in lengths]
    heuristic = composite_step(model, hardware, world, gpus_per_node, lengths, max_context, max_cp, max_groups,
                               recompute, cache=cache, hot_groups=hot_groups)
    topology, candidates, cost, planner, home, params = cache[("world", world, gpus_per_node, max_context, max_cp)]
    names = [c.name for c in candidates]
    best = None
    for sizes in partitions(world, max_groups):
        groups = [cache.setdefault(("group", s, gpus_per_node, max_context, max_cp),
                                   GroupModel(model, hardware, s, gpus_per_node, max_context, max_cp, recompute))
                  for s in sizes]
        timed: Dict[Tuple[int, Tuple[int, ...]], tuple] = {}
        for choice in itertools.product(range(len(groups)), repeat=len(lengths)):
            members = [tuple(i for i, c in enumerate(choice) if c == k) for k in range(len(groups))]
            if any(not m for m in members) or any(not groups[k].holds(lengths[i]) for k, m in enumerate(members)
                                                  for i in m):
                continue
            parts = []
            for k, m in enumerate(members):
                key = (k, m)
                if key not in timed:
                    timed[key] = groups[k].seconds([lengths[i] for i in m], hot_groups)
                parts.append(timed[key])
            own = max(t - r for t, _, r in parts)
            reduce_s = switch_s = 0.0
            for _, layout, _ in parts:
                wide = _C.Layout(dp=world // (layout.tp * layout.pp * layout.cp), tp=layout.tp, pp=layout.pp,
                                 cp=layout.cp)
                reduce_s = max(reduce_s, cost.data_collective_seconds(wide, cost.gradient_bytes(wide), False))
                if wide.name in names:
                    j = names.index(wide.name)
                    switch_s = max(switch_s, params[home][j] + params[j][home])
            total = own + reduce_s + switch_s
            if best is None or total < best["composite_s"]:
                best = {"composite_s": total, "groups": [(g.size, m) for g, m in zip(groups, members)]}
    out = {"static_s": heuristic["static_s"], "heuristic_s": heuristic["composite_s"]}
    out.update(best or {"composite_s": None, "groups": None})
    if best is not None and heuristic["composite_s"] is not None:
        out["gap_vs_exact"] = heuristic["composite_s"] / best["composite_s"] - 1
    return out

