"""Rank functions of the recomputation tests (module-level so that spawned ranks can import them)."""

import torch

import hotswitch as hs
from tests.python.model.workers import batches, config


def _saved_bytes(run):
    """Runs ``run()`` and returns what it returned and the bytes autograd saved for backward
    outside any checkpoint (a checkpoint's own saves are its inputs only)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = run()
    return out, total


def gradients(rank, world, name, modes, compute_dtype=None, num_layers=1):
    """Forward and backward of one step's micro-batches under ``name`` with each recompute
    mode, on fresh models and on one model whose mode changes between steps (as the runtime
    does per phase). Returns per mode: the loss's difference and the largest gradient
    difference to ``"none"``, and the bytes saved for backward."""
    layout = hs.Layout.parse(name)
    cfg = config(compute_dtype=compute_dtype)
    groups = hs.ParallelGroups(layout)
    step = batches()[0]
    mine = step[groups.dp_rank::layout.dp]
    shared = hs.ParallelTransformer(cfg, layout, groups, seed=3, recompute_num_layers=num_layers)

    def run(model):
        (loss, _), saved = _saved_bytes(lambda: model.forward_backward(mine, loss_scale=0.01))
        grads = {k: v.detach().clone() for k, v in model.grad_shards().items()}
        model.zero_grad()
        return loss, grads, saved

    out = {}
    for mode in modes:
        fresh = hs.ParallelTransformer(cfg, layout, groups, seed=3, recompute=mode, recompute_num_layers=num_layers)
        shared.recompute = mode
        out[mode] = (run(fresh), run(shared))
    (base_loss, base, _), _ = out["none"]
    result = {}
    for mode, runs in out.items():
        loss_diff = max(abs(loss - base_loss) for loss, _, _ in runs)
        grad_diff = max(float((g[k] - base[k]).abs().max()) for _, g, _ in runs for k in base)
        result[mode] = (loss_diff, grad_diff, runs[0][2])
    return result


def bad_recompute(rank, world):
    """The model's recompute arguments are checked before anything is built."""
    layout = hs.Layout()
    groups = hs.ParallelGroups(layout)
    messages = []
    for kwargs in (dict(recompute="partial"), dict(recompute=True), dict(recompute_num_layers=0),
                   dict(recompute_num_layers=True)):
        try:
            hs.ParallelTransformer(config(), layout, groups, **kwargs)
        except ValueError as e:
            messages.append(str(e))
    model = hs.ParallelTransformer(config(), layout, groups)
    try:
        model.recompute = "block"
    except ValueError as e:
        messages.append(str(e))
    return messages, model.recompute
