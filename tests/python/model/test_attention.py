"""Packed variable-length attention: every kernel against a per-sequence float64 reference,
one kernel call per layer, the vectorised pack context, and bf16 compute under autocast.

Kernels that need CUDA are tested where they run: the ``gpu`` tests skip cleanly without a
CUDA device (``script/gpu-check`` runs them).
"""

import logging
import math
import sys
import types

import pytest
import torch

from tests.python.model import attention_workers as aw
import hotswitch as hs
import hotswitch.model.attention as attention
from tests.python.model import workers as mw
from hotswitch.model.attention import PackAttention, available_kernels, select_kernel
from hotswitch.model.layers import rotary_tables
from hotswitch.model.transformer import PackContext
from hotswitch.testing.harness import run_world

CPU = torch.device("cpu")
# Awkward packs: lengths 1, primes, repeats, one long outlier; and a single sequence.
PACKS = [[1, 7, 3, 7, 31, 2, 1], [97], [5, 1, 1, 2, 3, 89, 13, 1]]


def _inputs(lengths, hq=4, hkv=2, d=16, device=CPU, seed=0):
    gen = torch.Generator().manual_seed(seed)
    t = sum(lengths)
    q, k, v = (torch.randn(t, h, d, generator=gen).to(device) for h in (hq, hkv, hkv))
    return q, k, v, torch.tensor([0] + lengths).cumsum(0)


def _forward_backward(kernel, lengths, q, k, v, cu):
    q, k, v = (x.clone().requires_grad_() for x in (q, k, v))
    pack = PackAttention(cu, kernel, q.shape[1], q.device)
    out = pack(q, k, v)
    # A fixed random cotangent, so that the gradients depend on every output element.
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(out.device, out.dtype)
    (out * weight).sum().backward()
    return pack.kernel, out, (q.grad, k.grad, v.grad)


@pytest.fixture
def unbounded(monkeypatch):
    """The mask kernels take every pack of these tests in one call."""
    monkeypatch.setitem(attention.MASKED_MAX_SCORES, "cpu", 1 << 40)
    monkeypatch.setitem(attention.MASKED_MAX_SCORES, "cuda", 1 << 40)


def _check_kernel_matches(kernel, device, lengths, tol=1e-5, dtype=torch.float32):
    q, k, v, cu = _inputs(lengths, device=device)
    expected = aw.reference_attention(q, k, v, lengths)
    ran, out, grads = _forward_backward(kernel, lengths, *(x.to(dtype) for x in (q, k, v)), cu)
    assert ran == kernel
    assert out.shape == q.shape and out.dtype == dtype
    assert float((out.double().cpu() - expected).abs().max()) < tol, kernel
    # The gradients against the grouped kernel in fp32 (today's path).
    _, _, expected_grads = _forward_backward("grouped", lengths, q, k, v, cu)
    for got, want in zip(grads, expected_grads):
        assert float((got.double() - want.double()).abs().max()) < tol * 10, kernel


@pytest.mark.parametrize("lengths", PACKS, ids=lambda p: f"{len(p)}seqs")
@pytest.mark.parametrize("kernel", ["masked", "grouped"])
def test_kernels_match_the_per_sequence_reference(kernel, lengths, unbounded):
    _check_kernel_matches(kernel, CPU, lengths)


@pytest.mark.parametrize("lengths", PACKS, ids=lambda p: f"{len(p)}seqs")
def test_sdpa_kernel_matches_the_per_sequence_reference(lengths, unbounded):
    _check_kernel_matches("sdpa", CPU, lengths)


@pytest.mark.parametrize("lengths", PACKS + [[128], [60, 68, 1]], ids=lambda p: f"{len(p)}seqs-{sum(p)}")
@pytest.mark.parametrize("kernel", ["flash_attn", "varlen", "flex"])
def test_flash_and_flex_packs_match_the_reference_with_stand_in_kernels(kernel, lengths, stand_ins):
    aw.needs_torch_varlen(kernel)
    _check_kernel_matches(kernel, CPU, lengths)


