"""Rank functions of the runtime tests (module-level so that spawned ranks can import them)."""

import torch

import hotswitch as hs
from hotswitch.testing.scenarios import BUDGET, LR, MAX_CONTEXT, STEPS, TINY, batch, hardware


def _numpy(shards):
    return {k: v.detach().cpu().numpy().copy() for k, v in shards.items()}


def train(rank, world, candidates, zero=False, grad_method="auto", tied=True, steps=STEPS, recalibrate=False):
    """Trains the steps; returns (per step: loss, layouts, grad methods), the full weights
    (rank 0 only) and the home layout."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=tied)
    # World 1 holds the whole model on one rank: no budget there.
    budget = BUDGET if world > 1 else 1 << 40
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(budget), max_context=MAX_CONTEXT, zero=zero,
                    grad_method=grad_method, seed=7, recalibrate=recalibrate,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    out = []
    for i, lengths in enumerate(steps):
        r = rt.train_step(batch(lengths, i))
        out.append((r.loss, r.layouts, [p.grad_method for p in r.phases], r.targets))
    if recalibrate:  # every rank plans with the same re-calibrated model
        out.append(sorted(rt.hardware.to_dict().items()))
    weights = rt.full_weights()
    # Every copy of a weight (data replicas, a tied embedding on two stages) holds the same bits.
    mine = rt._master_shards()
    expected = hs.shard_tensors(weights, rt.tensor_set, rt.home, rank, kind="zero" if zero else "sharded")
    copies_equal = (torch.equal(mine, expected) if zero else
                    all(torch.equal(mine[n], expected[n]) for n in mine))
    return out, _numpy(weights) if rank == 0 else None, rt.home.name, copies_equal


def refusals(rank, world, candidates):
    """Bad steps raise ValueError on every rank and leave the master weights untouched."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(1 << 40), max_context=MAX_CONTEXT, seed=7)
    before = {k: v.clone() for k, v in rt._master_shards().items()}
    messages = []
    bad = [
        [],                                     # empty batch
        [[1, 2, 3], []],                        # an empty sequence
        [[1, 2, 500]],                          # token outside the vocabulary
        [[1] * (MAX_CONTEXT + 1)],              # longer than the max context
        [[1.5, 2.0]],                           # not token ids
        [[3]],                                  # no target tokens
        batch([5, 7], seed=rank),               # ranks disagree on the batch
        [[1, 2]] if rank == 1 else [[1, 2, 3]],  # one rank's batch differs in length
        [[1, 2**70]],                           # an id beyond int64
        [[1, 2], None],                         # not a sequence
        [{"a": 1}],                             # a mapping
        [[1 + 2j, 3]],                          # complex numbers
        [[1, 2, 3]] if rank == 0 else [None],   # one rank's batch is malformed
    ]
    for b in bad:
        try:
            rt.train_step(b)
        except ValueError as e:
            messages.append(str(e))
        else:
            messages.append(None)
    after = rt._master_shards()
    unchanged = all(torch.equal(before[k], after[k]) for k in before)
    # The runtime still trains after the refusals.
    loss = rt.train_step(batch([5, 9, 250], 0)).loss
    return messages, unchanged, loss


def too_long_for_memory(rank, world):
    """A max context no layout holds within the budget is refused at construction."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    try:
        hs.Runtime(cfg, candidates=["dp4", "dp2tp2"], hardware=hardware(), max_context=MAX_CONTEXT)
    except ValueError as e:
        return str(e)
    return None


def train_and_record_plans(rank, world, candidates, steps):
    """Trains ``steps`` (lists of lengths) with a fixed cost model; returns per step the plan
    as this rank saw it (layouts, per phase its sequences, tokens, micro-batches, gradient
    method and predicted seconds) and the loss, and the full weights (rank 0 only)."""
    cfg = hs.TransformerConfig(**TINY, tied_embedding=True)
    rt = hs.Runtime(cfg, candidates=candidates, hardware=hardware(), max_context=MAX_CONTEXT, seed=7,
                    recalibrate=False,
                    optimizer=lambda p: torch.optim.AdamW(p, lr=LR, eps=1e-6, weight_decay=0.1))
    plans = []
    for i, lengths in enumerate(steps):
        r = rt.train_step(batch(lengths, i))
        phases = [(p.layout, p.sequences, p.tokens, p.micro_batches, p.grad_method, p.predicted_s) for p in r.phases]
        plans.append((r.layouts, phases, r.predicted_s, r.loss))
    weights = rt.full_weights()
    return plans, _numpy(weights) if rank == 0 else None
