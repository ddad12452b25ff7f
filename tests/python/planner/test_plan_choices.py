"""Fixed plans, the padded static baseline, the home chosen over a window and moved when it
pays, and rank orders chosen per candidate (hotswitch.planner, hotswitch.analysis.simulate)."""

import json
import math
import random

import pytest

from hotswitch import _C
from hotswitch import planner as planning
from hotswitch.analysis.simulate import padded_static_seconds, simulate, simulate_moving_home
from hotswitch.cli import plan as cli
from hotswitch.redistribute import plan_switch

MODEL = _C.ModelConfig.preset("llama-7b")
HW = _C.HardwareProfile.preset("h100")
TOPO = _C.Topology(8, 8)
OPTIONS = dict(max_context=32768, long_sequences="truncate")
LENGTHS = [40, 200, 900, 1500, 3000, 5000, 9000, 15000, 30000]


@pytest.fixture(scope="module")
def setup():
    candidates = planning.auto_candidates(MODEL, 8)
    names = [c.name for c in candidates]
    params = planning.switch_costs(MODEL, HW, TOPO, candidates, 0)[0]
    planners = {}

    def planner_for(h):
        if h not in planners:
            costs = planning.switch_costs(MODEL, HW, TOPO, candidates, h, params_switch=params)
            planners[h] = planning.build_planner(MODEL, HW, TOPO, candidates, h, costs=costs, **OPTIONS)
        return planners[h]
    return candidates, names, planner_for


def batch(seed, n=64):
    rng = random.Random(seed)
    return [rng.choice(LENGTHS) for _ in range(n)]


# ----------------------------------------------------------------------------- fixed plans

def test_fixed_plan_runs_each_length_under_its_entry_and_is_priced_like_a_plan(setup):
    candidates, names, planner_for = setup
    planner = planner_for(names.index("dp2tp4"))
    fixed = planning.load_fixed_plan([[1000, "dp8"], [8000, "dp4tp2", "none"],
                                      {"upper_bound": 32768, "layout": "dp2tp4"}], 8, MODEL, 32768)
    entries = planning.fixed_plan_entries(fixed, candidates)
    lengths = batch(1)
    plan = planner.plan_fixed(lengths, entries)
    bounds = {"dp8": (0, 1000), "dp4tp2": (1000, 8000), "dp2tp4": (8000, 32768)}
    seen = set()
    for ph in plan.phases:
        lo, hi = bounds[ph.layout.name]
        assert all(lo < plan.pieces[i].length <= hi for i in ph.sequences)
        seen.update(ph.sequences)
    assert seen == set(range(len(lengths)))
    assert not plan.single_phase_fallback
    # The same total as the exact pieces of its phases: switches, runs and gradients.
    total = sum(ph.switch_in_seconds + ph.cost.run_seconds + ph.grad_seconds for ph in plan.phases)
    assert plan.total_seconds == pytest.approx(total + plan.switch_back_seconds)
    # Its objective is the planner's J of the same assignment.
    pieces = [p.length for p in plan.pieces]
    assignment = [next(names.index(l.name) for b, l, _ in fixed if s <= b) for s in pieces]
    assert plan.objective_seconds == pytest.approx(planner.objective(pieces, assignment).total_seconds)
    # The planner's own plan is never predicted slower than a hand-written one by its own J.
    assert planner.plan(lengths).objective_seconds <= plan.objective_seconds * (1 + 1e-9)


@pytest.mark.parametrize("entries, needle", [
    ([], "non-empty JSON list"),
    ([[4000, "dp8"], [4000, "dp4tp2"]], "entry 1"),
    ([[4000, "dp8"], [2000, "dp4tp2"]], "must increase"),
    ([[0, "dp8"]], "integer >= 1"),
    ([[32768, "dp3"]], "entry 0"),
    ([[32768, "dp4"]], "!= world(8)"),
    ([[32768, "dp8", "sometimes"]], "recompute must be one of"),
    ([[4000, "dp8"]], "uncovered"),
    ([{"bound": 4000, "layout": "dp8"}], "expected the keys"),
    ("no-such-plan.json", "cannot read it"),
    ({"upper_bound": 4000}, "non-empty JSON list"),
])
def test_bad_fixed_plans_are_refused_naming_the_entry(entries, needle):
    with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
        planning.load_fixed_plan(entries, 8, MODEL, 32768)


