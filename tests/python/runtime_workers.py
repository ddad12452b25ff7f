"""Rank functions of the runtime tests (module-level so that spawned ranks can import them)."""

import random

import torch

import hotswitch as hs
from hotswitch import _C

TINY = dict(num_layers=4, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=64,
            vocab_size=128, max_position_embeddings=256)
MAX_CONTEXT = 256
# Per-rank memory under which dp4 holds micro-batches of ~60 tokens, dp2tp2 ~215, and only
# layouts splitting the model over 4 ranks the longest sequences (see test_runtime).
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

def hardware(budget=BUDGET):
    """A slow device with slow links, like CPU ranks over gloo: tensor parallelism costs, so
    short sequences run best data-parallel and the planner splits steps (1, 2 and 3 phases
    for the steps above)."""
    return _C.HardwareProfile(peak_flops=2e9, efficiency=1.0, memory_bytes=budget, intra_node_bandwidth=3e8,
                              inter_node_bandwidth=3e8, intra_node_latency=3e-4, inter_node_latency=3e-4,
                              layer_overhead_seconds=1e-4)


def batch(lengths, seed):
    rng = random.Random(seed)
    return [[rng.randrange(TINY["vocab_size"]) for _ in range(n)] for n in lengths]


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
