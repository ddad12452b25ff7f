"""The model's forward and backward on CUDA against the CPU. Skipped without a CUDA device;
run by script/gpu-check (``pytest -m gpu``)."""

import numpy as np
import pytest
import torch

from hotswitch.testing.harness import run_world

from tests.python.model import workers as w

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_model_forward_backward_on_cuda_matches_cpu():
    cpu_device, cpu_loss, cpu_grads = run_world(1, w.forward_backward, timeout=300)[0]
    gpu_device, gpu_loss, gpu_grads = run_world(1, w.forward_backward, backend="nccl", timeout=300)[0]
    assert (cpu_device, gpu_device) == ("cpu", "cuda")
    assert abs(gpu_loss - cpu_loss) <= 1e-5 * abs(cpu_loss)
    assert cpu_grads.keys() == gpu_grads.keys()
    for name in cpu_grads:
        np.testing.assert_allclose(gpu_grads[name], cpu_grads[name], rtol=1e-4, atol=1e-6, err_msg=name)


def test_packs_run_their_layers_and_loss_without_the_host_waiting_for_the_device():
    # Once a pack's context is built, nothing in the forward, the backward or the loss makes the
    # host wait for the device (an .item(), a copy to the host, a data-dependent shape), so
    # the host can queue the next layers' kernels while the device runs the current ones. With
    # a flash kernel, building the context does not wait either: its tensors go through pinned
    # memory (hotswitch.model.batch.to_device), so the next step's packs are built while the
    # optimizer still runs.
    attention, fused, build_error, run_error = run_world(1, w.host_waits_of_a_micro_batch, backend="nccl",
                                                         timeout=300)[0]
    assert run_error is None, f"{attention} attention, {fused} steps: {run_error}"
    assert build_error is None, f"{attention} attention: {build_error}"


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_graph_buckets_capture_cuda_graphs_and_train_as_the_unpadded_model(recompute):
    # The CPU test's calls on the device in bf16: the padded packs' layers are captured as CUDA
    # graphs (none skipped) and replayed on the second call, with the losses and gradients of
    # the unpadded model within bf16's rounding (2e-2 of the largest gradient).
    (out, breaks, cudagraphs), = run_world(1, w.graphed_layers_parity, recompute, "bfloat16", backend="nccl",
                                           timeout=600)
    (losses, grads, graphs), (ref_losses, ref_grads, _) = out[True], out[False]
    np.testing.assert_allclose(losses, ref_losses, rtol=2e-2)
    for name in grads:
        scale = max(float(np.abs(ref_grads[name]).max()), 1e-6)
        assert float(np.abs(grads[name] - ref_grads[name]).max()) <= 2e-2 * scale, name
    # (On the device every bucket's attention is static: the 70-token pack pads to 128.)
    assert graphs[0][1] == [(32, True), (64, True), (128, True)], graphs
    assert graphs[1][0] == graphs[0][0], graphs
    assert breaks == [], breaks
    assert not cudagraphs.get("cudagraph_skips"), cudagraphs


@pytest.mark.parametrize("layout", ["dp1"])
def test_weight_gradients_accumulated_in_the_products_on_cuda_equal_autograds(layout):
    # hotswitch.model.wgrad on the device: bf16 operands, fp32 masters. Where the device takes
    # out_dtype, each micro-batch's weight gradient accumulates in fp32 without the bf16
    # rounding of autograd's product: within bf16's rounding of it (2e-2 of the largest).
    import warnings

    from hotswitch.model import wgrad

    if not wgrad.widening_products(torch.device("cuda", torch.cuda.current_device())):
        warnings.warn(f"torch {torch.__version__} has no widening addmm (out_dtype) here: weight gradients "
                      f"accumulate as a bf16 product, then its addition")
    out = run_world(1, w.wgrad_parity, layout, "bfloat16", "none", backend="nccl", timeout=300)[0]
    (losses, grads, fused), (ref_losses, ref_grads, unfused) = out[True], out[False]
    assert fused > 0 and unfused == 0, (fused, unfused)
    assert losses == ref_losses, (losses, ref_losses)
    for name in grads:
        scale = max(float(np.abs(ref_grads[name]).max()), 1e-6)
        assert float(np.abs(grads[name] - ref_grads[name]).max()) <= 2e-2 * scale, name
