"""Rank functions of the context-parallel tests (module-level so that spawned ranks can import them)."""

import torch

import hotswitch as hs
from hotswitch.model.batch import count_targets, split_replicas
from hotswitch.testing.reference import train_static

from tests.python.model.workers import EPS, LR, _numpy, batches, config

# Packs mixing sequences long enough to be cut into 2 * cp chunks (>= 2 * cp * CP_MIN_CHUNK
# tokens, with lengths not divisible by 2 * cp) and short ones that stay whole: length 1,
# primes, a pack of only short sequences (under cp4 some ranks hold none of its tokens) and a
# pack of one long sequence.
CP_STEP_LENGTHS = [
    [[1, 7, 45, 13], [97, 3], [2, 33, 64, 5], [11]],
    [[127], [1, 1, 2], [19, 23, 40]],
]


def cp_batches():
    return batches(4321, CP_STEP_LENGTHS, 128)


def _first_step_grads(cfg, layout, groups):
    """Gradients of the first batch's mean loss, summed over the data group; and its loss."""
    model = hs.ParallelTransformer(cfg, layout, groups, seed=0)
    batch = cp_batches()[0]
    mine = split_replicas(batch, layout.dp)[groups.dp_rank]
    targets = count_targets(batch)
    loss, _ = model.forward_backward(mine, 1.0 / targets)
    total = torch.tensor([loss], dtype=torch.float64)
    if groups.dp_group is not None:
        torch.distributed.all_reduce(total, group=groups.dp_group)
    grads = model.reduce_gradients()
    return float(total) / targets, {k: v.detach().clone() for k, v in grads.items()}


def reference(rank, world, tieds):
    """World 1: losses, full weights after training and first-step gradients, per tied setting."""
    torch.set_num_threads(1)
    out = {}
    for tied in tieds:
        cfg = config(tied)
        layout = hs.Layout()
        groups = hs.ParallelGroups(layout)
        losses, model = train_static(cfg, layout, cp_batches(), lr=LR, eps=EPS, groups=groups)
        loss0, grads = _first_step_grads(cfg, layout, groups)
        out[tied] = (losses, _numpy(model.named_shards()), loss0, _numpy(grads))
    return out


def _diff(shards, expected):
    assert shards.keys() == expected.keys(), (sorted(shards), sorted(expected))
    return max(float((shards[k].detach() - expected[k]).abs().max()) for k in shards)


def parity(rank, world, runs, refs):
    """For each (layout, tied, zero) run: the training losses, the largest difference of this
    rank's weights after training, of its first-step gradients and first-step loss against
    world 1, and (under ZeRO) of its zero chunk against the engine's "zero" placement."""
    torch.set_num_threads(1)
    out = {}
    for name, tied, zero in runs:
        layout = hs.Layout.parse(name)
        cfg = config(tied)
        groups = hs.ParallelGroups(layout)
        _, weights, ref_loss0, ref_grads = refs[tied]
        full = {k: torch.from_numpy(v) for k, v in weights.items()}
        losses, model = train_static(cfg, layout, cp_batches(), lr=LR, eps=EPS, zero=zero, groups=groups)
        weight_diff = _diff(model.named_shards(), hs.shard_tensors(full, cfg.tensor_set(), layout, rank))
        zero_diff = 0.0
        if zero:
            expected = hs.shard_tensors(full, cfg.tensor_set(), layout, rank, kind="zero")
            zero_diff = float((model.zero_chunk() - expected).abs().max())
        loss0, grads = _first_step_grads(cfg, layout, groups)
        grad_expected = hs.shard_tensors({k: torch.from_numpy(v) for k, v in ref_grads.items()},
                                         cfg.tensor_set(), layout, rank)
        out[(name, tied, zero)] = (losses, weight_diff, _diff(grads, grad_expected), abs(loss0 - ref_loss0),
                                   zero_diff)
    return out