def test_a_fixed_layout_that_cannot_hold_its_bound_is_refused_by_the_planner(setup):
    candidates, names, planner_for = setup
    planner = planner_for(0)
    fixed = planning.load_fixed_plan([[32768, "dp8"]], 8, MODEL, 32768)
    with pytest.raises(ValueError, match=r"entry 0 \(up to 32768 tokens under dp8.*holds at most \d+ tokens"):
        planner.check_fixed_plan(planning.fixed_plan_entries(fixed, candidates))
    with pytest.raises(ValueError, match="longer than the fixed plan's last upper bound"):
        planner.plan_fixed([50, 5000], [(1000, names.index("dp8"), "none")])


def test_fixed_plan_file_in_the_dry_run_prints_it_beside_ours(tmp_path, capsys):
    lengths = tmp_path / "l.lengths"
    lengths.write_text("\n".join(str(n) for n in LENGTHS * 20) + "\n")
    plan = tmp_path / "fixed.json"
    plan.write_text(json.dumps([[2000, "dp8"], [32768, "dp2tp4"]]))
    assert cli.main(["--gpus", "8", "--hardware", "h100", "--lengths", str(lengths), "--global-batch", "64",
                     "--fixed-plan", str(plan), "--steps", "2"]) == 0
    out = capsys.readouterr().out
    assert f"fixed plan {plan}:" in out
    assert "planner's speedup over the fixed plan" in out and "speedup over padded static" in out
    assert "fixed plan: tokens/s" in out
    plan.write_text(json.dumps([[2000, "dp8"], [1000, "dp2tp4"]]))
    with pytest.raises(SystemExit):
        cli.main(["--gpus", "8", "--lengths", str(lengths), "--fixed-plan", str(plan)])
    assert "entry 1" in capsys.readouterr().err


# ----------------------------------------------------------------------------- padded static

def test_padded_static_is_the_best_static_layout_over_padded_sequences(setup):
    candidates, names, planner_for = setup
    planner = planner_for(0)
    padded = padded_static_seconds(planner, 16)
    assert padded == pytest.approx(planner.plan([32768] * 16).best_static_seconds)
    # Padding never makes a step cheaper than its packed best static layout.
    assert padded >= planner.plan(batch(2, 16)).best_static_seconds
    assert padded_static_seconds(planner, 16, 4096) < padded


# ----------------------------------------------------------------------------- home

def test_home_is_the_cheapest_over_the_window_and_moves_only_when_it_pays(setup):
    candidates, names, planner_for = setup
    window = [batch(s) for s in range(3)]
    homes = range(len(candidates))
    home, totals = planning.choose_home(planner_for, homes, window)
    assert totals[home] == min(totals.values())
    for h, t in totals.items():
        assert t == pytest.approx(sum(planner_for(h).plan(b).total_seconds for b in window))
    worst = max(totals, key=totals.get)
    gain = totals[worst] - totals[home]
    # From the worst home: moves when the move costs less than the window's saving, not otherwise.
    assert planning.choose_home(planner_for, homes, window, current=worst,
                                move_seconds=lambda a, b: 0.5 * gain)[0] != worst
    assert planning.choose_home(planner_for, homes, window, current=worst,
                                move_seconds=lambda a, b: 2 * gain)[0] == worst
    # A window of 3 batches speaking for a horizon of 6: the saving counts twice.
    assert planning.choose_home(planner_for, homes, window, current=worst,
                                move_seconds=lambda a, b: 1.5 * gain, horizon=6)[0] != worst
    assert planning.choose_home(planner_for, homes, window, current=worst,
                                move_seconds=lambda a, b: 2.5 * gain, horizon=6)[0] == worst
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match=f"horizon must be a number of batches >= 1, got {bad!r}"):
            planning.choose_home(planner_for, homes, window, current=worst, move_seconds=lambda a, b: 0.0,
                                 horizon=bad)
    with pytest.raises(ValueError, match="at least one batch"):
        planning.choose_home(planner_for, homes, [])
    with pytest.raises(ValueError, match="at least one candidate home"):
        planning.choose_home(planner_for, [], window)


