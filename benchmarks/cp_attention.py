"""Context parallelism on a 4K-token pack: 2 CPU ranks (cp2) against one (cp1).

A small LLaMA-style model (fp32, grouped-query attention: 8 query heads over 2 K/V heads)
runs forward and backward of one pack of 4096 tokens — long-tailed sequences of 2048, 1024,
..., 16 tokens — under cp1 (world 1) and cp2 (2 gloo ranks, one thread each). The mechanism:
every sequence of at least 2 * cp * CP_MIN_CHUNK tokens is cut into 2 * cp chunks, rank i
holding chunks i and 2 * cp - 1 - i (causal work balanced); shorter ones stay whole, dealt
to the rank with fewer tokens; each layer all-gathers the keys and values over the cp group
(backward: reduce-scatter of their gradients) and runs its own queries against their
sequence's whole causal past.

Reported: ``cp_attention_tokens_per_s`` (tokens of the pack per second of cp2 forward and
backward, the slowest rank's time, median over repeats after one warm-up), the same for
cp1, their ratio, the tokens and causal attention work (query-key pairs) each cp rank holds,
and the largest relative difference of the cp2 loss from cp1's.

The two mechanisms, attention core alone (the same 4K pack and split, q/k/v of 8 query heads
over 2 K/V heads of dimension 16, forward and backward on 2 ranks): the all-gather the model
uses (``ContextAttention``: one collective of K/V, then, with the ``grouped`` kernel the
model runs on the CPU for a pack this size, one masked call per chunk shape against each
sequence's causal past) against a ring (``ring_attention`` below, as Megatron-LM's
and ring-attention implementations run it: cp steps, each passing the K/V block one rank on
while computing the local queries against the block held, masked by sequence and position,
merged by log-sum-exp; backward passes the K/V gradients back along the ring). Reported:
``allgather_attention_tokens_per_s``, ``ring_attention_tokens_per_s`` and the largest
difference of the ring's output and gradients from the all-gather's.

    .venv/bin/python -m benchmarks.cp_attention [--quick]
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import hotswitch as hs
from benchmarks import rounded
from hotswitch.model.context import split_sequences
from hotswitch.testing.harness import run_world

LENGTHS = [2048, 1024, 512, 256, 128, 64, 32, 16, 16]  # 4096 tokens
MODEL = dict(num_layers=2, hidden_size=128, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=256,
             vocab_size=512, max_position_embeddings=4096)


def _pack():
    gen = torch.Generator().manual_seed(11)
    return hs.MicroBatch.from_sequences([torch.randint(0, MODEL["vocab_size"], (n,), generator=gen)
                                         for n in LENGTHS])


def _rank(rank, world, repeats):
    torch.set_num_threads(1)
    cfg = hs.TransformerConfig(**MODEL)
    layout = hs.Layout(dp=1, tp=1, pp=1, cp=world)
    groups = hs.ParallelGroups(layout)
    model = hs.ParallelTransformer(cfg, layout, groups, seed=0)
    pack = _pack()
    seconds, losses = [], []
    for i in range(repeats + 1):
        model.zero_grad()
        dist.barrier()
        start = time.perf_counter()
        loss, targets = model.forward_backward([pack], 1.0 / pack.num_targets)
        took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)
        if i:
            seconds.append(float(took))
        losses.append(loss / targets)
    return seconds, losses


class _RingShift(torch.autograd.Function):
    """x -> the block of the previous rank of the ring (this rank's goes to the next);
    backward: the gradient goes back the other way."""

    @staticmethod
    def forward(ctx, x, prev, nxt):
        ctx.prev, ctx.nxt = prev, nxt
        return _shift(x, nxt, prev)

    @staticmethod
    def backward(ctx, grad):
        return _shift(grad, ctx.prev, ctx.nxt), None, None


def _shift(x, to, source):
    x = x.contiguous()
    out = torch.empty_like(x)
    requests = [dist.isend(x, to), dist.irecv(out, source)]
    for r in requests:
        r.wait()
    return out


def ring_attention(q, k, v, seq, pos, rank, cp):
    """Causal attention of this rank's rows (``q`` ``[rows, hq, d]``, ``k``/``v``
    ``[rows, hkv, d]``) against every rank's rows passed around the ring; ``seq``/``pos``:
    sequence and position of each of the ``cp * rows`` rows (rank r's at ``r * rows``; -1 for
    padding). Query heads sharing a K/V head fold into rows (K/V never repeated); every block is
    computed (a fully masked one too: each rank must pass every block on)."""
    rows, hq, d = q.shape
    hkv = k.shape[1]
    rep = hq // hkv
    qg = q.reshape(rows, hkv, rep, d).permute(1, 2, 0, 3).reshape(hkv, rep * rows, d)
    mine = slice(rank * rows, (rank + 1) * rows)
    my_seq, my_pos = seq[mine], pos[mine]
    kv = torch.cat([k, v], dim=1)
    out = torch.zeros(hkv, rep * rows, d, dtype=q.dtype)
    lse = torch.full((hkv, rep * rows), -1e30, dtype=q.dtype)
    for step in range(cp):
        if step:
            kv = _RingShift.apply(kv, (rank - 1) % cp, (rank + 1) % cp)
        source = (rank - step) % cp
        theirs = slice(source * rows, (source + 1) * rows)
        allowed = (my_seq[:, None] == seq[theirs][None, :]) & (pos[theirs][None, :] <= my_pos[:, None]) & \
            (my_seq[:, None] >= 0)
        kb, vb = kv[:, :hkv].permute(1, 0, 2), kv[:, hkv:].permute(1, 0, 2)  # [hkv, rows, d]
        scores = torch.matmul(qg, kb.transpose(-1, -2)) * (1.0 / d ** 0.5)  # [hkv, rep * rows, rows]
        scores = scores.view(hkv, rep, rows, rows).masked_fill(~allowed, float("-inf")).view(hkv, rep * rows, rows)
        block = torch.logsumexp(scores, dim=-1)
        block = torch.where(torch.isinf(block), torch.full_like(block, -1e30), block)
        part = torch.matmul(torch.exp(scores - block[..., None]), vb)
        merged = torch.logaddexp(lse, block)
        out = out * torch.exp(lse - merged)[..., None] + part * torch.exp(block - merged)[..., None]
        lse = merged
    return out.view(hkv, rep, rows, d).permute(2, 0, 1, 3).reshape(rows, hq, d)


def _mechanisms_rank(rank, world, repeats):
    """Forward and backward of the attention core under both mechanisms on this rank's part of
    the pack: (all-gather seconds, ring seconds, max |ring - all-gather| of output and grads)."""
    torch.set_num_threads(1)
    from hotswitch.model.comm import gather_from_sequence
    from hotswitch.model.context import ContextAttention, ContextSplit
    hq, hkv, d = 8, 2, 16
    pack = _pack()
    split = ContextSplit(pack.cu_seqlens, world, rank)
    gen = torch.Generator().manual_seed(5)
    total = sum(LENGTHS)
    q_all, k_all, v_all = (torch.randn(total, h, d, generator=gen) for h in (hq, hkv, hkv))
    weight = torch.randn(total, hq, d, generator=gen)
    # Every rank's rows: sequence id and position (padding -1), rank r's at r * rows.
    cu = pack.cu_seqlens.tolist()
    seq_of = torch.repeat_interleave(torch.arange(len(LENGTHS)), torch.tensor(LENGTHS))
    pos_of = torch.arange(total) - torch.tensor(cu[:-1])[seq_of]
    seq, pos = [], []
    for r in range(world):
        index = ContextSplit(pack.cu_seqlens, world, r).index
        real = index >= 0
        seq.append(torch.where(real, seq_of[index.clamp(min=0)], torch.full_like(index, -1)))
        pos.append(torch.where(real, pos_of[index.clamp(min=0)], torch.zeros_like(index)))
    seq, pos = torch.cat(seq), torch.cat(pos)
    local = split.index.clamp(min=0)
    real = (split.index >= 0).to(q_all.dtype)[:, None, None]

    def inputs():
        return [(t[local] * real).requires_grad_() for t in (q_all, k_all, v_all)]

    gathered = ContextAttention(split, lambda x: gather_from_sequence(x, dist.group.WORLD, world, rank), "grouped",
                                hq, torch.device("cpu"))
    runs = {"allgather": lambda q, k, v: gathered(q, k, v),
            "ring": lambda q, k, v: ring_attention(q, k, v, seq, pos, rank, world)}
    seconds, results = {}, {}
    for name, attend in runs.items():
        seconds[name] = []
        for i in range(repeats + 1):
            q, k, v = inputs()
            dist.barrier()
            start = time.perf_counter()
            out = attend(q, k, v)
            (out * weight[local] * real).sum().backward()
            took = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
            dist.all_reduce(took, op=dist.ReduceOp.MAX)
            if i:
                seconds[name].append(float(took))
        results[name] = [out.detach() * real, q.grad, k.grad, v.grad]
    diff = max(float((a - b).abs().max()) for a, b in zip(results["ring"], results["allgather"]))
    return seconds["allgather"], seconds["ring"], diff


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 timed repeats (under two minutes)")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 5, 2 with --quick)")
    args = parser.parse_args(argv)
    repeats = args.repeats or (2 if args.quick else 5)
    if repeats < 1:
        raise SystemExit(f"--repeats must be >= 1, got {repeats}")
    start = time.perf_counter()
    tokens = sum(LENGTHS)
    pieces = split_sequences(LENGTHS, 2)
    held = [sum(e - b for _, b, e in p) for p in pieces]
    work = [sum((b + 1 + e) * (e - b) // 2 for _, b, e in p) for p in pieces]  # sum of (position + 1)
    print(f"pack: {tokens} tokens in sequences {LENGTHS}; model {MODEL}")
    print(f"cp2 split: tokens per rank {held}, causal query-key pairs per rank {work}")
    one_s, one_losses = run_world(1, _rank, repeats, timeout=1200)[0]
    two = run_world(2, _rank, repeats, timeout=1200)
    two_s, two_losses = two[0]
    cp1 = tokens / statistics.median(one_s)
    cp2 = tokens / statistics.median(two_s)
    loss_diff = max(abs(a - b) / abs(b) for a, b in zip(two_losses, one_losses))
    print(f"cp1: {cp1:.0f} tokens/s (forward+backward, median of {repeats}: {statistics.median(one_s):.3f} s)")
    print(f"cp2: {cp2:.0f} tokens/s (slowest rank, median of {repeats}: {statistics.median(two_s):.3f} s); "
          f"speedup {cp2 / cp1:.2f}x; loss rel diff {loss_diff:.1e}")
    # The ring's dense blocks take ~20 s a run here: one timed run under --quick.
    mechanisms = run_world(2, _mechanisms_rank, 1 if args.quick else repeats, timeout=1200)
    gather_s, ring_s, _ = mechanisms[0]
    ring_diff = max(m[2] for m in mechanisms)
    gather_tps, ring_tps = tokens / statistics.median(gather_s), tokens / statistics.median(ring_s)
    print(f"attention core on cp2, forward+backward: all-gather {gather_tps:.0f} tokens/s, ring {ring_tps:.0f} "
          f"tokens/s ({gather_tps / ring_tps:.2f}x); max |ring - all-gather| of output and gradients {ring_diff:.1e}")
    out = {"mechanism": "all-gather of K/V over the cp group, 2*cp load-balanced chunks per sequence",
           "pack_tokens": tokens, "cp": 2, "cp_attention_tokens_per_s": cp2, "cp1_tokens_per_s": cp1,
           "speedup_vs_cp1": cp2 / cp1, "tokens_per_rank": held, "causal_pairs_per_rank": work,
           "loss_rel_diff_max": loss_diff, "allgather_attention_tokens_per_s": gather_tps,
           "ring_attention_tokens_per_s": ring_tps, "allgather_over_ring": gather_tps / ring_tps,
           "ring_vs_allgather_max_abs_diff": ring_diff, "repeats": repeats, "seconds": time.perf_counter() - start}
    print("RESULT " + json.dumps(rounded(out)))


if __name__ == "__main__":
    main()
