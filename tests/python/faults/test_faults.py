"""Faults with real processes: a rank killed during a switch, a phase or a save, a rank that
stalls past the timeout. Survivors raise within the timeout naming the stage, keep the last
complete state, and a restart from the last checkpoint continues training bit for bit."""

import numpy as np
import pytest

from hotswitch.testing import scenarios as w
from hotswitch.testing.harness import run_world

TIMEOUT = 8.0
SLACK = 20.0  # process scheduling on a loaded 2-core machine


@pytest.fixture(scope="module")
def reference():
    return run_world(4, w.uninterrupted, timeout=300)[0]


@pytest.mark.parametrize("stage,action,needle", [
    ("switch", "kill", "switching parameters"),
    ("phase", "kill", "forward and backward"),
    ("save", "kill", "saving checkpoint"),
    ("switch", "stall", "switching parameters"),
    ("phase", "stall", "forward and backward"),
])
def test_survivors_raise_keep_state_and_the_job_resumes(tmp_path, reference, stage, action, needle):
    root = str(tmp_path / "ckpt")
    out = run_world(4, w.scenario, root, stage, action, TIMEOUT, allow_exit=(w.VICTIM,),
                    timeout=6 * TIMEOUT + 120)
    survivors = [r for i, r in enumerate(out) if i != w.VICTIM]
    for r in survivors:
        assert r is not None
        assert r["type"] in ("SwitchFault", "SwitchTimeout"), r
        assert r["elapsed"] <= TIMEOUT + SLACK, r
        assert r["state_kept"], r
        assert r["latest"] == r["first"], r  # the last complete checkpoint is still the latest
    # At least one survivor was in the victim's stage and says so.
    assert any(needle in r["message"] for r in survivors), [r["message"] for r in survivors]
    if action == "stall":
        assert any(r["type"] == "SwitchTimeout" for r in survivors), survivors
    weights, step = run_world(4, w.resume, root, timeout=300)[0]
    ref_weights, ref_step = reference
    assert step == ref_step
    assert all(np.array_equal(weights[k], ref_weights[k]) for k in ref_weights)