def test_moving_a_home_costs_three_fp32_copies_of_the_masters(setup):
    candidates, names, _ = setup
    a, b = names.index("dp8"), names.index("dp2tp4")
    assert planning.home_move_seconds(MODEL, HW, TOPO, candidates, a, a) == 0
    shape = (MODEL.num_layers, MODEL.hidden_size, MODEL.ffn_hidden_size, MODEL.num_attention_heads,
             MODEL.num_query_groups, MODEL.vocab_size)
    masters = planning.llama_tensor_set(*shape, dtype="float32")
    one = planning.redistribution_seconds(plan_switch(masters, candidates[a], candidates[b], src_kind="zero",
                                                      dst_kind="zero", topology=TOPO), HW, TOPO)
    assert one > 0
    assert planning.home_move_seconds(MODEL, HW, TOPO, candidates, a, b) == pytest.approx(3 * one)


@pytest.mark.parametrize("min_gain", [0.01, 0.05, 0.3])
def test_a_step_never_loses_to_its_home_layout_alone(setup, min_gain):
    # Whatever margin the planned phases must win by, the step's plan is never predicted slower
    # than the whole step in one phase under the home layout, with no switch: when the
    # program's plan is that phase, a slower best static layout does not replace it for want
    # of the margin. Also the plan the margin keeps wins by it.
    candidates, names, _ = setup
    home = names.index("dp2tp4")
    planner = planning.build_planner(MODEL, HW, TOPO, candidates, home, min_gain=min_gain,
                                     costs=planning.switch_costs(MODEL, HW, TOPO, candidates, home), **OPTIONS)
    alone = _C.Planner(planner.cost, [candidates[home]], 0, [[0.0]], [0.0], **OPTIONS)
    switched = 0
    for seed in range(60):
        rng = random.Random(seed)  # 16 long-tailed lengths: median 665 tokens, some of 32K
        lengths = [max(1, min(32768, int(math.exp(rng.gauss(6.5, 1.5))))) for _ in range(16)]
        plan, static = planner.plan(lengths), alone.plan(lengths).total_seconds
        assert plan.total_seconds <= static * (1 + 1e-12), (seed, plan.total_seconds, static)
        layouts = {(ph.layout.name, ph.recompute) for ph in plan.phases}
        one = len(plan.phases) == 1 and (
            plan.phases[0].layout.name == "dp2tp4" or
            next(iter(layouts)) == (names[plan.best_static_candidate], plan.best_static_recompute))
        if not plan.single_phase_fallback and not one:  # planned phases, kept by the margin
            assert plan.total_seconds * (1 + min_gain) <= plan.one_phase_seconds * (1 + 1e-12), seed
        switched += any(name != "dp2tp4" for name, _ in layouts)
    assert switched > 0, "no step switched: the test shows nothing"


def test_a_chosen_home_never_loses_to_the_static_layout_in_simulation(setup):
    candidates, names, planner_for = setup
    lengths = LENGTHS * 10
    start = [batch(10 + s) for s in range(2)]
    sim = simulate_moving_home(planner_for, range(len(candidates)), lengths, 3, 64, seed=3, window=2,
                               move_seconds=lambda a, b: planning.home_move_seconds(MODEL, HW, TOPO, candidates, a, b),
                               start=start)
    assert len(sim["homes"]) == 3 and sim["tokens"] > 0
    assert sim["hot_s"] <= sim["static_s"] * 1.001
    # The same steps as simulate() draws with that seed.
    first = names.index(sim["homes"][0])
    plain = simulate(planner_for(first), lengths, 3, 64, seed=3)
    assert plain["tokens"] == sim["tokens"] and plain["static_s"] == pytest.approx(sim["static_s"])


