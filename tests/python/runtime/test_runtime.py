"""The hot-switch runtime on real gloo processes: a run with switching equals the world-1 run
of the same model and batches."""

import numpy as np
import pytest

from hotswitch.testing.harness import run_world

from tests.python.runtime import workers as w

CANDIDATES = ["dp4", "dp2tp2", "pp4", "tp2pp2"]
TOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    return run_world(1, w.train, "auto", timeout=300)[0]


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _check_equal(result, reference):
    steps, weights = result[:2]
    ref_steps, ref_weights = reference[:2]
    for (loss, layouts, _, targets), (ref_loss, _, _, ref_targets) in zip(steps, ref_steps):
        assert targets == ref_targets
        assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (layouts, loss, ref_loss)
    assert _max_diff(weights, ref_weights) <= TOL


def test_switching_run_equals_single_process(reference):
    out = run_world(4, w.train, CANDIDATES, timeout=600)
    steps = out[0][0]
    assert all(o[0] == steps for o in out), "ranks report different steps"
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    phases = [len(layouts) for _, layouts, _, _ in steps]
    used = {l for _, layouts, _, _ in steps for l in layouts}
    # One phase for a single sequence, two and three or more when lengths spread.
    assert phases[0] == 1 and phases[1] >= 2 and max(phases) >= 3, phases
    assert any("tp" in l for l in used) and any("pp" in l for l in used), used
    _check_equal(out[0], reference)


@pytest.mark.parametrize("zero,grad_method", [(True, "auto"), (False, "reduce"), (False, "partial")])
def test_zero_and_reduced_gradients_equal_single_process(reference, zero, grad_method):
    out = run_world(4, w.train, CANDIDATES, zero, grad_method, timeout=600)
    steps = out[0][0]
    assert all(o[3] for o in out), "copies of a weight differ between ranks"
    assert max(len(layouts) for _, layouts, _, _ in steps) >= 2
    if grad_method in ("reduce", "partial"):
        assert {m for _, _, methods, _ in steps for m in methods} <= {grad_method, "local"}
    _check_equal(out[0], reference)


def test_bad_steps_raise_on_every_rank_and_change_nothing():
    out = run_world(2, w.refusals, ["dp2", "tp2", "pp2"], timeout=300)
    needles = ["non-empty list of token sequences", "sequence 1 must be a non-empty", "token id 500",
               "more than max_context(256)", "integer token ids", "no target tokens", "differs from the batch",
               "refused the batch|differs from the batch", "sequence 0 must be", "sequence 1 must be",
               "sequence 0 must be", "integer token ids", "refused the batch|sequence 0 must be"]
    for rank, (messages, unchanged, loss) in enumerate(out):
        assert unchanged, f"rank {rank}: master weights changed by a refused step"
        assert np.isfinite(loss)
        for message, needle in zip(messages, needles):
            assert message is not None, f"rank {rank}: a bad step was accepted ({needle})"
            assert any(n in message for n in needle.split("|")), (needle, message)


def test_a_context_no_layout_holds_is_refused_at_construction():
    messages = run_world(4, w.too_long_for_memory, timeout=300)
    for m in messages:
        assert m is not None and "max_context(256)" in m and "the longest that fits is" in m


def test_recalibrated_run_plans_alike_on_every_rank_and_equals_single_process(reference):
    out = run_world(4, w.train, CANDIDATES, False, "auto", True, w.STEPS, True, timeout=600)
    profiles = [o[0][-1] for o in out]
    assert all(p == profiles[0] for p in profiles), "ranks re-calibrated differently"
    assert dict(profiles[0]) != w.hardware().to_dict(), "the measured times changed nothing"
    steps = out[0][0][:-1]
    _check_equal((steps, out[0][1]), reference)
