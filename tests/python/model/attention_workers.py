"""Rank functions of the attention tests (module-level so that spawned ranks can import them)."""

import collections
import math

import pytest
import torch

import hotswitch as hs
import hotswitch.model.attention as attention
from tests.python.model import workers as mw
from hotswitch.model.context import ContextAttention, ContextSplit
from hotswitch.model.transformer import PackContext
from hotswitch.testing.reference import train_static

# 64 distinct lengths, shuffled: 2080 tokens.
DISTINCT_64 = [int(n) for n in torch.randperm(64, generator=torch.Generator().manual_seed(3)) + 1]
# Two query heads over one K/V head (grouped-query), head dim 16.
SMALL_HEADS = dict(num_layers=2, hidden_size=32, num_attention_heads=2, num_query_groups=1, ffn_hidden_size=64)


def reference_attention(q, k, v, lengths):
    """Per-sequence causal attention in float64 on the CPU, K/V heads repeated explicitly;
    differentiable in q, k and v."""
    out, start = [], 0
    repeat = q.shape[1] // k.shape[1]
    for n in lengths:
        qs, ks, vs = (x[start:start + n].double().cpu() for x in (q, k, v))
        ks, vs = ks.repeat_interleave(repeat, 1), vs.repeat_interleave(repeat, 1)
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(q.shape[-1])
        scores = scores + torch.full((n, n), float("-inf"), dtype=torch.float64).triu(1)
        out.append(torch.einsum("hqk,khd->qhd", scores.softmax(-1), vs))
        start += n
    return torch.cat(out)


def flash_varlen_stand_in(q, k, v, cu_q, cu_k, max_q, max_k, causal):
    """``flash_attn_varlen_func``'s contract, on any device: sequence ``i``'s queries
    ``q[cu_q[i]:cu_q[i+1]]`` against its keys ``k[cu_k[i]:cu_k[i+1]]``, the causal mask
    aligned to the bottom right (flash-attn >= 2.1), K/V heads shared by ``hq / hkv`` query
    heads; checks the arguments flash-attn requires."""
    assert causal is True
    assert cu_q.dtype == cu_k.dtype == torch.int32 and cu_q.shape == cu_k.shape
    lq, lk = (cu[1:] - cu[:-1] for cu in (cu_q, cu_k))
    assert int(lq.max()) == max_q and int(lk.max()) == max_k, (max_q, max_k)
    assert int(cu_q[-1]) == q.shape[0] and int(cu_k[-1]) == k.shape[0] and k.shape == v.shape
    repeat = q.shape[1] // k.shape[1]
    outs = []
    for i in range(lq.numel()):
        qs = q[int(cu_q[i]):int(cu_q[i + 1])]
        ks, vs = (x[int(cu_k[i]):int(cu_k[i + 1])].repeat_interleave(repeat, 1) for x in (k, v))
        n_q, n_k = qs.shape[0], ks.shape[0]
        scores = torch.einsum("qhd,khd->hqk", qs, ks) / math.sqrt(q.shape[-1])
        future = torch.arange(n_k)[None, :] > torch.arange(n_q)[:, None] + (n_k - n_q)
        probs = scores.masked_fill(future.to(q.device), float("-inf")).softmax(-1)
        outs.append(torch.einsum("hqk,khd->qhd", probs, vs))
    return torch.cat(outs)


try:
    import torch.nn.attention.varlen as TORCH_VARLEN  # PyTorch >= 2.10
except ImportError:
    TORCH_VARLEN = None


def needs_torch_varlen(kernel):
    """Skips a ``varlen`` case on a PyTorch without ``torch.nn.attention.varlen``."""
    if kernel == "varlen" and TORCH_VARLEN is None:
        pytest.skip("this torch has no torch.nn.attention.varlen (2.10 and later)")


def torch_varlen_stand_in(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, *, return_aux=None, scale=None,
                          window_size=(-1, -1), enable_gqa=False):
    """``torch.nn.attention.varlen.varlen_attn``'s contract (PyTorch 2.11 on), causal only,
    on any device: what it refuses (fewer K/V heads without ``enable_gqa``) raises as there."""
    assert return_aux is None and scale is None
    assert tuple(window_size) == (-1, 0), window_size  # causal from the bottom right
    if key.shape[1] != query.shape[1] and not enable_gqa:
        raise ValueError("Number of heads in key/value must equal number of heads in query")
    return flash_varlen_stand_in(query, key, value, cu_seq_q, cu_seq_k, max_q, max_k, causal=True)


