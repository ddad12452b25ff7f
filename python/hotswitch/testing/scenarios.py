"""A small world for multi-process runs on CPU ranks, and the fault scenarios run on it
(shared by hotswitch's runtime and fault tests and ``benchmarks.faults``).

The world: a 4-layer model of hidden size 32 (``TINY``), a slow device with slow links
(``hardware``) under which the planner splits steps into one, two and three or more phases
(``STEPS``), and deterministic batches of random tokens (``batch``).

The fault scenarios (rank functions for ``hotswitch.testing.harness.run_world``): step 1,
a checkpoint, then step 2 (or a second save) with a fault on rank ``VICTIM``; ``resume``
restarts from the last checkpoint; ``uninterrupted`` is the run that never failed.
"""

import os
import random
import time

import torch

from hotswitch._C import HardwareProfile
from hotswitch.checkpoint import latest_checkpoint
from hotswitch.model.config import TransformerConfig
from hotswitch.runtime import Runtime
import hotswitch.testing.faults as faults

__all__ = ["BUDGET", "CANDIDATES", "FAULT_STEPS", "LR", "MAX_CONTEXT", "STEPS", "TINY", "VICTIM", "batch",
           "fault_runtime", "hardware", "resume", "same_weights", "scenario", "snapshot", "uninterrupted"]

TINY = dict(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
            vocab_size=128, max_position_embeddings=256)
MAX_CONTEXT = 256
# Per-rank memory (bytes) under which dp4 holds micro-batches of ~60 tokens, dp2tp2 ~215, and
# only layouts splitting the model over 4 ranks the longest sequences.
BUDGET = 1_500_000
LR = 1e-3

# Step lengths: a step of one sequence (one phase), short + long (two phases), and spreads
# over every length class (three or more phases), with a length-1 sequence and primes.
STEPS = [
    [250],
    [3, 9, 17, 23, 29, 31, 37, 41, 43, 47, 250],
    [1, 2, 3, 7, 13, 17, 31, 97, 131, 199, 251, 11, 5, 40, 23, 37],
    [40, 40, 23, 150, 190, 256, 29, 60, 2, 15, 18, 33],
]


def hardware(budget: int = BUDGET) -> HardwareProfile:
    """A slow device with slow links, like CPU ranks over gloo, with ``budget`` bytes per
    rank: tensor parallelism costs, so short sequences run best data-parallel and the planner
    splits steps (1, 2 and 3 phases for ``STEPS``)."""
    return HardwareProfile(peak_flops=2e9, efficiency=1.0, memory_bytes=budget, intra_node_bandwidth=3e8,
                           inter_node_bandwidth=3e8, intra_node_latency=3e-4, inter_node_latency=3e-4,
                           layer_overhead_seconds=1e-4)


def batch(lengths, seed):
    """Sequences of random token ids of ``TINY``'s vocabulary with the given lengths; the same
    for the same seed on every rank."""
    rng = random.Random(seed)
    return [[rng.randrange(TINY["vocab_size"]) for _ in range(n)] for n in lengths]


CANDIDATES = ["dp4", "dp2tp2", "pp4", "tp2pp2"]
# Steps of 2, 3+ and 3+ phases: the faulted step switches layouts.
FAULT_STEPS = STEPS[1:]
VICTIM = 1


def fault_runtime(timeout):
    """The scenarios' runtime on a world of 4: fixed cost model, ``timeout`` seconds."""
    cfg = TransformerConfig(**TINY, tied_embedding=True)
    return Runtime(cfg, candidates=CANDIDATES, hardware=hardware(), max_context=MAX_CONTEXT, seed=7,
                   recalibrate=False, timeout=timeout,
                   optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6))


def snapshot(rt):
    """Copies of this rank's master tensors."""
    return {k: v.detach().clone() for k, v in rt.master.items()}


def same_weights(a, b):
    """Whether two name -> tensor dicts hold the same bits."""
    return all(torch.equal(a[k], b[k]) for k in a)


def scenario(rank, world, root, stage, action, timeout):
    """Step 1, checkpoint, then step 2 (and a save for stage "save") with a fault on the
    victim. Survivors report what they raised, how long it took, and whether their state is
    the last complete one."""
    rt = fault_runtime(timeout)
    rt.train_step(batch(FAULT_STEPS[0], 0))
    first = rt.save_checkpoint(root, data_state={"next": 1})
    if stage == "save":
        rt.train_step(batch(FAULT_STEPS[1], 1))
    before = snapshot(rt)
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
            rt.train_step(batch(FAULT_STEPS[1], 1))
    except Exception as e:  # what the survivors raise is the result
        elapsed = time.monotonic() - start
        if rank == VICTIM:  # a stalled victim wakes up to dead peers
            os._exit(faults.KILL_EXIT_CODE)
        return {"type": type(e).__name__, "message": str(e), "elapsed": elapsed,
                "state_kept": same_weights(before, rt.master) and rt.step == step_before,
                "latest": latest_checkpoint(root), "first": first}
    if rank == VICTIM:
        os._exit(faults.KILL_EXIT_CODE)
    return {"type": None, "message": "", "elapsed": time.monotonic() - start, "state_kept": False,
            "latest": None, "first": first}


def resume(rank, world, root):
    """A restarted job: load the last checkpoint, train the next step; returns the weights
    (rank 0) and the step."""
    rt = fault_runtime(60.0)
    info = rt.load_checkpoint(root)
    for i in range(info["data_state"]["next"], len(FAULT_STEPS) - 1):
        rt.train_step(batch(FAULT_STEPS[i], i))
    weights = rt.full_weights()  # collective: every rank takes part
    return {k: v.numpy().copy() for k, v in weights.items()} if rank == 0 else None, rt.step


def uninterrupted(rank, world):
    """The run that never failed: the weights (rank 0) and the step."""
    rt = fault_runtime(60.0)
    for i in range(len(FAULT_STEPS) - 1):
        rt.train_step(batch(FAULT_STEPS[i], i))
    weights = rt.full_weights()  # collective: every rank takes part
    return {k: v.numpy().copy() for k, v in weights.items()} if rank == 0 else None, rt.step
