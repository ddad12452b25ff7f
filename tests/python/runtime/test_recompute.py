"""The runtime applies each phase's recompute choice: runs with recomputation equal the
world-1 run without it, and under "auto" only the phases that need it recompute."""

import numpy as np
import pytest

import hotswitch as hs
from hotswitch.testing.harness import run_world

from tests.python.runtime import recompute_workers as w

TOL = 1e-5
# Short enough for every candidate without recomputation under the test's budget (dp2 holds
# about 40 tokens a micro-batch there).
SHORT = [3, 5, 7, 9, 11, 13, 17, 19, 23, 29]
STEPS = [SHORT, SHORT + [256], [256]]
CANDIDATES = ["dp2", "tp2", "pp2"]


@pytest.fixture(scope="module")
def reference():
    return run_world(1, w.train, "auto", "none", 1 << 40, STEPS, timeout=300)[0]


def _check_equal(result, reference):
    steps, weights = result
    ref_steps, ref_weights = reference
    for (loss, ran, planned), (ref_loss, _, _) in zip(steps, ref_steps):
        assert ran == planned
        assert abs(loss - ref_loss) <= TOL * abs(ref_loss), (ran, loss, ref_loss)
    assert weights.keys() == ref_weights.keys()
    assert max(float(np.abs(weights[k] - ref_weights[k]).max()) for k in weights) <= TOL


def test_full_recompute_everywhere_equals_the_reference(reference):
    out = run_world(2, w.train, CANDIDATES, "full", 1 << 40, STEPS, timeout=600)
    assert all(mode == "full" for _, ran, _ in out[0][0] for _, mode in ran)
    _check_equal(out[0], reference)


def test_auto_recomputes_only_the_phases_that_need_it(reference):
    budget = w.budget_needing_recompute(CANDIDATES, 2)
    out = run_world(2, w.train, CANDIDATES, "auto", budget, STEPS, timeout=600)
    steps = out[0][0]
    assert all(o[0] == steps for o in out), "ranks report different steps"
    short, mixed, long = (ran for _, ran, _ in steps)
    assert all(mode == "none" for _, mode in short), short
    assert all(mode != "none" for _, mode in long), long
    assert any(mode != "none" for _, mode in mixed), mixed
    _check_equal(out[0], reference)


@pytest.mark.parametrize("fields,needle", [
    (dict(recompute="block"), "recompute 'block' is not one of none, selective, full, auto"),
    (dict(recompute=None), "recompute None is not one of"),
    (dict(recompute_num_layers=0), "recompute_num_layers must be an int >= 1, got 0"),
    (dict(recompute_num_layers=1.5), "recompute_num_layers must be an int >= 1, got 1.5"),
])
def test_runtime_config_rejects_bad_recompute(fields, needle):
    with pytest.raises(ValueError, match=None) as info:
        hs.RuntimeConfig(**fields)
    assert needle in str(info.value)


def test_runtime_config_recompute_defaults():
    assert hs.RuntimeConfig().recompute == "none"
    assert hs.RuntimeConfig(recompute="auto", recompute_num_layers=2).recompute_num_layers == 2