@pytest.mark.parametrize("version,used", [("2.0.9", False), ("2.0rc3", False), (None, False), ("2.1.0", True),
                                          ("2.7.4.post1", True), ("3.0.0b1", True)])
def test_flash_attn_is_used_from_2_1_only(monkeypatch, version, used):
    # Context parallelism needs the causal mask aligned to the bottom right (flash-attn 2.1).
    fake = types.ModuleType("flash_attn")

    def varlen(*args, **kwargs):
        raise AssertionError("not called here")

    fake.flash_attn_varlen_func = varlen
    if version is not None:
        fake.__version__ = version
    monkeypatch.setitem(sys.modules, "flash_attn", fake)
    attention._import_flash.cache_clear()
    try:
        assert (attention._import_flash() is varlen) == used, version
    finally:
        attention._import_flash.cache_clear()


def test_varlen_is_offered_only_after_it_matched_sdpa_on_the_device(stand_ins, monkeypatch, caplog):
    # Its check on the CPU with the stand-in (CUDA runs the same on the device): a kernel that
    # matches is used; one that raises or computes something else is left out, with a warning.
    aw.needs_torch_varlen("varlen")
    check = attention._varlen_runs.__wrapped__
    assert check(CPU, torch.bfloat16, 16)

    def raises(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False):
        raise RuntimeError("FlashAttention only supports Ampere GPUs or newer.")

    def reversed_rows(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1),
                      enable_gqa=False):
        return aw.torch_varlen_stand_in(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, window_size=window_size,
                                        enable_gqa=enable_gqa).flip(0)

    def top_left(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, window_size=(-1, -1), enable_gqa=False):
        # A causal mask aligned to the top left: right for whole sequences, wrong for the
        # fewer queries than keys of context parallelism.
        first = torch.cat([torch.arange(int(cu_seq_k[i]), int(cu_seq_k[i]) + int(cu_seq_q[i + 1] - cu_seq_q[i]))
                           for i in range(cu_seq_q.numel() - 1)])
        return aw.torch_varlen_stand_in(query, key[first], value[first], cu_seq_q, cu_seq_q, max_q, max_q,
                                        window_size=window_size, enable_gqa=enable_gqa)

    for broken, message in ((raises, "does not run"), (reversed_rows, "differs from sdpa"),
                            (top_left, "differs from sdpa")):
        monkeypatch.setattr(aw.TORCH_VARLEN, "varlen_attn", broken)
        attention._import_varlen.cache_clear()
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=hs.get_logger("model").name):
            assert not check(CPU, torch.bfloat16, 16)
        assert message in caplog.text, caplog.text


def _fake_varlen_module(monkeypatch, varlen_attn):
    fake = types.ModuleType("torch.nn.attention.varlen")
    fake.varlen_attn = varlen_attn
    monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", fake)
    attention._import_varlen.cache_clear()


def test_varlen_speaks_each_releases_keywords(monkeypatch):
    calls = []
    try:
        # 2.10: is_causal, and no enable_gqa.
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, is_causal=False, return_aux=None,
                        scale=None):
            calls.append({"is_causal": is_causal})
            return query

        _fake_varlen_module(monkeypatch, varlen_attn)
        q, kv = torch.zeros(3, 4, 8), torch.zeros(3, 2, 8)
        cu = torch.tensor([0, 3], dtype=torch.int32)
        attention._flash_kernel(q, kv, kv, cu, cu, 3, 3, "varlen")
        assert calls.pop() == {"is_causal": True}

        # Later: window_size (causal is (-1, 0)) and enable_gqa for fewer K/V heads.
        def varlen_attn(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                        window_size=(-1, -1), enable_gqa=False):
            calls.append({"window_size": window_size, "enable_gqa": enable_gqa})
            return query

        _fake_varlen_module(monkeypatch, varlen_attn)
        attention._flash_kernel(q, kv, kv, cu, cu, 3, 3, "varlen")
        assert calls.pop() == {"window_size": (-1, 0), "enable_gqa": True}
        attention._flash_kernel(q, q, q, cu, cu, 3, 3, "varlen")
        assert calls.pop() == {"window_size": (-1, 0), "enable_gqa": False}
        with pytest.raises(ValueError, match="causal attention only"):
            attention._import_varlen()(q, q, q, cu, cu, 3, 3, causal=False)

        # A signature it cannot read causality into: not used.
        _fake_varlen_module(monkeypatch, lambda query, key, value, cu_seq_q, cu_seq_k, max_q, max_k: query)
        assert attention._import_varlen() is None
        # A torch without the module (before 2.10): not used.
        monkeypatch.setitem(sys.modules, "torch.nn.attention.varlen", None)
        attention._import_varlen.cache_clear()
        assert attention._import_varlen() is None
    finally:
        attention._import_varlen.cache_clear()


