"""The fused steps of the layer (``hotswitch.model.fused``): the Triton kernels against the
PyTorch path they replace, step by step and in the whole model, and the launches they make.
On the CPU the kernels run under Triton's interpreter, in spawned processes: the interpreter
must be chosen before ``triton`` is first imported, which this process may already have done."""

import importlib.util

import numpy as np
import pytest
import torch

import hotswitch as hs
from hotswitch.model import fused
from hotswitch.testing.harness import run_world

from tests.python.model import workers as w

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")


@pytest.fixture
def interpreted(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def _check_against_torch(dtype, device, t):
    if device == "cpu":
        ref, got = run_world(1, w.fused_steps, str(dtype), t, timeout=120)[0]
    else:
        ref, got = (w.fused_steps_on("cuda", kernels, dtype, t)[0] for kernels in ("torch", "triton"))
    # fp32: the two differ by the rounding of their last operations; 16 bits: by a few of its
    # roundings (2^-8 relative each) on values of the reference's scale.
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    for name in ref:
        scale = max(1.0, float(np.abs(ref[name]).max()))
        err = float(np.abs(got[name] - ref[name]).max())
        assert err <= tol * scale, f"{name} ({dtype}, T={t}): {err:.3g} > {tol} * {scale:.3g}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("t", [1, 7, 97])
def test_each_triton_step_matches_the_torch_path(interpreted, dtype, t):
    _check_against_torch(dtype, "cpu", t)


def test_triton_steps_launch_one_kernel_per_step_and_direction(interpreted):
    launched = run_world(1, w.fused_launches, timeout=120)[0]
    assert launched == {"torch": {}, "triton": {"norm_fwd": 2, "norm_bwd": 2, "rotary_fwd": 1, "rotary_bwd": 1,
                                                "swiglu_fwd": 1, "swiglu_bwd": 1, "cross_entropy_fwd": 2,
                                                "cross_entropy_bwd": 2}}


@pytest.mark.parametrize("layout,compute_dtype", [("dp1", None), ("tp2", None), ("tp2", "bfloat16")])
def test_model_with_triton_steps_matches_the_torch_path(interpreted, layout, compute_dtype):
    world = hs.Layout.parse(layout).world
    for rank, out in enumerate(run_world(world, w.fused_parity, layout, compute_dtype, timeout=300)):
        (loss_ref, grads_ref), (loss, grads) = out["torch"], out["triton"]
        # bf16: 3e-2 of the largest gradient. Triton's interpreter truncates fp32 -> bf16 where
        # a GPU rounds to nearest (half the values of a random tensor differ, twice the mean
        # error), and every fused step writes bf16.
        tol = 1e-5 if compute_dtype is None else 3e-2
        assert abs(loss - loss_ref) <= tol * abs(loss_ref), (rank, loss, loss_ref)
        assert grads.keys() == grads_ref.keys()
        for name in grads_ref:
            scale = max(float(np.abs(grads_ref[name]).max()), 1e-3)
            np.testing.assert_allclose(grads[name], grads_ref[name], rtol=0, atol=tol * scale,
                                       err_msg=f"rank {rank} {name}")


def test_the_counted_layer_runs_fused_kernels_instead_of_decomposed_steps():
    from hotswitch.calibration.overhead import count_layer_ops

    cfg = hs.TransformerConfig(num_layers=3, hidden_size=64, num_attention_heads=8, num_query_groups=4,
                               ffn_hidden_size=96, vocab_size=128, max_position_embeddings=64,
                               compute_dtype="bfloat16")
    unfused = count_layer_ops(cfg, tp=1, tokens=16, kernels="torch")
    ops = count_layer_ops(cfg, tp=1, tokens=16, kernels="triton")
    launched = {k: v for k, v in ops.items() if k.startswith("triton:")}
    assert launched == {"triton:norm_fwd": 2, "triton:norm_bwd": 2, "triton:rotary_fwd": 1,
                        "triton:rotary_bwd": 1, "triton:swiglu_fwd": 1, "triton:swiglu_bwd": 1}
    for decomposed in ("aten.pow", "aten.rsqrt", "aten.silu", "aten.neg", "aten.slice_backward"):
        assert decomposed in unfused and decomposed not in ops, decomposed
    # Both counts see the same matrix products: only the fused steps differ.
    assert ops["aten.mm"] == unfused["aten.mm"] == 12
    # Outside the layers the loss head's cross entropy is two kernels forward and one backward
    # instead of its decomposition (max, exp, sum, log, gather, ...).
    assert unfused["kernels_outside_layers"] - ops["kernels_outside_layers"] >= 8, \
        (unfused["kernels_outside_layers"], ops["kernels_outside_layers"])


def test_bad_kernel_names_and_places_are_refused(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match="one of torch, triton, got 'cuda'"):
        fused.select_fused(torch.device("cpu"), "cuda")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1; the model is on cpu"):
        fused.select_fused(torch.device("cpu"), "triton")
    assert fused.select_fused(torch.device("cpu")) == "torch"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_triton_steps_match_the_torch_path_on_cuda(dtype):
    assert fused.select_fused(torch.device("cuda")) == "triton"
    _check_against_torch(dtype, "cuda", 97)
