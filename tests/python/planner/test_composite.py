"""Composite layouts priced by the cost model: the partitions enumerated, every sequence
assigned once to a group that holds it, the phase as long as its slowest group plus the
cross-group terms, never reported faster than it prices, and the heuristic against the
exhaustive reference on small cases."""

import random

import pytest

from hotswitch import _C
from hotswitch.analysis.composite import GroupModel, composite_step, exact_composite, partitions

MODEL = _C.ModelConfig.preset("llama-7b")
HARDWARE = _C.HardwareProfile.preset("a800")


def test_partitions_are_the_power_of_two_multisets_summing_to_the_world():
    assert partitions(8, 3) == [(4, 4), (4, 2, 2)]
    assert partitions(8, 4) == [(4, 4), (4, 2, 2), (4, 2, 1, 1), (2, 2, 2, 2)]
    assert all(sum(p) == 32 and len(p) <= 4 for p in partitions(32, 4))
    assert (16, 8, 8) in partitions(32, 3) and (32,) not in partitions(32, 3)


def test_a_group_is_the_model_on_fewer_ranks():
    group = GroupModel(MODEL, HARDWARE, 4, 8, 32768, 8, ["none", "selective", "full"])
    world4 = _C.Planner(_C.CostModel(MODEL, HARDWARE, _C.Topology(4, 4), zero=True), group.candidates, 0,
                        [[0.0] * len(group.candidates)] * len(group.candidates), [0.0] * len(group.candidates),
                        max_context=32768, recompute=["none", "selective", "full"], long_sequences="reject")
    lengths = [300, 5000, 20000, 32768]
    seconds, layout, reduce_s = group.seconds(lengths)
    plan = world4.plan(lengths)
    assert seconds == pytest.approx(plan.best_static_seconds) and layout.name == group.candidates[
        plan.best_static_candidate].name
    assert 0 <= reduce_s < seconds and group.holds(32768) and group.marginal(20000) > group.marginal(300) > 0


def test_every_sequence_runs_once_and_the_step_is_its_slowest_group_plus_the_cross_terms():
    rng = random.Random(0)
    lengths = [rng.choice([100, 900, 4000, 30000, 120000]) for _ in range(64)]
    r = composite_step(MODEL, HARDWARE, 32, 8, lengths, 131072)
    assert r["groups"] is not None and sum(g["size"] for g in r["groups"]) == 32
    assert sum(g["sequences"] for g in r["groups"]) == 64 and sum(g["tokens"] for g in r["groups"]) == sum(lengths)
    slowest = max(g["seconds"] for g in r["groups"])
    assert r["composite_s"] == pytest.approx(slowest + r["reduce_s"] + r["switch_s"])
    assert r["reduce_s"] > 0 and r["switch_s"] >= 0
    # The speedup reported is the best of composite and static: never below 1 by construction,
    # and exactly the static time over the composite's when the composite wins.
    assert r["speedup_vs_static"] == pytest.approx(r["static_s"] / min(r["composite_s"], r["static_s"]))


def test_a_sequence_no_group_holds_leaves_the_step_static():
    # 512K tokens on 8 GPUs: the world holds it, no group of 4 does (their longest is ~330K),
    # so no composite exists.
    assert not GroupModel(MODEL, HARDWARE, 4, 8, 1 << 20, 8, ["none", "selective", "full"]).holds(524288)
    r = composite_step(MODEL, HARDWARE, 8, 8, [524288, 1000], 524288)
    assert r["composite_s"] is None and r["speedup_vs_static"] == 1.0


@pytest.mark.parametrize("seed", [3, 4])
def test_the_heuristic_is_within_two_percent_of_the_exhaustive_reference(seed):
    rng = random.Random(seed)
    lengths = [rng.choice([50, 700, 3000, 16000, 60000, 120000]) for _ in range(7)]
    r = exact_composite(MODEL, HARDWARE, 8, 8, lengths, 131072)
    assert r["composite_s"] is not None and r["heuristic_s"] >= r["composite_s"] - 1e-9
    assert r["gap_vs_exact"] <= 0.02, r