def test_masked_kernel_does_not_repeat_key_value_heads(monkeypatch, unbounded):
    q, k, v, cu = _inputs([3, 17, 8], hq=8, hkv=2)
    pack = PackAttention(cu, "masked", 8, CPU)

    def refuse(*args, **kwargs):
        raise AssertionError("K/V heads repeated")

    monkeypatch.setattr(torch.Tensor, "repeat_interleave", refuse)
    monkeypatch.setattr(torch, "repeat_interleave", refuse)
    out = pack(q, k, v)
    monkeypatch.undo()
    assert out.shape == q.shape
    assert float((out.double() - aw.reference_attention(q, k, v, [3, 17, 8])).abs().max()) < 1e-5


def test_mask_kernels_run_grouped_beyond_their_bound(monkeypatch):
    monkeypatch.setitem(attention.MASKED_MAX_SCORES, "cpu", 4 * 20 * 20)
    cu = torch.tensor([0, 5, 20])
    assert PackAttention(cu, "masked", 4, CPU).kernel == "masked"  # 4 * 20^2 scores
    assert PackAttention(torch.tensor([0, 5, 21]), "masked", 4, CPU).kernel == "grouped"
    assert PackAttention(cu, "masked", 5, CPU).kernel == "grouped"
    assert PackAttention(cu, "grouped", 1, CPU).kernel == "grouped"


def test_pack_attention_rejects_bad_input():
    with pytest.raises(ValueError, match="'dense' is not one of"):
        PackAttention(torch.tensor([0, 3]), "dense", 2, CPU)
    pack = PackAttention(torch.tensor([0, 3, 5]), "masked", 2, CPU)
    with pytest.raises(ValueError, match="pack of 5 tokens"):
        pack(torch.zeros(4, 2, 8), torch.zeros(4, 1, 8), torch.zeros(4, 1, 8))
    with pytest.raises(ValueError, match="hkv dividing hq"):
        pack(torch.zeros(5, 3, 8), torch.zeros(5, 2, 8), torch.zeros(5, 2, 8))


def test_select_kernel_prefers_in_order_and_logs_once(monkeypatch):
    kernels = available_kernels(CPU, torch.float32, 16)
    assert kernels[-2:] == ["masked", "grouped"]
    assert not {"flash_attn", "varlen", "flex"} & set(kernels)  # CUDA only
    assert kernels[0] == "sdpa"
    monkeypatch.setattr(attention, "_chosen", {})
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = hs.get_logger("model")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        assert select_kernel(CPU, torch.float32, 16) == kernels[0]
        assert select_kernel(CPU, torch.float32, 16) == kernels[0]
        assert select_kernel(CPU, torch.float32, 16, prefer="grouped") == "grouped"
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    assert len(records) == 1, [r.getMessage() for r in records]
    assert f"attention kernel on cpu float32, head dim 16: {kernels[0]}" in records[0].getMessage()
    with pytest.raises(ValueError, match="'flash_attn' does not run on cpu"):
        select_kernel(CPU, torch.float32, 16, prefer="flash_attn")


