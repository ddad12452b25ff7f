"""The planner against the MILP reference (PuLP + CBC) on the same objective."""

import itertools
import random

import pytest

pytest.importorskip("pulp", reason="the MILP reference needs PuLP (pip install hotswitch[milp])")

import hotswitch as hs
from hotswitch.planner import build_planner
from hotswitch.analysis import milp


def _planner(names, home, seed, memory_gib=48, **options):
    """LLaMA-7B on one node of 8 A800s with a per-rank budget, random switch costs."""
    model = hs.ModelConfig.preset("llama-7b")
    hardware = hs.HardwareProfile.preset("a800")
    hardware.memory_bytes = memory_gib << 30
    topology = hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in names]
    rng = random.Random(seed)
    n = len(layouts)
    switch = [[0.0 if i == j else rng.uniform(0.01, 0.3) for j in range(n)] for i in range(n)]
    reduced = [0.0 if i == home else rng.uniform(0.0, 0.2) for i in range(n)]
    partial = [0.0 if i == home else rng.uniform(0.0, 0.3) for i in range(n)]
    cost = hs.CostModel(model, hardware, topology, zero=True)
    return hs.Planner(cost, layouts, home, switch, reduced, partial, exact_fallback=False, **options)


def _assignment(plan):
    out = [None] * len(plan.pieces)
    for ph in plan.phases:
        for i in ph.sequences:
            out[i] = ph.candidate
    assert None not in out
    return out


def _lengths(rng, n, cap):
    return [min(cap, int(rng.lognormvariate(7.5, 1.3)) + 1) for _ in range(n)]


def test_milp_matches_brute_force_on_tiny_cases():
    # Every assignment of 6 pieces to 3 layouts, evaluated by the planner's objective.
    for seed in range(3):
        planner = _planner(["dp8", "dp2tp4", "dp2tp2pp2"], home=seed % 3, seed=seed)
        cap = min(planner.micro_batch_budget(i) for i in range(3))
        lengths = _lengths(random.Random(seed), 6, cap)
        best = min(planner.objective(lengths, list(a)).total_seconds
                   for a in itertools.product(range(3), repeat=len(lengths)))
        result = milp.solve(planner, lengths, time_limit=60)
        assert result["optimal"], result["status"]
        assert result["objective_s"] == pytest.approx(best, rel=1e-6)
        ours = planner.objective(lengths, _assignment(planner.plan(lengths))).total_seconds
        assert ours >= best * (1 - 1e-9)


@pytest.mark.parametrize("seed", range(5))
def test_planner_is_near_the_milp_optimum(seed):
    names = ["dp8", "dp4tp2", "dp2tp4", "tp8", "dp4pp2"]
    planner = _planner(names, home=seed % len(names), seed=seed)
    rng = random.Random(100 + seed)
    holds = max(planner.micro_batch_budget(i) for i in range(len(names)))
    lengths = _lengths(rng, rng.choice([17, 24, 29]), holds)
    plan = planner.plan(lengths)
    mine = _assignment(plan)
    ours = planner.objective(lengths, mine)
    assert ours.total_seconds == pytest.approx(plan.objective_seconds, rel=1e-9)
    assert plan.objective_seconds <= plan.program_seconds * (1 + 1e-9)
    result = milp.solve(planner, lengths, time_limit=120)
    assert result["optimal"], result["status"]
    # The program's value of its assignment is the planner's objective of it...
    again = planner.objective(lengths, result["assignment"]).total_seconds
    assert again == pytest.approx(result["objective_s"], rel=1e-6)
    # ...no plan beats the proven optimum (that would be a bug in one of them)...
    assert ours.total_seconds >= result["objective_s"] * (1 - 1e-6)
    # ...and contiguous buckets lose little to arbitrary assignments.
    assert ours.total_seconds <= result["objective_s"] * 1.05


def test_milp_with_switch_costs_from_real_plans():
    model = hs.ModelConfig.preset("llama-7b")
    hardware = hs.HardwareProfile.preset("a800")
    hardware.memory_bytes = 48 << 30
    topology = hs.Topology(8, 8)
    layouts = [hs.Layout.parse(n) for n in ["dp8", "dp4tp2", "dp2tp4"]]
    planner = build_planner(model, hardware, topology, layouts, 0, method="plans", exact_fallback=False)
    lengths = _lengths(random.Random(7), 20, planner.micro_batch_budget(2))
    plan = planner.plan(lengths)
    result = milp.solve(planner, lengths, start=_assignment(plan))
    assert result["optimal"]
    assert plan.objective_seconds >= result["objective_s"] * (1 - 1e-6)
    assert planner.objective(lengths, result["assignment"]).total_seconds == pytest.approx(result["objective_s"], rel=1e-6)


def test_bad_input_names_the_piece():
    planner = _planner(["dp8", "dp2tp4"], home=0, seed=0)
    with pytest.raises(ValueError, match="piece 1 has length 0"):
        milp.solve(planner, [5, 0])
    too_long = max(planner.micro_batch_budget(i) for i in range(2)) + 1
    with pytest.raises(ValueError, match=f"length {too_long} fits no candidate"):
        milp.solve(planner, [5, too_long])
    with pytest.raises(ValueError, match="at least one piece"):
        milp.solve(planner, [])
    with pytest.raises(ValueError, match="does not fit candidate 0"):
        planner.objective([planner.micro_batch_budget(0) + 1], [0])
    with pytest.raises(ValueError, match="outside the candidates"):
        planner.objective([5], [2])


def test_bound_of_a_step_cbc_does_not_prove():
    # 200 pieces over 5 layouts: CBC does not prove the optimum within a second here, and its
    # log's best bound lies below its best value (equal to it when proven).
    names = ["dp8", "dp4tp2", "dp2tp4", "tp8", "dp4pp2"]
    planner = _planner(names, home=0, seed=5)
    holds = max(planner.micro_batch_budget(i) for i in range(len(names)))
    lengths = _lengths(random.Random(5), 200, holds)
    result = milp.solve(planner, lengths, time_limit=1, start=_assignment(planner.plan(lengths)))
    assert result["bound_s"] is not None and result["objective_s"] is not None
    if result["optimal"]:
        assert result["bound_s"] == result["objective_s"]
    else:
        assert 0 < result["bound_s"] <= result["objective_s"] * (1 + 1e-9)


def test_bound_read_from_the_log():
    stopped = ("Cbc0010I After 0 nodes, 1 on tree, 2611902 best solution, best possible 2607338.1 (0.87 seconds)\n"
               "Result - Stopped on time limit\n\nObjective value:                2611902.00000000\n"
               "Lower bound:                    2607338.097\nGap:                            0.00\n")
    # The printed bound is rounded: half a unit of its last digit comes off.
    assert milp._log_bound(stopped, 0.5) == pytest.approx(2607338.0965 + 0.5, abs=1e-6)
    assert milp._log_bound(stopped.split("Result")[0], 0.0) == pytest.approx(2607338.05, abs=1e-6)
    assert milp._log_bound("Result - Stopped on time limit\n", 0.0) is None
