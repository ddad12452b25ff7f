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

    /usr/bin/python3 -m benchmarks.cp_attention [--quick]
"""

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist

import hotswitch as hs
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
    out = {"mechanism": "all-gather of K/V over the cp group, 2*cp load-balanced chunks per sequence",
           "pack_tokens": tokens, "cp": 2, "cp_attention_tokens_per_s": cp2, "cp1_tokens_per_s": cp1,
           "speedup_vs_cp1": cp2 / cp1, "tokens_per_rank": held, "causal_pairs_per_rank": work,
           "loss_rel_diff_max": loss_diff, "repeats": repeats, "seconds": time.perf_counter() - start}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main()