@pytest.mark.skipif(torch.cuda.is_available(), reason="judges a CUDA device's kernel from a host without one")
def test_a_host_without_a_gpu_judges_the_kernel_a_gpu_selects(monkeypatch):
    # A dry run plans GPUs from here: the kernel decides which graph buckets run static.
    flex = attention._import_flex() is not None
    assert attention.cuda_kernel(torch.bfloat16, 64) == ("flex" if flex else "sdpa")
    assert attention.cuda_kernel(torch.float32, 8) == "sdpa"  # FlexAttention takes head dims from 16
    assert attention.cuda_kernel(torch.bfloat16, 24) == "sdpa"  # nor one that is not a power of two
    monkeypatch.setattr(attention, "_import_flash", lambda: object())
    assert attention.cuda_kernel(torch.bfloat16, 24) == "flash_attn"
    assert attention.cuda_kernel(torch.float32, 24) == "sdpa"  # flash-attn takes half precision only
    assert PackAttention.max_static_scores("sdpa", torch.device("cuda")) == 1 << 24


# ----------------------------------------------------------------------------- calls per layer


def test_one_kernel_call_per_layer_for_64_distinct_lengths():
    """Before: the grouped path calls its kernel once per distinct length (64 per layer).
    The mask kernel calls its kernel once per layer (its bound raised to take the pack)."""
    chosen, ran, calls, layers, grouped_loss = run_world(
        1, aw.count_kernel_calls, "grouped", None, aw.DISTINCT_64, timeout=300)[0]
    assert (chosen, ran) == ("grouped", "grouped")
    assert calls == {"_causal_blocks": 64 * layers}
    chosen, ran, calls, layers, masked_loss = run_world(
        1, aw.count_kernel_calls, "masked", 1 << 26, aw.DISTINCT_64, timeout=300)[0]
    assert (chosen, ran) == ("masked", "masked")
    assert calls == {"_masked_kernel": layers}
    assert abs(masked_loss - grouped_loss) <= 1e-5 * abs(grouped_loss)


def test_default_kernel_on_cpu_runs_small_packs_in_one_call_and_large_ones_grouped():
    chosen, ran, calls, layers, _ = run_world(1, aw.count_kernel_calls, None, None, [5, 1, 30, 2], timeout=300)[0]
    assert chosen == ran == available_kernels(CPU, torch.float32, 16)[0]  # 2 heads * 38^2 <= 2^15
    assert calls == {attention.KERNEL_FUNCTIONS[chosen]: layers}
    chosen, ran, calls, layers, _ = run_world(1, aw.count_kernel_calls, None, None, aw.DISTINCT_64, timeout=300)[0]
    assert ran == "grouped" and calls == {"_causal_blocks": 64 * layers}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("compute_dtype", [None, "bfloat16"])
def test_gpu_default_kernel_one_call_per_layer_for_64_distinct_lengths(compute_dtype):
    chosen, ran, calls, layers, loss = run_world(1, aw.count_kernel_calls, None, None, aw.DISTINCT_64, compute_dtype,
                                                 backend="nccl", timeout=300)[0]
    assert chosen == ran and chosen != "grouped", chosen
    assert calls == {attention.KERNEL_FUNCTIONS[chosen]: layers}, calls
    assert math.isfinite(loss)


