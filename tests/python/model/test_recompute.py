"""Activation recomputation: full (each layer's forward reruns in the backward pass) and
selective (the attention core only) give the gradients of a run without, under one process,
tensor and pipeline parallelism, and keep fewer bytes for the backward pass."""

import pytest

from hotswitch.testing.harness import run_world

from tests.python.model import recompute_workers as w

MODES = ["none", "selective", "full"]
TOL = 1e-6


def _check(result, saving=True):
    for mode, (loss_diff, grad_diff, _) in result.items():
        assert loss_diff <= TOL, (mode, loss_diff)
        assert grad_diff <= TOL, (mode, grad_diff)
    if saving:
        saved = {mode: s for mode, (_, _, s) in result.items()}
        assert saved["full"] < saved["selective"] < saved["none"], saved


def test_world1_recompute_gives_the_same_gradients():
    _check(run_world(1, w.gradients, "dp1", MODES, timeout=120)[0])


def test_full_recompute_in_chunks_of_layers():
    result = run_world(1, w.gradients, "dp1", ["none", "full"], None, 2, timeout=120)[0]
    _check(result, saving=False)
    assert result["full"][2] < result["none"][2]


def test_recompute_under_bfloat16_autocast():
    # The rerun must compute in the forward's precision, or its gradients drift by bf16 rounding.
    _check(run_world(1, w.gradients, "dp1", MODES, "bfloat16", timeout=120)[0])


@pytest.mark.parametrize("layout", ["tp2", "pp2"])
def test_recompute_under_tensor_and_pipeline_parallelism(layout):
    for result in run_world(2, w.gradients, layout, MODES, timeout=300):
        _check(result)


def test_bad_recompute_values_raise():
    messages, mode = run_world(1, w.bad_recompute, timeout=120)[0]
    assert len(messages) == 5, messages
    assert "'partial'" in messages[0] and "none, selective, full" in messages[0]
    assert "True" in messages[1]
    assert "recompute_num_layers must be an int >= 1, got 0" in messages[2]
    assert "recompute_num_layers must be an int >= 1, got True" in messages[3]
    assert "'block'" in messages[4]
    assert mode == "none"  # a refused mode changes nothing
