"""This runtime's fixed cost per micro-batch: the fit, the measurement on the CPU, and the
profile that plans with it."""

import pytest
import torch

import hotswitch as hs
from hotswitch.calibration.overhead import (MicroBatchCosts, count_layer_ops, fit_layer_seconds, measure_micro_batch,
                                            with_layer_overhead)
from hotswitch.hardware import preset_for_device

TINY = dict(num_layers=3, hidden_size=64, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=96,
            vocab_size=128, max_position_embeddings=256)


def test_fit_recovers_known_coefficients():
    tokens = [8, 32, 64, 128, 256]
    seconds = [3e-4 + 2e-6 * t + 5e-9 * t * t for t in tokens]
    overhead, per_token, per_score, error = fit_layer_seconds(tokens, seconds)
    assert overhead == pytest.approx(3e-4, rel=1e-6)
    assert per_token == pytest.approx(2e-6, rel=1e-6)
    assert per_score == pytest.approx(5e-9, rel=1e-6)
    assert error < 1e-9
    # No fixed cost: the intercept stays at zero rather than going negative.
    overhead, _, _, _ = fit_layer_seconds(tokens, [1e-6 * t - 1e-7 for t in tokens])
    assert overhead == 0.0
    with pytest.raises(ValueError, match="at least three"):
        fit_layer_seconds([8, 16], [1.0, 2.0])


def test_measures_the_cpu_and_profiles_plan_with_it():
    cfg = hs.TransformerConfig(**TINY)
    costs = measure_micro_batch(cfg, [8, 48, 192], layer_counts=[1, 3], repeats=2, warmup=1, cuda=False)
    assert isinstance(costs, MicroBatchCosts)
    assert (costs.device, costs.compute_dtype, costs.token_counts) == ("cpu", "float32", [8, 48, 192])
    assert sorted(costs.micro_batch_seconds) == [1, 3]
    assert all(s > 0 for n in (1, 3) for s in costs.micro_batch_seconds[n])
    # Two more layers of 192 tokens cost time: the difference is a layer's work, not noise.
    assert costs.micro_batch_seconds[3][-1] > costs.micro_batch_seconds[1][-1]
    assert costs.layer_seconds == pytest.approx(
        [(b - a) / 2 for a, b in zip(costs.micro_batch_seconds[1], costs.micro_batch_seconds[3])])
    fit = fit_layer_seconds(costs.token_counts, costs.layer_seconds)
    assert fit == (costs.layer_overhead_seconds, costs.per_token_seconds, costs.per_score_seconds,
                   costs.fit_error_max)
    assert costs.layer_overhead_seconds >= 0
    base = hs.HardwareProfile.preset("h100")
    profile = with_layer_overhead(base, costs, name="h100-measured")
    expected = dict(base.to_dict(), layer_overhead_seconds=costs.layer_overhead_seconds, name="h100-measured")
    assert profile.to_dict() == expected
    # The cost model charges it per layer and micro-batch.
    model = cfg.cost_config()
    layout = hs.Layout.parse("dp1")
    extra = (hs.CostModel(model, profile, hs.Topology(1, 1)).terms(layout).micro_batch_seconds
             - hs.CostModel(model, dict_profile(base, 0.0), hs.Topology(1, 1)).terms(layout).micro_batch_seconds)
    assert extra == pytest.approx(cfg.num_layers * costs.layer_overhead_seconds, rel=1e-9, abs=1e-15)


def dict_profile(profile, overhead):
    return hs.HardwareProfile.from_dict(dict(profile.to_dict(), layer_overhead_seconds=overhead))


