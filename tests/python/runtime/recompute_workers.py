"""Rank functions of the runtime's recomputation tests (module-level so that spawned ranks can
import them)."""

import torch

import hotswitch as hs
from hotswitch.testing.scenarios import LR, MAX_CONTEXT, TINY, batch, hardware


def budget_needing_recompute(candidates, world):
    """Per-rank bytes under which no candidate holds a ``MAX_CONTEXT`` sequence without
    recomputation and some does with full recomputation."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    cost = hs.CostModel(cfg.cost_config(), hardware(1 << 40), hs.Topology(world, world))

    def peak(name, mode):
        layout = hs.Layout.parse(name)
        return cost.phase(layout, [[[MAX_CONTEXT]] * layout.pp] * layout.dp, recompute=mode).peak_bytes

    plain = min(peak(c, "none") for c in candidates)
    full = min(peak(c, "full") for c in candidates)
    assert full < plain, (full, plain)
    return (full + plain) // 2


def train(rank, world, candidates, recompute, budget, steps):
    """Trains the steps; returns per step (loss, the (layout, recompute) of each phase as run,
    and as planned beforehand) and the full weights (rank 0 only)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(budget), max_context=MAX_CONTEXT, seed=7,
                    recalibrate=False, recompute=recompute, topology=hs.Topology(world, world),
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    out = []
    for i, lengths in enumerate(steps):
        planned = [(ph.layout.name, ph.recompute) for ph in rt.planner.plan(lengths).phases]
        r = rt.train_step(batch(lengths, i))
        out.append((r.loss, [(p.layout, p.recompute) for p in r.phases], planned))
    weights = rt.full_weights()
    return out, {k: v.detach().cpu().numpy().copy() for k, v in weights.items()} if rank == 0 else None