# ----------------------------------------------------------------------------- rank order

def _cross_node_bytes(ts, a, b, topology):
    plan = plan_switch(ts, a, b, topology=topology)
    per_node = topology.ranks_per_node
    return sum(size for src, dst, size, _ in plan.messages() if src // per_node != dst // per_node)


def test_rank_order_is_chosen_where_one_moves_strictly_fewer_bytes_across_nodes():
    # Two layers of 8x8 fp32 (256 bytes each), column-sharded over tp; 4 ranks, 2 per node.
    # Home dp4: every rank holds both layers. Switching into dp2pp2 moves nothing in any order;
    # switching back, every rank needs the layer it does not hold.
    ts = _C.TensorSet([_C.ParamSpec(f"l{i}.w", [8, 8], "float32", "column", layer=i) for i in range(2)], 2)
    topology = _C.Topology(4, 2)
    home = _C.Layout.parse("dp4")
    megatron = _C.Layout.parse("dp2pp2")
    # Megatron's order (dp before pp): node 0 = stage 0 of both replicas, so each of its two
    # ranks fetches layer 1 (256 bytes) from node 1, and node 1's ranks layer 0 from node 0:
    # 1024 bytes cross. With pp fastest, node 0 = both stages of replica 0: all local, 0 bytes.
    variants = planning.layout_orders(megatron)
    assert [v.name for v in variants] == ["dp2pp2", "dp2pp2/pp-dp-tp-cp"]
    for v in variants:
        assert _cross_node_bytes(ts, home, v, topology) == 0
    assert _cross_node_bytes(ts, variants[0], home, topology) == 1024
    assert _cross_node_bytes(ts, variants[1], home, topology) == 0
    chosen, saved = planning.choose_orders(ts, ts, HW, topology, [home, megatron], 0)
    assert chosen[0].name == "dp4"
    assert chosen[1].name == "dp2pp2/pp-dp-tp-cp" and saved[1] > 0
    # Home tp2pp2 (Megatron's order: node 0 = stage 0): Megatron's dp2pp2 keeps each stage on
    # its node both ways, pp fastest would not; Megatron's is kept, nothing saved.
    tp2pp2 = _C.Layout.parse("tp2pp2")
    assert _cross_node_bytes(ts, tp2pp2, variants[0], topology) == 0
    assert _cross_node_bytes(ts, variants[0], tp2pp2, topology) == 0
    assert _cross_node_bytes(ts, tp2pp2, variants[1], topology) > 0
    chosen, saved = planning.choose_orders(ts, ts, HW, topology, [tp2pp2, megatron], 0)
    assert chosen[1].name == "dp2pp2" and saved[1] == 0


def test_rank_orders_never_spread_a_layers_groups_over_more_nodes():
    topology = _C.Topology(16, 8)
    layout = _C.Layout.parse("dp2tp4pp2")
    for variant in planning.layout_orders(layout):
        keeps = planning.order_keeps_locality(variant, layout, topology)
        tp_nodes = max(len({topology.node(r) for r in g}) for g in variant.groups("tp"))
        assert keeps == (tp_nodes == 1 and all(
            len({topology.node(r) for r in g}) <= 2 for g in variant.groups("pp")))
    # The orders listed place ranks differently, with the layout itself first.
    placements = {tuple(tuple(sorted(v.coord(r).items())) for r in range(16))
                  for v in planning.layout_orders(layout)}
    assert len(placements) == len(planning.layout_orders(layout)) == 6
