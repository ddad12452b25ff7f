"""Planner options seen from Python: the micro-batch token cap."""

import pytest

import hotswitch as hs


def _planner(**options):
    cost = hs.CostModel(hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("a100"), hs.Topology(8, 8))
    layouts = [hs.Layout.parse(n) for n in ("dp8", "dp4tp2", "dp2tp4", "tp8")]
    n = len(layouts)
    return hs.Planner(cost, layouts, 0, [[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n, **options)


def test_micro_batches_hold_at_most_the_cap():
    lengths = [100, 300, 700, 1500, 2000, 2048, 40, 900] * 8
    free = _planner(max_context=2048)
    capped = _planner(max_context=2048, max_tokens_per_micro_batch=2048)
    assert max(free.micro_batch_budget(i) for i in range(4)) > 2048  # memory alone allows more
    plan = capped.plan(lengths)
    placed = []
    for ph in plan.phases:
        for replica in ph.packing.micro_batches:
            for mb in replica:
                assert sum(lengths[i] for i in mb) <= 2048
                placed += mb
    assert sorted(placed) == list(range(len(lengths)))


def test_a_negative_cap_is_refused():
    with pytest.raises(ValueError, match="max_tokens_per_micro_batch must be >= 0.*-1"):
        _planner(max_tokens_per_micro_batch=-1)
