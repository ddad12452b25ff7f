"""Redistribution plans against an independent linear program that lets any owner send
(``hotswitch.analysis.switch_lp``, PuLP + CBC)."""

import itertools

import pytest

pytest.importorskip("pulp", reason="the MILP reference needs PuLP (pip install hotswitch[milp])")

import hotswitch as hs
from hotswitch.analysis import switch_lp
from tests.python.switch.placements import model_set

INTRA, INTER = 200e9, 25e9  # bytes/s, the a800 preset's links


def _sharded_bytes(ts):
    return sum(s.nbytes for s in ts.specs if s.rule != "replicated")


@pytest.mark.parametrize("src,factor", [("dp4tp2", 16), ("dp2tp4", 8)])
def test_any_owner_halves_the_same_node_first_send(src, factor):
    # Two nodes of 4, src -> tp8: a plan taking elements from the receiver's node leaves
    # far owners idle; the program, free to use them, halves the largest send.
    ts = model_set()
    sharded = _sharded_bytes(ts)
    src, dst = hs.Layout.parse(src), hs.Layout.parse("tp8")
    plan = hs.plan_switch(ts, src, dst, topology=hs.Topology(8, 4))
    lp = switch_lp.solve(ts, src, dst, 4)
    assert lp["objective"] == "bytes"
    assert lp["optimum"] == pytest.approx(sharded / factor, rel=1e-6)
    assert plan.stats["same_node_first_max_send_bytes"] == plan.stats["max_send_bytes"] == 2 * sharded // factor
    assert plan.stats["inter_node_bytes"] == 0
    # The program's optimum sends across nodes; the plan's never does here.
    assert sum(lp["send_inter_bytes"]) > 0


def test_time_program_beats_same_node_first_by_the_bandwidth_ratio():
    # dp4 tp2 -> tp8: ranks 0, 2 send near at INTRA, ranks 4, 6 far at INTER; the slowest
    # sender is fastest when both finish together: 1/8 of the set over INTRA + INTER.
    ts = model_set()
    sharded = _sharded_bytes(ts)
    src, dst = hs.Layout.parse("dp4tp2"), hs.Layout.parse("tp8")
    plan = hs.plan_switch(ts, src, dst, topology=hs.Topology(8, 4))
    lp = switch_lp.solve(ts, src, dst, 4, intra_node_bandwidth=INTRA, inter_node_bandwidth=INTER)
    assert lp["objective"] == "seconds"
    assert lp["optimum"] == pytest.approx(sharded / 8 / (INTRA + INTER), rel=1e-6)
    ours = switch_lp.plan_send_seconds(plan, 4, INTRA, INTER)
    assert ours == pytest.approx(sharded / 8 / INTRA, rel=1e-9)
    assert ours / lp["optimum"] == pytest.approx(1 + INTER / INTRA, rel=1e-6)


@pytest.mark.parametrize("per_node", [8, 4, 2])
def test_every_pair_of_8_ranks_against_the_program(per_node):
    ts = model_set()
    layouts = hs.Layout.enumerate(8)
    checked = 0
    for src, dst in itertools.product(layouts, layouts):
        if src == dst:
            continue
        plan = hs.plan_switch(ts, src, dst, topology=hs.Topology(8, per_node))
        stats = plan.stats
        classes = switch_lp.demand_classes(ts, src, dst)
        # The classes count, independently of the plan generator, exactly the bytes it moves.
        assert sum(classes.values()) == stats["bytes_moved"] == stats["lower_bound_bytes"]
        if not classes:
            continue
        lp = switch_lp.solve(ts, src, dst, per_node, classes=classes)
        assert lp["optimum"] <= stats["same_node_first_max_send_bytes"] * (1 + 1e-7)
        assert stats["same_node_first_max_send_bytes"] <= stats["max_send_bytes"]
        # Under the plans' rule the program's optimum is the plan's (in whole bytes, rounded
        # up); on one node every owner is near and the rule restricts nothing.
        rule = switch_lp.solve(ts, src, dst, per_node, classes=classes, same_node_first=True)
        gap = stats["same_node_first_max_send_bytes"] - rule["optimum"]
        assert -1e-7 * rule["optimum"] <= gap < 1 + 1e-7 * rule["optimum"]
        if per_node == 8:
            assert rule["optimum"] == pytest.approx(lp["optimum"], rel=1e-7)
        timed = switch_lp.solve(ts, src, dst, per_node, classes=classes, intra_node_bandwidth=INTRA,
                                inter_node_bandwidth=INTER)
        assert timed["optimum"] <= switch_lp.plan_send_seconds(plan, per_node, INTRA, INTER) * (1 + 1e-6)
        checked += 1
    assert checked > 60


