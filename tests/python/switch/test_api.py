"""Single-process checks of the Python API: layouts, specs, plans, and their errors."""

import pytest
import torch

import hotswitch as hs
from hotswitch import _C

from tests.python.switch.placements import full_tensors, local_shards, model_set, zero_shard


def test_layout_round_trip_and_groups():
    layout = hs.Layout(dp=2, tp=2, pp=2)
    assert layout.name == "dp2tp2pp2" and layout.world == 8
    assert hs.Layout.parse("dp2tp2pp2") == layout
    assert layout.group("tp", 5) == [4, 5]
    assert layout.groups("pp") == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert layout.coord(6) == {"dp": 1, "tp": 0, "pp": 1, "cp": 0}
    other = hs.Layout.parse("dp2tp4/dp-tp-cp-pp")
    assert other.order == "dp-tp-cp-pp" and other.group("dp", 0) == [0, 1]
    assert len(hs.Layout.enumerate(8)) == 10


@pytest.mark.parametrize("make,needle", [
    (lambda: hs.Layout(dp=0), "dp degree must be >= 1, got 0"),
    (lambda: hs.Layout.parse("dp2xx"), "'dp2xx'"),
    (lambda: hs.Layout(dp=2, order="tp-dp-pp"), "names 3 axes"),
    (lambda: hs.Layout(dp=2, tp=3).validate(8), "dp(2) * tp(3) * pp(1) * cp(1) = 6 != world(8)"),
    (lambda: hs.Topology(6, 4), "world(6) is not a multiple of ranks_per_node(4)"),
    (lambda: hs.ParamSpec("w", [4, 0]), "has a dim < 1"),
    (lambda: hs.ParamSpec("w", [4], rule="row"), "splits dim 1"),
    (lambda: hs.ParamSpec("w", [6, 2], rule="fused_column", groups=[2, 2]), "sum to 4"),
    (lambda: hs.ParamSpec("w", [4], dtype="float8"), "dtype 'float8'"),
    (lambda: hs.ParamSpec("w", [4], stage="middle"), "stage 'middle'"),
    (lambda: hs.TensorSet([hs.ParamSpec("w", [4]), hs.ParamSpec("w", [4])], 1), "'w' appears twice"),
    (lambda: hs.TensorSet([hs.ParamSpec("w", [4], layer=3)], 2), "layer 3 outside"),
    (lambda: hs.plan_switch("not a set", hs.Layout(dp=2), hs.Layout(tp=2)), "TensorSet"),
    (lambda: hs.plan_switch(model_set(), hs.Layout(dp=2), hs.Layout(tp=2), dst_kind="partial"),
     "can only be a source"),
    (lambda: hs.plan_switch(model_set(), hs.Layout(dp=2), hs.Layout(tp=3, dp=1)), "= 3 != world(2)"),
    (lambda: hs.plan_switch(model_set(), hs.Layout(dp=2), hs.Layout(tp=2), src_kind="full"),
     "src_kind 'full'"),
    (lambda: hs.plan_switch(model_set(), hs.Layout(dp=2), hs.Layout(tp=2), policy="random"),
     "sender policy 'random'"),
    (lambda: hs.set_log_level("loud"), "'loud'"),
    (lambda: hs.llama_tensor_set(hidden_size=100, num_attention_heads=32), "hidden_size(100)"),
])
def test_bad_input_raises_value_error_naming_the_value(make, needle):
    with pytest.raises(ValueError) as info:
        make()
    assert needle in str(info.value)


def test_plan_figures_and_cache():
    ts = model_set()
    cache = _C.PlanCache()
    topology = hs.Topology(4, 4)
    plan, hit = cache.get(ts, hs.Layout(tp=4), "sharded", hs.Layout(dp=4), "sharded", topology)
    assert not hit and len(cache) == 1
    again, hit = cache.get(ts, hs.Layout(tp=4), "sharded", hs.Layout(dp=4), "sharded", topology)
    assert hit and len(cache) == 1
    # The cached plan against one built independently, in a cache of its own.
    fresh = hs.plan_switch(ts, hs.Layout(tp=4), hs.Layout(dp=4), cache=_C.PlanCache())
    assert again.stats == fresh.stats
    assert again.messages() == fresh.messages()
    assert again.send_bytes == fresh.send_bytes and again.recv_bytes == fresh.recv_bytes
    # plan_switch looks up the same entry (its default topology is one node).
    assert hs.plan_switch(ts, hs.Layout(tp=4), hs.Layout(dp=4), cache=cache).messages() == fresh.messages()
    assert len(cache) == 1
    other = hs.plan_switch(ts, hs.Layout(tp=4), hs.Layout(dp=2, tp=2), cache=cache)
    assert len(cache) == 2 and other.stats != plan.stats
    stats = plan.stats
    # tp4 -> dp4: every rank lacks the three quarters of each split tensor it does not hold,
    # and each quarter has one owner, which sends it to the three others.
    sharded = sum(s.nbytes for s in ts.specs if s.rule != "replicated")
    assert stats["bytes_moved"] == stats["lower_bound_bytes"] == 3 * sharded
    assert stats["max_send_bytes"] == stats["same_node_first_max_send_bytes"] == 3 * sharded // 4
    assert stats["num_messages"] == 12
    assert sum(plan.send_bytes) == stats["bytes_moved"] == sum(m[2] for m in plan.messages())
    greedy = hs.plan_switch(ts, hs.Layout(tp=4), hs.Layout(dp=4), policy="greedy", cache=cache)
    assert greedy.stats["bytes_moved"] == stats["bytes_moved"]
    two_nodes = hs.plan_switch(ts, hs.Layout(dp=2, tp=2), hs.Layout(tp=4), topology=hs.Topology(4, 2))
    assert two_nodes.stats["inter_node_bytes"] == two_nodes.stats["lower_bound_inter_node_bytes"] == 0


