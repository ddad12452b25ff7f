"""Rank functions of the CUDA tests (module-level so that spawned ranks can import them)."""

import torch

import hotswitch as hs
import model_workers as mw
from reference import full_tensors, model_set, shards_for


def _on(shards, device):
    if isinstance(shards, dict):
        return {k: v.to(device) for k, v in shards.items()}
    return shards.to(device)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def switch_on_device(rank, world, pairs):
    """Switches shards on the backend's device (CUDA under NCCL) through each (src, src_kind,
    dst, dst_kind): the executor packs, copies and unpacks strided views there. Returns the
    failures."""
    nccl = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    failures = []
    for dtype in ("float32", "bfloat16"):
        ts = model_set(tied=True, dtype=dtype)
        fulls = full_tensors(ts)
        for src, src_kind, dst, dst_kind in pairs:
            a, b = hs.Layout.parse(src), hs.Layout.parse(dst)
            shards = _on(shards_for(ts, fulls, a, rank, src_kind), device)
            result = hs.switch(shards, ts, a, b, src_kind=src_kind, dst_kind=dst_kind, timeout=60)
            out = result.shards
            on_device = all(v.device == device for v in out.values()) if isinstance(out, dict) else out.device == device
            if not on_device:
                failures.append(f"{dtype} {src}:{src_kind} -> {dst}:{dst_kind} left the device")
            if not _same(out, shards_for(ts, fulls, b, rank, dst_kind)):
                failures.append(f"{dtype} {src}:{src_kind} -> {dst}:{dst_kind} differs from the reference")
    return failures


def forward_backward(rank, world):
    """One forward and backward of the tiny model on this backend's device (TF32 off); the
    loss and the gradients on the CPU."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cfg = mw.config(tied=True)
    layout = hs.Layout.parse("dp1")
    model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=5)
    step = mw.batches()[0]
    loss, _ = model.forward_backward(step, 1.0 / hs.count_targets(step))
    model.finish_gradients()
    device = next(iter(model.named_shards().values())).device.type
    return device, float(loss), {k: v.detach().cpu().numpy().copy() for k, v in model.grad_shards().items()}