@pytest.mark.parametrize("kwargs,needle", [
    (dict(token_counts=[8, 8, 16]), "at least three distinct"),
    (dict(token_counts=[8, 16, 512]), "token_counts[2] must be an int in [1, 256]"),
    (dict(token_counts="8,16,32"), "token_counts must be a list"),
    (dict(layer_counts=[2, 2]), "at least two distinct"),
    (dict(repeats=0), "repeats must be an int >= 1"),
])
def test_bad_arguments_raise_before_anything_runs(kwargs, needle):
    args = dict(token_counts=[8, 16, 32], layer_counts=[1, 2])
    args.update(kwargs)
    with pytest.raises(ValueError) as e:
        measure_micro_batch(hs.TransformerConfig(**TINY), **args)
    assert needle in str(e.value)
    with pytest.raises(ValueError, match="config must be"):
        measure_micro_batch(TINY, [8, 16, 32])
    with pytest.raises(ValueError, match="costs must be"):
        with_layer_overhead(hs.HardwareProfile.preset("h100"), 1e-4)
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            measure_micro_batch(hs.TransformerConfig(**TINY), [8, 16, 32], cuda=True)


def test_preset_for_device():
    assert preset_for_device("NVIDIA H100 80GB HBM3") == "h100"
    assert preset_for_device("NVIDIA H200") == "h200"
    assert preset_for_device("NVIDIA A100-SXM4-80GB") == "a100"
    assert preset_for_device("NVIDIA GeForce RTX 4090") is None


def test_counts_the_operators_of_one_layer_forward_and_backward():
    cfg = hs.TransformerConfig(num_layers=3, max_position_embeddings=32, hidden_size=32, num_attention_heads=4,
                               num_query_groups=2, ffn_hidden_size=64, vocab_size=64)
    tp1 = count_layer_ops(cfg, tp=1, tokens=16)
    # Four matrix products a layer (qkv, proj, gate_up, down), each with two in backward.
    assert tp1["aten.mm"] == 12
    assert tp1["kernels"] == sum(v for k, v in tp1.items() if k.startswith("aten."))
    assert tp1["views"] == sum(v for k, v in tp1.items() if k.startswith("view:"))
    # Tensor parallelism adds its collectives' copies, never removes a product.
    tp2 = count_layer_ops(cfg, tp=2, tokens=16)
    assert tp2["aten.mm"] == 12 and tp2["kernels"] > tp1["kernels"]
    with pytest.raises(ValueError, match="layer_counts must hold two distinct values"):
        count_layer_ops(cfg, layer_counts=(2, 2))
    with pytest.raises(ValueError, match="tokens"):
        count_layer_ops(cfg, tokens=33)


def test_the_fitted_overhead_follows_a_fixed_cost_added_to_every_layer():
    # The fit puts a layer's fixed cost per micro-batch into layer_overhead_seconds, not into
    # the per-token terms: 20 ms more per layer moves the intercept by about 20 ms, whatever the
    # code's own costs (so a faster runtime is seen as such once it is measured again).
    from hotswitch.testing.harness import run_world

    from tests.python.calibration import overhead_workers

    tokens, layers, added = [8, 64, 256], [1, 3], 0.02
    spec = {"config": hs.TransformerConfig(**TINY), "token_counts": tokens, "layer_counts": layers, "repeats": 3,
            "warmup": 1, "backend": "gloo", "graphs": False}
    fits, slept = {}, 0.0
    for seconds in (0.0, added):
        timed, slept = run_world(1, overhead_workers.timings_with_a_fixed_cost, spec, seconds, timeout=300)[0]
        per_layer = [(b - a) / 2 for a, b in zip(timed[1], timed[3])]
        fits[seconds] = fit_layer_seconds(tokens, per_layer)
    moved = fits[added][0] - fits[0.0][0]
    # Against the pause each forward took, which a sleep overshoots. 20 ms keeps a loaded host's
    # noise in the fit within the bound: seen, 23.6 to 25.6 ms moved for 20.4 to 20.9 ms slept
    # (for 5 ms: 4.3 to 7.7 ms moved, 5.2 to 5.6 ms slept).
    assert slept >= added
    assert moved == pytest.approx(slept, rel=0.35), (fits, slept)
