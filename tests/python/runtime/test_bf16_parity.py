"""A layout change moves a bf16 run by bf16 rounding, not more: world 1 against dp2, tp2 and
pp2, two steps each, in bf16 compute (fp32 master weights) and in fp32."""

from hotswitch.testing.harness import run_world
from hotswitch.testing.precision import BF16_LOSS_RTOL, max_rel_diff, parity

LAYOUTS = ["dp2", "tp2", "pp2"]


def test_bf16_layouts_agree_with_world_one_to_bf16_rounding():
    single = run_world(1, parity, ["dp1"], ["bfloat16", None], timeout=600)[0]
    out = run_world(2, parity, LAYOUTS, ["bfloat16", None], timeout=900)
    assert out[0] == out[1], "the ranks report different losses"
    bf16, fp32 = out[0]["bfloat16"], out[0]["float32"]
    # bf16 keeps 8 mantissa bits (unit roundoff 2**-8 ~ 3.9e-3): a loss that passes through
    # a few differently ordered roundings moves by at most a few units, BF16_LOSS_RTOL = 1e-2.
    assert max_rel_diff(bf16, single["bfloat16"]["dp1"], 0) <= BF16_LOSS_RTOL
    assert max_rel_diff(bf16, single["bfloat16"]["dp1"], 1) <= 4 * BF16_LOSS_RTOL
    # In fp32 the layouts agree to fp32 rounding: the bf16 spread is bf16's, not the layouts'.
    assert max_rel_diff(fp32, single["float32"]["dp1"], 0) <= 1e-5
    assert max_rel_diff(fp32, single["float32"]["dp1"], 1) <= 1e-4
    # bf16 compute is really on: its gradients are not the fp32 ones. (The gradient norm is the
    # witness: the tiny model's first losses sit near log(vocabulary), whatever the rounding.)
    assert max_rel_diff({"dp1": single["bfloat16"]["dp1"]}, single["float32"]["dp1"], 1) > 1e-5
