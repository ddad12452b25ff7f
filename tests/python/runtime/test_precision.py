"""Loss scaling with Megatron-LM's semantics: the scaler's rule, and the runtime skipping a
step whose gradients overflow on any one rank, on every rank alike."""

import math

import numpy as np
import pytest

import hotswitch as hs
from hotswitch.precision import GradScaler, LossScaling
from hotswitch.testing.harness import run_world
from tests.python.runtime import workers as w

CANDIDATES = ["dp4", "dp2tp2", "pp4", "tp2pp2"]


def test_dynamic_scale_halves_after_hysteresis_and_grows_after_window():
    s = GradScaler(LossScaling(initial=64.0, min=8.0, window=3, hysteresis=2))
    scales = []
    for found_inf in [True, True, True, False, False, False, True, False, True, True, True, True]:
        s.update(found_inf)
        scales.append(s.scale)
    # Two overflows use up the hysteresis; the third halves again (the tracker stays spent);
    # three clean steps double and restore the hysteresis, so one overflow then keeps the scale;
    # the clean step resets nothing but the growth count, so the next overflow halves; the
    # floor holds at min.
    assert scales == [64, 32, 16, 16, 16, 32, 32, 32, 16, 8, 8, 8]


def test_constant_scale_never_changes_and_states_round_trip():
    s = GradScaler(LossScaling(constant=1024.0))
    for found_inf in (True, True, True, False):
        s.update(found_inf)
    assert s.scale == 1024.0
    d = GradScaler(LossScaling(initial=2.0 ** 32, window=5, hysteresis=3))
    for found_inf in (False, False, True):
        d.update(found_inf)
    state = d.state_dict()
    assert state == {"scale": 2.0 ** 32, "growth_tracker": 0, "hysteresis_tracker": 2}
    e = GradScaler(LossScaling(initial=2.0 ** 32, window=5, hysteresis=3))
    e.load_state_dict(state)
    assert e.state_dict() == state


def test_loss_scaling_settings_are_checked():
    assert LossScaling() == LossScaling(initial=2.0 ** 32, min=1.0, window=1000, hysteresis=2, constant=None)
    for kwargs, needle in [(dict(initial=0.0), "initial"), (dict(min=-1.0), "min"), (dict(window=0), "window"),
                           (dict(hysteresis=True), "hysteresis"), (dict(constant=float("inf")), "constant"),
                           (dict(initial=1.0, min=2.0), "min(2.0) must be <= initial(1.0)")]:
        with pytest.raises(ValueError, match=needle.replace("(", r"\(").replace(")", r"\)")):
            LossScaling(**kwargs)
    with pytest.raises(ValueError, match="loss_scaling"):
        hs.RuntimeConfig(loss_scaling=2.0 ** 16)
    s = GradScaler(LossScaling())
    for bad in ({"scale": 1.0}, {"scale": -1.0, "growth_tracker": 0, "hysteresis_tracker": 2},
                {"scale": 2.0, "growth_tracker": 0.5, "hysteresis_tracker": 2}):
        with pytest.raises(ValueError):
            s.load_state_dict(bad)
    assert s.state_dict() == {"scale": 2.0 ** 32, "growth_tracker": 0, "hysteresis_tracker": 2}


def test_overflow_on_one_rank_skips_the_step_everywhere_and_checkpoints_carry_the_scaler(tmp_path):
    inject = (2, 3, 6)
    out = run_world(4, w.loss_scaling, CANDIDATES, inject, 6, str(tmp_path), timeout=900)
    steps, counts, _, restored = out[0]
    # Overflows at steps 2 and 3 (hysteresis 2): the scale halves at the second; two clean
    # steps (window 2) double it again; one overflow at step 6 leaves it.
    assert [s[0] for s in steps] == [False, True, True, False, False, True]
    assert [s[1] for s in steps] == [2 ** 16, 2 ** 16, 2 ** 15, 2 ** 15, 2 ** 16, 2 ** 16]
    assert [s[2] for s in steps] == [True, False, False, True, True, False], "skipped steps changed weights"
    assert all(not math.isfinite(s[3]) for s in steps if s[0]) and all(math.isfinite(s[3]) for s in steps if not s[0])
    assert counts == (3, 3)
    assert restored == ({"scale": 2.0 ** 16, "growth_tracker": 0, "hysteresis_tracker": 1}, 3, 3)
    for rank, (s, c, _, r) in enumerate(out):
        assert (s, c, r) == (steps, counts, restored), f"rank {rank} disagrees"


def test_loss_scaling_without_overflow_equals_the_unscaled_run(tmp_path):
    scaled = run_world(4, w.loss_scaling, CANDIDATES, (), 3, str(tmp_path), timeout=900)[0]
    plain = run_world(4, w.unscaled, CANDIDATES, timeout=900)[0]
    assert [s[0] for s in scaled[0]] == [False] * 3
    # The scale (a power of two) and its inverse are exact in fp32: the unscaled gradients,
    # norms and weights are those of the run without scaling.
    np.testing.assert_allclose([s[3] for s in scaled[0]], plain[0], rtol=1e-6)
    for name, value in plain[1].items():
        np.testing.assert_allclose(scaled[2][name], value, rtol=0, atol=1e-6, err_msg=name)
