"""Rank functions of the fault scenarios (tests and benchmarks.faults share them)."""

import os
import time

import torch

import hotswitch as hs
import runtime_workers as rw
from hotswitch.testing import faults

CANDIDATES = ["dp4", "dp2tp2", "pp4", "tp2pp2"]
# The runtime tests' steps of 2, 3+ and 3+ phases: the faulted step switches layouts.
STEPS = rw.STEPS[1:]
VICTIM = 1


def _runtime(timeout):
    cfg = hs.TransformerConfig(**rw.TINY, tied_embedding=True)
    return hs.Runtime(cfg, candidates=CANDIDATES, hardware=rw.hardware(), max_context=rw.MAX_CONTEXT, seed=7, recalibrate=False,
                      timeout=timeout, optimizer=lambda p: torch.optim.AdamW(p, lr=rw.LR, eps=1e-6))


def _snapshot(rt):
    return {k: v.detach().clone() for k, v in rt.master.items()}


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


def scenario(rank, world, root, stage, action, timeout):
    """Step 1, checkpoint, then step 2 (and a save for stage "save") with a fault on the
    victim. Survivors report what they raised, how long it took, and whether their state is
    the last complete one."""
    rt = _runtime(timeout)
    rt.train_step(rw.batch(STEPS[0], 0))
    first = rt.save_checkpoint(root, data_state={"next": 1})
    if stage == "save":
        rt.train_step(rw.batch(STEPS[1], 1))
    before = _snapshot(rt)
    step_before = rt.step
    if rank == VICTIM:
        # A phase fault fires on the second micro-batch forward, in the middle of the phase.
        nth = 2 if stage in ("phase", "save") else 1
        faults.inject(rt, faults.Fault(stage, action, nth=nth, stall_s=3 * timeout))
    start = time.monotonic()
    try:
        if stage == "save":
            rt.save_checkpoint(root, data_state={"next": 2})
        else:
            rt.train_step(rw.batch(STEPS[1], 1))
    except Exception as e:  # what the survivors raise is the result
        elapsed = time.monotonic() - start
        if rank == VICTIM:  # a stalled victim wakes up to dead peers
            os._exit(faults.KILL_EXIT_CODE)
        latest = hs.checkpoint.latest_checkpoint(root)
        return {"type": type(e).__name__, "message": str(e), "elapsed": elapsed,
                "state_kept": _same(before, rt.master) and rt.step == step_before,
                "latest": latest, "first": first}
    if rank == VICTIM:
        os._exit(faults.KILL_EXIT_CODE)
    return {"type": None, "message": "", "elapsed": time.monotonic() - start, "state_kept": False,
            "latest": None, "first": first}


def resume(rank, world, root):
    """A restarted job: load the last checkpoint, train the next step; returns the weights."""
    rt = _runtime(60.0)
    info = rt.load_checkpoint(root)
    for i in range(info["data_state"]["next"], len(STEPS) - 1):
        rt.train_step(rw.batch(STEPS[i], i))
    weights = rt.full_weights()  # collective: every rank takes part
    return {k: v.numpy().copy() for k, v in weights.items()} if rank == 0 else None, rt.step


def uninterrupted(rank, world):
    rt = _runtime(60.0)
    for i in range(len(STEPS) - 1):
        rt.train_step(rw.batch(STEPS[i], i))
    weights = rt.full_weights()  # collective: every rank takes part
    return {k: v.numpy().copy() for k, v in weights.items()} if rank == 0 else None, rt.step
