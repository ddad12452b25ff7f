"""Rank function of the determinism test (module-level so that spawned ranks can import it)."""

import torch

import hotswitch as hs
import runtime_workers as w


def train(rank, world, candidates, steps):
    """Trains ``steps`` (lists of lengths) with a fixed cost model; returns per step the plan
    as this rank saw it (layouts, per phase its sequences, tokens, micro-batches, gradient
    method and predicted seconds) and the loss, and the full weights (rank 0 only)."""
    cfg = hs.TransformerConfig(**w.TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=w.hardware(), max_context=w.MAX_CONTEXT, seed=7,
                    recalibrate=False,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=w.LR, eps=1e-6, weight_decay=0.1))
    plans = []
    for i, lengths in enumerate(steps):
        r = rt.train_step(w.batch(lengths, i))
        phases = [(p.layout, p.sequences, p.tokens, p.micro_batches, p.grad_method, p.predicted_s) for p in r.phases]
        plans.append((r.layouts, phases, r.predicted_s, r.loss))
    weights = rt.full_weights()
    return plans, {k: v.detach().cpu().numpy().copy() for k, v in weights.items()} if rank == 0 else None
