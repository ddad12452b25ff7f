"""hotswitch.analysis.trace: a profiler trace's step windows, busy time and work by kind."""

import gzip
import json

import pytest
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from hotswitch.analysis.trace import KINDS, kernel_kind, load_trace, summarize


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": 7, "args": args}


def _cuda_trace():
    """Two annotated steps of 100 us each and work on the GPU, in kineto's categories."""
    return [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "python"}},
        _x("user_annotation", "step", 0.0, 100.0),
        _x("user_annotation", "step", 200.0, 100.0),
        _x("user_annotation", "other", 0.0, 300.0),
        # step 1: a GEMM and, overlapping it, an NCCL kernel; a gap; our Triton kernel
        _x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", 10.0, 40.0),
        _x("kernel", "ncclDevKernel_AllGather_RING_LL", 30.0, 30.0),
        _x("kernel", "norm_fwd", 80.0, 10.0),
        _x("cuda_runtime", "cudaStreamSynchronize", 95.0, 3.0),
        _x("cuda_runtime", "cudaLaunchKernel", 5.0, 3.0),
        # step 2: flash attention, a copy, the fused AdamW
        _x("kernel", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128>>", 210.0, 20.0),
        _x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 240.0, 5.0),
        _x("kernel", "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>",
           250.0, 20.0),
        _x("kernel", "void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", 290.0, 30.0),
        # outside every step
        _x("kernel", "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 150.0, 40.0),
        _x("cuda_runtime", "cudaDeviceSynchronize", 150.0, 3.0),
    ]


def test_a_cuda_trace_is_summed_over_its_step_windows_by_kind():
    s = summarize(_cuda_trace(), window="step")
    assert s.device == "cuda" and s.windows == 2
    assert s.window_s == pytest.approx(200e-6)
    # step 1: [10, 60) and [80, 90) = 60 us; step 2: 20 + 5 + 20 + 10 (cut at the window's end) = 55 us
    assert s.busy_s == pytest.approx(115e-6)
    assert s.busy_share == pytest.approx(115 / 200)
    assert s.kernels == 7 and s.syncs == 1
    kinds = s.seconds_by_kind
    assert set(kinds) == set(KINDS)
    assert kinds["matmul"] == pytest.approx(40e-6)  # the GEMM outside both steps is not counted
    assert kinds["collective"] == pytest.approx(30e-6)
    assert kinds["fused"] == pytest.approx(10e-6)
    assert kinds["attention"] == pytest.approx(20e-6)
    assert kinds["memory"] == pytest.approx(5e-6)
    assert kinds["optimizer"] == pytest.approx(20e-6)
    assert kinds["elementwise"] == pytest.approx(10e-6)  # cut at the window's end, as busy_s
    assert s.top[0][0].startswith("sm90_xmma_gemm") and s.top[0][1:] == (1, pytest.approx(40e-6))
    per = s.per_window()
    assert per["kernels"] == 3.5 and per["busy_s"] == pytest.approx(57.5e-6)


def test_the_whole_trace_is_one_window_without_a_name_and_an_unknown_name_is_refused():
    s = summarize(_cuda_trace())
    assert s.windows == 1 and s.window_s == pytest.approx(320e-6) and s.kernels == 8 and s.syncs == 2
    with pytest.raises(ValueError, match=r"no user_annotation range named 'steps'.*\['other', 'step'\]"):
        summarize(_cuda_trace(), window="steps")


@pytest.mark.parametrize("name,category,kind", [
    ("nvjet_tst_128x256_64x4_1x2_h_bz_coopA_NNT", "kernel", "matmul"),
    ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8", "kernel", "matmul"),
    ("triton_tem_fused_flex_attention_backward_0", "kernel", "attention"),
    ("rotary_bwd", "kernel", "fused"),
    ("cross_entropy_fwd", "kernel", "fused"),
    ("Memset (Device)", "gpu_memset", "memory"),
    ("void at::native::reduce_kernel<512, 1>", "kernel", "elementwise"),
    ("aten::mm", "cpu_op", "matmul"),
    ("aten::_scaled_dot_product_flash_attention_for_cpu", "cpu_op", "attention"),
    ("c10d::allgather_", "cpu_op", "collective"),
    ("aten::_fused_adamw_", "cpu_op", "optimizer"),
    ("aten::mul", "cpu_op", "elementwise"),
    ("aten::broadcast_tensors", "cpu_op", "elementwise"),
    ("c10d::broadcast_", "cpu_op", "collective"),
    ("some_kernel", "kernel", "other"),
])
def test_kernel_kind_reads_the_name(name, category, kind):
    assert kernel_kind(name, category) == kind


def test_a_cpu_trace_counts_the_operators_that_do_work_and_reads_back_gzipped(tmp_path):
    x = torch.randn(64, 64, requires_grad=True)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with record_function("step"):
                y = torch.nn.functional.silu(x @ x).sum()
                y.backward()
        (x @ x).sum()  # outside the windows
    path = str(tmp_path / "trace.json")
    prof.export_chrome_trace(path)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        g.write(f.read())
    events = load_trace(path + ".gz")
    assert events == load_trace(path)
    s = summarize(events, window="step")
    assert s.device == "cpu" and s.windows == 2 and s.syncs == 0
    assert 0 < s.busy_s <= s.window_s
    # per step: the forward's mm and two backward mms at least, never aten::matmul (it calls mm)
    assert s.seconds_by_kind["matmul"] > 0
    names = {name for name, _, _ in summarize(events, window="step", top=1000).top}
    assert "aten::mm" in names and "aten::matmul" not in names
    counts = {name: c for name, c, _ in summarize(events, window="step", top=1000).top}
    assert counts["aten::mm"] == 2 * 3


def test_load_trace_refuses_a_file_without_events(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"traceEvents": 3}))
    with pytest.raises(ValueError, match="expected a Chrome trace with a traceEvents list, got int"):
        load_trace(str(path))
