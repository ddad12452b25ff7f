"""Rank functions of the attention tests (module-level so that spawned ranks can import them)."""

import collections

import torch

import hotswitch as hs
import hotswitch.model.attention as attention
from tests.python.model import workers as mw
from hotswitch.model.transformer import PackContext
from hotswitch.testing.reference import train_static

# 64 distinct lengths, shuffled: 2080 tokens.
DISTINCT_64 = [int(n) for n in torch.randperm(64, generator=torch.Generator().manual_seed(3)) + 1]
# Two query heads over one K/V head (grouped-query), head dim 16.
SMALL_HEADS = dict(num_layers=2, hidden_size=32, num_attention_heads=2, num_query_groups=1, ffn_hidden_size=64)


def _device():
    nccl = torch.distributed.get_backend() == "nccl"
    return torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")


def count_kernel_calls(rank, world, kernel, max_scores, lengths, compute_dtype=None):
    """Forward and backward of a 2-layer model on one pack of ``lengths`` under ``dp1`` on
    the backend's device, with every kernel function of ``hotswitch.model.attention``
    wrapped to count its calls. ``kernel``: forced, or None for the default choice;
    ``max_scores``: the mask kernels' bound on this device (None: as shipped).

    Returns ``(chosen kernel, kernel the pack ran, {function: calls}, num_layers, loss)``."""
    device = _device()
    if max_scores is not None:
        attention.MASKED_MAX_SCORES[device.type] = max_scores
    cfg = mw.config(**SMALL_HEADS, compute_dtype=compute_dtype)
    layout = hs.Layout.parse("dp1")
    model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=1, attention=kernel)
    calls = collections.Counter()
    originals = {name: getattr(attention, name) for name in attention.KERNEL_FUNCTIONS.values()}

    def counting(name, fn):
        def wrapped(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)
        return wrapped

    mb = mw.batches(step_lengths=[[lengths]])[0][0]
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
