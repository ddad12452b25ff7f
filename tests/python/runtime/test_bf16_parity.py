"""A layout change moves a bf16 run by bf16 rounding, not more: world 1 against dp2, tp2 and
pp2, two steps each, in bf16 compute (fp32 master weights) and in fp32."""

import numpy as np
import pytest

from hotswitch.testing.harness import run_world
from hotswitch.testing.precision import BF16_LOSS_RTOL, max_rel_diff, parity

from tests.python.runtime import workers as w

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


@pytest.mark.parametrize("tied", [False, True])
def test_parameters_switched_in_bf16_train_bit_for_bit_as_at_full_width_on_fewer_bytes(tied):
    # Short sequences under dp4, up to 100 tokens under dp2tp2, the rest under the home
    # tp2pp2: every step switches parameters out of the home and between the phases.
    fixed = [[40, "dp4"], [100, "dp2tp2"], [256, "tp2pp2"]]
    out = run_world(4, w.train_bf16_switching, ["dp4", "tp2pp2"], fixed, "tp2pp2", tied, timeout=600)
    (narrow, weights), (wide, wide_weights) = out[0][True], out[0][False]
    assert all(o[True][0] == narrow and o[False][0] == wide for o in out), "ranks report different steps"
    for i, (a, b) in enumerate(zip(narrow, wide)):
        loss, layouts, param_bytes, grad_bytes = a
        assert (loss, layouts, grad_bytes) == (b[0], b[1], b[3]), (i, a, b)  # bit for bit
        if b[2]:
            # The matrices (and an untied head) travel at half width; norms and embedding at full.
            assert 0.5 * b[2] < param_bytes < 0.75 * b[2], (i, layouts, param_bytes, b[2])
    assert sum(b[2] for b in wide) > 0, "no step switched parameters"
    assert weights.keys() == wide_weights.keys()
    for name in weights:
        assert np.array_equal(weights[name], wide_weights[name]), name