# ----------------------------------------------------------------------------- pack context


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_pack_context_positions_targets_and_weights(tp):
    lengths = [1, 7, 3, 2]  # 13 tokens: padded to 14 under tp2, 16 under tp4
    cfg = mw.config()
    mb = mw.batches(step_lengths=[[lengths]])[0][0]
    ctx = PackContext(mb, cfg, tp, CPU, "masked")
    padded = -(-13 // tp) * tp
    positions, targets, weights = [], [], []
    for n, start in zip(lengths, [0, 1, 8, 11]):
        positions += list(range(n))
        targets += mb.tokens[start + 1:start + n].tolist() + [None]
        weights += [1.0] * (n - 1) + [0.0]
    positions += list(range(padded - 13))
    weights += [0.0] * (padded - 13)
    assert (ctx.num_tokens, ctx.rows, ctx.num_targets) == (padded, padded // tp, 9)
    assert ctx.weights.tolist() == weights
    assert [t for t, w in zip(ctx.targets.tolist(), weights) if w] == [t for t in targets if t is not None]
    cos, sin = rotary_tables(torch.tensor(positions), cfg.head_dim, cfg.rope_theta, torch.float32)
    assert torch.equal(ctx.cos, cos) and torch.equal(ctx.sin, sin)
    assert ctx.attention.num_sequences == len(lengths) + (padded > 13)


# ----------------------------------------------------------------------------- bf16 compute


def test_compute_dtype_is_checked():
    with pytest.raises(ValueError, match="compute_dtype 'float64'"):
        mw.config(compute_dtype="float64")
    with pytest.raises(ValueError, match="compute_dtype 'bfloat16' with dtype 'bfloat16'"):
        mw.config(compute_dtype="bfloat16", dtype="bfloat16")
    with pytest.raises(ValueError, match="compute_dtype 'float16' with dtype 'float16'"):
        mw.config(compute_dtype="float16", dtype="float16")
    assert mw.config(compute_dtype="float16").compute_dtype == "float16"


def test_float16_compute_is_refused_where_autocast_lacks_it():
    from hotswitch.model.transformer import autocast_runs

    runs = autocast_runs("cpu", torch.float16)
    try:
        run_world(1, aw.train_compute_dtype, "dp1", "float16", timeout=300)
        refused = None
    except Exception as e:  # the rank's ValueError, re-raised by the harness
        refused = str(e)
    if runs:
        assert refused is None, refused
    else:
        assert refused is not None and "no float16 autocast on cpu" in refused, refused


def test_bf16_compute_keeps_fp32_parameters_and_gradients_on_cpu():
    """Autocast on the CPU: the losses move by bf16 rounding, not more, and not by nothing;
    a tp2 run agrees with the world-1 run to bf16 rounding."""
    fp32, dtypes32, _ = run_world(1, aw.train_compute_dtype, "dp1", None, timeout=300)[0]
    bf16, dtypes16, devices = run_world(1, aw.train_compute_dtype, "dp1", "bfloat16", timeout=300)[0]
    assert dtypes32 == dtypes16 == ["torch.float32"] and devices == ["cpu"]
    diffs = [abs(a - b) / abs(b) for a, b in zip(bf16, fp32)]
    assert 0 < max(diffs) < 2e-2, diffs
    tp2 = run_world(2, aw.train_compute_dtype, "tp2", "bfloat16", timeout=300)
    for losses, dtypes, _ in tp2:
        assert dtypes == ["torch.float32"]
        assert max(abs(a - b) / abs(b) for a, b in zip(losses, bf16)) < 2e-2


# ----------------------------------------------------------------------------- CUDA kernels


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lengths", PACKS, ids=lambda p: f"{len(p)}seqs")
def test_cuda_kernels_match_the_per_sequence_reference(lengths, unbounded):
    """fp32 kernels within 1e-5 (TF32 off); flash_attn and varlen, fp16/bf16 only, within bf16
    rounding."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cuda = torch.device("cuda")
    fp32 = available_kernels(cuda, torch.float32, 16)
    assert fp32[-2:] == ["masked", "grouped"]
    for kernel in fp32:
        _check_kernel_matches(kernel, cuda, lengths)
    bf16 = available_kernels(cuda, torch.bfloat16, 16)
    if attention._import_varlen() is not None and torch.cuda.get_device_capability(cuda)[0] >= 8:
        # Its check on the device passed (a failure is logged with its reason): else the model
        # silently runs flex, and this says why.
        assert "varlen" in bf16, bf16
    for kernel in attention.FLASH_KERNELS:
        if kernel in bf16:
            _check_kernel_matches(kernel, cuda, lengths, tol=2e-2, dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_compute_on_cuda_agrees_with_fp32_on_cpu():
    fp32, _, _ = run_world(1, aw.train_compute_dtype, "dp1", None, timeout=300)[0]
    bf16, dtypes, devices = run_world(1, aw.train_compute_dtype, "dp1", "bfloat16", backend="nccl", timeout=300)[0]
    assert dtypes == ["torch.float32"] and devices == ["cuda"]
    assert max(abs(a - b) / abs(b) for a, b in zip(bf16, fp32)) < 2e-2