def flex_stand_ins(block=128):
    """``(create_block_mask, flex_attention)`` with FlexAttention's contract, dense, on any
    device: the mask is ``mask_mod`` evaluated on every (query, key) index pair (lengths
    multiples of ``block``); attention checks that no query row is fully masked."""

    def create_block_mask(mask_mod, b, h, q_len, kv_len, device):
        assert q_len % block == 0 and kv_len % block == 0, (q_len, kv_len)
        return mask_mod(None, None, torch.arange(q_len)[:, None], torch.arange(kv_len)[None, :])

    def flex_attention(q, k, v, block_mask, enable_gqa):
        assert q.shape[0] == 1 and q.shape[2] == block_mask.shape[0] and k.shape[2] == block_mask.shape[1]
        assert enable_gqa == (q.shape[1] != k.shape[1])
        assert bool(block_mask.any(-1).all()), "a query row is fully masked"
        repeat = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(repeat, 1), v.repeat_interleave(repeat, 1)
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        return torch.matmul(scores.masked_fill(~block_mask.to(q.device), float("-inf")).softmax(-1), v)

    return create_block_mask, flex_attention


def _device():
    nccl = torch.distributed.get_backend() == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def count_kernel_calls(rank, world, kernel, max_scores, lengths, compute_dtype=None, layout_name="dp1"):
    """Forward and backward of a 2-layer model on one pack of ``lengths`` under
    ``layout_name`` (one replica: dp1 or a cp layout) on the backend's device, with every
    kernel function of ``hotswitch.model.attention`` wrapped to count its calls.
    ``kernel``: forced, or None for the default choice; ``max_scores``: the mask kernels'
    bound on this device (None: as shipped).

    Returns ``(chosen kernel, kernel the pack ran, {function: calls}, num_layers, loss)``
    (this rank's; under cp the loss of its part of the pack)."""
    device = _device()
    if max_scores is not None:
        attention.MASKED_MAX_SCORES[device.type] = max_scores
    cfg = mw.config(**SMALL_HEADS, compute_dtype=compute_dtype)
    layout = hs.Layout.parse(layout_name)
    groups = hs.ParallelGroups(layout)
    model = hs.ParallelTransformer(cfg, layout, groups, seed=1, attention=kernel)
    calls = collections.Counter()
    names = set(attention.KERNEL_FUNCTIONS.values()) | set(attention.CONTEXT_KERNEL_FUNCTIONS.values())
    originals = {name: getattr(attention, name) for name in names}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    mb = mw.batches(step_lengths=[[lengths]])[0][0]
    heads = cfg.num_attention_heads // layout.tp
    if layout.cp > 1:
        split = ContextSplit(mb.cu_seqlens, layout.cp, groups.cp_rank, multiple=layout.tp)
        ran = ContextAttention(split, None, model.attention_kernel, heads, device).kernel
    else:
        ran = PackContext(mb, cfg, 1, device, model.attention_kernel).attention.kernel
    try:
        for name, fn in originals.items():
            setattr(attention, name, counting(name, fn))
        loss, _ = model.forward_backward([mb], 1.0)
    finally:
        for name, fn in originals.items():
            setattr(attention, name, fn)
    return model.attention_kernel, ran, dict(calls), cfg.num_layers, loss


def train_compute_dtype(rank, world, name, compute_dtype):
    """Trains the tiny model under ``name`` on the backend's device with ``compute_dtype``
    (TF32 off); returns the losses and the dtypes of the parameters and their gradients."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    layout = hs.Layout.parse(name)
    cfg = mw.config(compute_dtype=compute_dtype)
    losses, model = train_static(cfg, layout, mw.batches(), lr=mw.LR, eps=mw.EPS)
    model.zero_grad()
    model.forward_backward(mw.batches()[0], 1.0)
    tensors = list(model.named_shards().values()) + list(model.grad_shards().values())
    return losses, sorted({str(t.dtype) for t in tensors}), sorted({t.device.type for t in tensors})
