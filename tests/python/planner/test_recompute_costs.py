"""Activation recomputation through the binding: the cost model prices each mode, the planner
weighs them per phase, bad modes name themselves."""

import pytest

import hotswitch as hs

LAYOUTS = ["dp8", "dp4tp2", "dp2tp4"]


def _cost(**options):
    return hs.CostModel(hs.ModelConfig.preset("llama-7b"), hs.HardwareProfile.preset("a800"), hs.Topology(8, 8),
                        zero=True, **options)


def test_cost_model_prices_each_mode():
    cost = _cost()
    layout = hs.Layout.parse("dp4tp2")
    batches = [[[8192], [4096, 4096]]] * 4
    none, selective, full = (cost.phase(layout, batches, recompute=m) for m in ("none", "selective", "full"))
    assert none.run_seconds < selective.run_seconds < full.run_seconds
    assert full.activation_bytes < none.activation_bytes / 4
    assert selective.activation_bytes == none.activation_bytes  # flash attention keeps no scores
    assert cost.terms(layout, recompute="full").recompute == "full"
    assert cost.terms(layout).recompute == "none" and cost.flash_attention
    assert cost.training_flops(4096, recompute="full") > cost.training_flops(4096, recompute="selective") > \
        cost.training_flops(4096)
    eager = _cost(flash_attention=False)
    assert eager.phase(layout, batches, recompute="selective").activation_bytes == none.activation_bytes
    assert eager.phase(layout, batches).activation_bytes > none.activation_bytes
    with pytest.raises(ValueError, match="recompute 'block' is not one of none, selective, full"):
        cost.phase(layout, batches, recompute="block")


def test_model_config_recompute_names():
    shape = dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=176,
                 vocab_size=256)
    assert hs.ModelConfig(**shape).recompute == "none"
    assert hs.ModelConfig(**shape, recompute="selective").recompute == "selective"
    assert hs.ModelConfig(**shape, recompute=True).recompute == "full"
    with pytest.raises(ValueError, match="recompute 'partial' is not one of"):
        hs.ModelConfig(**shape, recompute="partial")
    with pytest.raises(ValueError, match="recompute must be 'none', 'selective', 'full' or a bool, got 3"):
        hs.ModelConfig(**shape, recompute=3)


def _planner(recompute):
    n = len(LAYOUTS)
    switch = [[0.0 if i == j else 0.05 for j in range(n)] for i in range(n)]
    return hs.Planner(_cost(), [hs.Layout.parse(l) for l in LAYOUTS], 0, switch, [0.0] + [0.02] * (n - 1),
                      recompute=recompute)


def test_planner_recomputes_the_long_bucket_only():
    plain, both = _planner(["none"]), _planner(["none", "full"])
    assert both.recompute == ["none", "full"] and plain.recompute == ["none"]
    holds = max(plain.micro_batch_budget(i) for i in range(len(LAYOUTS)))
    assert both.micro_batch_budget(2) == both.candidate_model(2, "full").budget > holds
    lengths = [300, 700, 1500, 3000] * 100 + [holds + 4000]
    with pytest.raises(ValueError, match="fits no candidate layout"):
        plain.plan(lengths)
    plan = both.plan(lengths)
    modes = {ph.recompute for ph in plan.phases}
    assert modes == {"none", "full"}, [(ph.layout.name, ph.recompute) for ph in plan.phases]
    for ph in plan.phases:
        longest = max(plan.pieces[i].length for i in ph.sequences)
        assert (ph.recompute == "full") == (longest > holds)


@pytest.mark.parametrize("recompute,needle", [
    (["block"], "recompute 'block' is not one of none, selective, full"),
    (["full", "full"], "recompute lists 'full' twice"),
    ([], "recompute must list at least one mode"),
])
def test_planner_rejects_bad_modes(recompute, needle):
    with pytest.raises(ValueError) as info:
        _planner(recompute)
    assert needle in str(info.value)
