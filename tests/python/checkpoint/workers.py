"""Rank functions of the checkpoint tests (module-level so that spawned ranks can import them)."""

import dataclasses
import os

import torch

import hotswitch as hs
from hotswitch.testing.scenarios import BUDGET, LR, MAX_CONTEXT, TINY, batch, hardware

STEPS = [[5, 9, 3, 7, 241], [1, 2, 3, 7, 13, 17, 31, 97, 131], [40, 23, 150, 29, 60, 2], [11, 200, 7, 19]]


def _runtime(world, home, zero=False, hidden=None):
    tiny = dict(TINY)
    if hidden:
        tiny["hidden_size"] = hidden
    cfg = hs.TransformerConfig(**tiny, tied_embedding=True)
    candidates = ["dp4", "dp2tp2", "pp4", "tp2pp2"] if world == 4 else "auto"
    budget = BUDGET if world == 4 else 1 << 40
    return hs.Runtime(cfg, candidates=candidates, home=home, hardware=hardware(budget),
                      max_context=MAX_CONTEXT, zero=zero, seed=7, recalibrate=False,
                      optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))


def _numpy(w):
    return {k: v.numpy().copy() for k, v in w.items()}


def _runtime_for(world, home, zero, static):
    """``_runtime``, or with ``static`` a runtime under the one layout ``home``."""
    torch.set_num_threads(1)
    return _static_runtime(home, zero) if static else _runtime(world, home, zero)


def save_then_continue(rank, world, root, home, zero, static=False):
    """Trains two steps, saves, trains two more: the uninterrupted run."""
    rt = _runtime_for(world, home, zero, static)
    for i in range(2):
        rt.train_step(batch(STEPS[i], i))
    rt.save_checkpoint(root, data_state={"position": 2})
    saved = _numpy(rt.full_weights())
    losses = [rt.train_step(batch(STEPS[i], i)).loss for i in (2, 3)]
    return saved, losses, _numpy(rt.full_weights())


def resume(rank, world, root, home, zero, static=False):
    """Loads the checkpoint into a fresh runtime and trains the two last steps."""
    rt = _runtime_for(world, home, zero, static)
    info = rt.load_checkpoint(root)
    loaded = _numpy(rt.full_weights())
    losses = [rt.train_step(batch(STEPS[i], i)).loss for i in (2, 3)]
    return info, loaded, losses, _numpy(rt.full_weights())


def refuse(rank, world, path, hidden):
    """Loading a bad checkpoint raises on every rank and changes nothing."""
    rt = _runtime(world, None, hidden=hidden)
    before = _numpy(rt.full_weights())
    try:
        rt.load_checkpoint(path)
    except hs.CheckpointError as e:
        message = str(e)
    else:
        message = None
    after = _numpy(rt.full_weights())
    unchanged = all((before[k] == after[k]).all() for k in before)
    return message, unchanged, rt.step


def failed_save(rank, world, root, ckpt_format="hotswitch"):
    """A save that fails (metadata that cannot be written) leaves the previous checkpoint."""
    rt = _runtime(world, None)
    rt.train_step(batch(STEPS[0], 0))
    first = rt.save_checkpoint(root, ckpt_format=ckpt_format)
    rt.train_step(batch(STEPS[1], 1))
    try:
        rt.save_checkpoint(root, data_state={"bad": object()}, ckpt_format=ckpt_format)
    except hs.CheckpointError as e:
        message = str(e)
    else:
        message = None
    return first, message, hs.checkpoint.latest_checkpoint(root), sorted(os.listdir(root))


def _static_runtime(layout, zero=False):
    """A static runtime under ``layout`` (the planner only packs)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    return hs.Runtime(cfg, candidates=[layout], home=layout, hardware=hardware(1 << 40), max_context=MAX_CONTEXT,
                      zero=zero, seed=7, recalibrate=False,
                      optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))


def load_parts(rank, world, root):
    """Loads the checkpoint of ``save_then_continue`` three ways (everything; weights only;
    Megatron's finetune) into fresh runtimes; per way: (step, data state, optimizer state
    tensors, the full weights, and after one more step the full weights)."""
    out = {}
    for name, kwargs in (("all", {}), ("no_optim", {"optimizer": False}),
                         ("finetune", {"optimizer": False, "rng": False, "reset_step": True})):
        rt = _runtime(world, None)
        info = rt.load_checkpoint(root, **kwargs)
        loaded = _numpy(rt.full_weights())
        moments = sum(len(s) for s in rt.optimizer.state.values())
        rt.train_step(batch(STEPS[2], 2))
        out[name] = (info["step"], info["data_state"], rt.step, moments, loaded, _numpy(rt.full_weights()))
    return out


def save_dcp_then_continue(rank, world, root, home, zero):
    """``save_then_continue`` with the checkpoint written in DCP format."""
    rt = _runtime(world, home, zero)
    for i in range(2):
        rt.train_step(batch(STEPS[i], i))
    path = rt.save_checkpoint(root, data_state={"position": 2}, ckpt_format="torch_dist",
                              extra={"model": dataclasses.asdict(rt.config)})
    saved = _numpy(rt.full_weights())
    losses = [rt.train_step(batch(STEPS[i], i)).loss for i in (2, 3)]
    return saved, losses, _numpy(rt.full_weights()), path


def resume_any(rank, world, root, home, zero):
    """``resume`` for any world (4 uses the test candidates, others 'auto')."""
    torch.set_num_threads(1)
    rt = _runtime(world, home, zero)
    info = rt.load_checkpoint(root)
    loaded = _numpy(rt.full_weights())
    losses = [rt.train_step(batch(STEPS[i], i)).loss for i in (2, 3)]
    return info, loaded, losses, _numpy(rt.full_weights())