@pytest.mark.parametrize("layout", ["dp4", "dp2tp2", "tp2pp2", "pp4", "tp4/dp-tp-cp-pp"])
def test_shard_tensors_match_the_reference(layout):
    ts = model_set()
    fulls = full_tensors(ts)
    lay = hs.Layout.parse(layout)
    for rank in range(4):
        ours = hs.shard_tensors(fulls, ts, lay, rank)
        ref = local_shards(ts, fulls, lay, rank)
        assert ours.keys() == ref.keys()
        assert all(torch.equal(ours[k], ref[k]) for k in ref)
        assert torch.equal(hs.shard_tensors(fulls, ts, lay, rank, "zero"), zero_shard(ts, fulls, lay, rank))


def test_cost_model_from_python():
    model = hs.ModelConfig.preset("llama-7b")
    assert abs(model.total_params - 6.74e9) < 0.01e9
    cost = hs.CostModel(model, hs.HardwareProfile.preset("a800"), hs.Topology(8, 8))
    short = cost.phase(hs.Layout(dp=8), [[[512] * 4] for _ in range(8)])
    long = cost.phase(hs.Layout(tp=8), [[[16384]]])
    assert short.total_seconds > 0 and long.total_seconds > 0
    assert short.run_seconds == short.total_seconds - short.dp_seconds
    assert long.static_bytes < short.static_bytes  # tp shards the weights
    zero = hs.CostModel(model, hs.HardwareProfile.preset("a800"), hs.Topology(8, 8), zero=True)
    assert zero.phase(hs.Layout(dp=8), [[[512] * 4] for _ in range(8)]).fits
    assert not zero.phase(hs.Layout(dp=8), [[[32768]] for _ in range(8)]).fits  # activations
    terms = cost.terms(hs.Layout(dp=8))
    assert terms.alpha == terms.alpha_compute + terms.alpha_tp
    assert terms.u(512) == pytest.approx(terms.alpha * 512 + terms.beta * 512**2 + terms.gamma)
    with pytest.raises(ValueError, match="got 1 replicas"):
        cost.phase(hs.Layout(dp=8), [[[512]]])
    with pytest.raises(ValueError, match="'gpt-5'"):
        hs.ModelConfig.preset("gpt-5")
    with pytest.raises(ValueError, match="efficiency"):
        hs.HardwareProfile(1e12, 2.0, 1 << 30, 1e9, 1e9)


def test_planner_from_python():
    model = hs.ModelConfig.preset("llama-7b")
    cost = hs.CostModel(model, hs.HardwareProfile.preset("a800"), hs.Topology(8, 8), zero=True)
    layouts = [hs.Layout(dp=8), hs.Layout(dp=2, tp=4), hs.Layout(tp=8)]
    sw = [[0.0 if i == j else 0.2 for j in range(3)] for i in range(3)]
    planner = hs.Planner(cost, layouts, 0, sw, [0.0, 0.1, 0.1])
    lengths = [300] * 60 + [7, 2, 20000, 5003]
    plan = planner.plan(lengths)
    covered = sorted(i for ph in plan.phases for i in ph.sequences)
    assert covered == list(range(len(lengths)))
    assert any(ph.layout != hs.Layout(dp=8) for ph in plan.phases)  # 20000 needs tp
    assert plan.total_seconds > 0 and plan.best_static_seconds > 0
    # Typed, read-only, and its parts add up to its total.
    assert isinstance(plan, hs.StepPlan) and all(isinstance(ph, hs.PlannedPhase) for ph in plan.phases)
    with pytest.raises(AttributeError):
        plan.total_seconds = 0.0
    parts = plan.switch_back_seconds + sum(ph.switch_in_seconds + ph.cost.run_seconds + ph.grad_seconds
                                           for ph in plan.phases)
    assert plan.total_seconds == pytest.approx(parts, rel=1e-12)
    for ph in plan.phases:
        model = planner.candidate_model(ph.candidate)
        assert model.layout == ph.layout and ph.grad_method == model.grad_method
        assert ph.grad_method in (("local",) if ph.candidate == planner.home else ("reduce", "partial"))
    with pytest.raises(ValueError, match="candidate 3 outside"):
        planner.candidate_model(3)
    with pytest.raises(ValueError, match="fits no candidate layout"):
        planner.plan([10, 10**7])
    with pytest.raises(ValueError, match="no sequences"):
        planner.plan([])