def test_partial_source_counts_every_summand():
    ts = model_set(num_layers=2)
    src, dst = hs.Layout.parse("dp4"), hs.Layout.parse("dp2tp2")
    plan = hs.plan_switch(ts, src, dst, src_kind="partial", dst_kind="zero", topology=hs.Topology(4, 2))
    classes = switch_lp.demand_classes(ts, src, dst, "partial", "zero")
    assert sum(classes.values()) == plan.stats["bytes_moved"] > 0
    lp = switch_lp.solve(ts, src, dst, 2, src_kind="partial", dst_kind="zero", classes=classes)
    assert 0 < lp["optimum"] <= plan.stats["same_node_first_max_send_bytes"] * (1 + 1e-7)


def test_bad_arguments_raise_value_error():
    ts = model_set(num_layers=2)
    with pytest.raises(ValueError, match=r"ranks_per_node\(3\) must divide world\(8\)"):
        switch_lp.solve(ts, hs.Layout(dp=8), hs.Layout(tp=8), 3)
    with pytest.raises(ValueError, match="inter 0"):
        switch_lp.solve(ts, hs.Layout(dp=8), hs.Layout(tp=8), 4, intra_node_bandwidth=1e9, inter_node_bandwidth=0)
    with pytest.raises(ValueError, match="world 4"):
        switch_lp.demand_classes(ts, hs.Layout(dp=8), hs.Layout(tp=4))


@pytest.mark.parametrize("per_node", [4, 2])
def test_time_balanced_plans_reach_the_same_node_first_program(per_node):
    # Split dims large enough that whole elements round the quotas by little.
    ts = model_set(hidden=64, ffn=128, vocab=160)
    layouts = hs.Layout.enumerate(8)
    topology = hs.Topology(8, per_node)
    gains = []
    for src, dst in itertools.product(layouts, layouts):
        by_bytes = hs.plan_switch(ts, src, dst, topology=topology)
        plan = hs.plan_switch(ts, src, dst, topology=topology, intra_node_bandwidth=INTRA, inter_node_bandwidth=INTER)
        stats = plan.stats
        assert stats["bytes_moved"] == by_bytes.stats["bytes_moved"]
        assert stats["inter_node_bytes"] == by_bytes.stats["inter_node_bytes"]  # the same rule
        assert by_bytes.stats["max_send_seconds"] == 0
        ours = switch_lp.plan_send_seconds(plan, per_node, INTRA, INTER)
        assert stats["max_send_seconds"] == pytest.approx(ours, rel=1e-12)
        if stats["bytes_moved"] == 0:
            assert ours == stats["same_node_first_max_send_seconds"] == 0
            continue
        rule = switch_lp.solve(ts, src, dst, per_node, intra_node_bandwidth=INTRA, inter_node_bandwidth=INTER,
                               same_node_first=True)["optimum"]
        assert stats["same_node_first_max_send_seconds"] == pytest.approx(rule, rel=1 / 256)
        assert rule * (1 - 1e-7) <= ours <= rule * (1 + 1e-3)
        gains.append(switch_lp.plan_send_seconds(by_bytes, per_node, INTRA, INTER) / ours)
    # Never slower than balancing bytes, and faster for some pairs.
    assert min(gains) >= 1 - 1e-6
    assert max(gains) > 1.2


def test_plan_switch_refuses_one_bandwidth():
    with pytest.raises(ValueError, match="got intra-node 1e\\+09 and inter-node 0"):
        hs.plan_switch(model_set(num_layers=2), hs.Layout(dp=4), hs.Layout(tp=4), topology=hs.Topology(4, 2),
                       intra_node_bandwidth=1e9)
