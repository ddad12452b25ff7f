"""Parity and throughput of the parallel transformer under static layouts.

A small LLaMA-style model (fp32) trains N steps of AdamW on the same long-tailed packed
batches under each layout of 4 gloo ranks (dp4, tp4, pp4, dp2tp2, dp2pp2, tp2pp2, and with
context parallelism cp4, dp2cp2, tp2cp2, cp2pp2) and, as the reference, the same code at
world 1. Reported: the largest absolute weight difference against the reference after N
steps (every rank's shards against the reference cut by the same placement), the largest relative loss difference over the steps, and each layout's
training throughput (tokens of the global batch per second of step time, the first step
left out when N > 1; every rank runs one thread, 4 ranks share this machine's cores).

AdamW's eps is 1e-6: its step lr * g / (|g| + eps) amplifies the fp32 rounding of a
near-zero gradient by lr / eps, which with eps = 1e-8 alone reaches 1e-5 (see
tests/python/model/test_model.py).

    .venv/bin/python -m benchmarks.parity [--quick]
"""

import argparse
import json
import math
import os
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hotswitch as hs
from hotswitch.testing.reference import StaticTrainer

LAYOUTS = ["dp4", "tp4", "pp4", "dp2tp2", "dp2pp2", "tp2pp2", "cp4", "dp2cp2", "tp2cp2", "cp2pp2"]
MODEL = dict(num_layers=4, hidden_size=128, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=352,
             vocab_size=512, max_position_embeddings=256)
SEQUENCES_PER_BATCH = 16
TOKEN_BUDGET = 256  # tokens per micro-batch (a longer sequence gets one of its own)
LR, EPS, SEED = 1e-3, 1e-6, 0


def make_batches(count, seed=7):
    """Global batches of long-tailed sequence lengths (log-normal, 1..256 tokens), packed
    first-fit, longest first, into micro-batches of at most TOKEN_BUDGET tokens."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        lengths = torch.exp(torch.randn(SEQUENCES_PER_BATCH, generator=gen) * 1.0 + 3.3)
        lengths = sorted((int(min(max(round(float(x)), 1), MODEL["max_position_embeddings"])) for x in lengths),
                         reverse=True)
        bins = []
        for n in lengths:
            for b in bins:
                if sum(b) + n <= TOKEN_BUDGET:
                    b.append(n)
                    break
            else:
                bins.append([n])
        batches.append([hs.MicroBatch.from_sequences(
            [torch.randint(0, MODEL["vocab_size"], (n,), generator=gen) for n in b]) for b in bins])
    return batches


def _rank(rank, world, store, layouts, steps, reference, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    cfg = hs.TransformerConfig(**MODEL)
    batches = make_batches(steps)
    rows = {}
    for name in layouts:
        layout = hs.Layout.parse(name)
        groups = hs.ParallelGroups(layout)
        model = hs.ParallelTransformer(cfg, layout, groups, seed=SEED)
        trainer = StaticTrainer(model, lr=LR, eps=EPS)
        losses, seconds, tokens = [], [], []
        for step in range(steps):
            batch = batches[step]
            dist.barrier()
            start = time.perf_counter()
            losses.append(trainer.step(hs.split_replicas(batch, layout.dp)[groups.dp_rank], hs.count_targets(batch)))
            dist.barrier()
            seconds.append(time.perf_counter() - start)
            tokens.append(sum(mb.num_tokens for mb in batch))
        timed = slice(1, None) if steps > 1 else slice(None)
        row = {"losses": losses, "tokens_per_s": sum(tokens[timed]) / sum(seconds[timed])}
        if reference is None:
            row["weights"] = {k: v.detach().numpy().copy() for k, v in model.named_shards().items()}
        else:
            full = {k: torch.from_numpy(v) for k, v in reference["weights"].items()}
            expected = hs.shard_tensors(full, cfg.tensor_set(), layout, rank)
            row["weight_diff"] = max(float((p.detach() - expected[k]).abs().max())
                                     for k, p in model.named_shards().items())
        rows[name] = row
    queue.put((rank, rows))
    dist.barrier()


def _run(world, layouts, steps, reference):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        procs = mp.start_processes(_rank, args=(world, os.path.join(tmp, "store"), layouts, steps, reference,
                                                queue), nprocs=world, start_method="spawn", join=False)
        # Read before joining: a rank exits only once its (large) result has left the pipe.
        rows = {}
        while len(rows) < world:
            try:
                rank, row = queue.get(timeout=1)
                rows[rank] = row
            except Exception:  # queue.Empty: has a rank failed (join raises) or ended without a result?
                if procs.join(timeout=0) and queue.empty():
                    raise RuntimeError(f"ranks {sorted(set(range(world)) - set(rows))} ended without a result")
        while not procs.join():
            pass
        return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="3 steps (under two minutes)")
    parser.add_argument("--steps", type=int, default=None, help="training steps (default 8, 3 with --quick)")
    args = parser.parse_args(argv)
    steps = args.steps or (3 if args.quick else 8)
    if steps < 1:
        raise SystemExit(f"--steps must be >= 1, got {steps}")
    start = time.perf_counter()
    batches = make_batches(steps)
    params = sum(s.numel for s in hs.TransformerConfig(**MODEL).tensor_set().specs)
    print(f"model: {params / 1e6:.2f} M params fp32, {MODEL['num_layers']} layers; {steps} AdamW steps "
          f"(lr {LR}, eps {EPS}); tokens per global batch: {[sum(m.num_tokens for m in b) for b in batches]}, "
          f"micro-batches: {[len(b) for b in batches]}")
    reference = _run(1, ["dp1"], steps, None)[0]["dp1"]
    results = _run(4, LAYOUTS, steps, reference)
    ref_losses = reference["losses"]
    out = {"layouts_checked": len(LAYOUTS), "steps": steps, "adam_eps": EPS,
           "tokens_per_s_world1": reference["tokens_per_s"]}
    weight_max, loss_max = 0.0, 0.0
    print(f"{'layout':<10}{'max |dw|':>12}{'loss rel diff':>15}{'tokens/s':>10}   losses")
    print(f"{'world1':<10}{'':>12}{'':>15}{reference['tokens_per_s']:>10.0f}   "
          + " ".join(f"{x:.6f}" for x in ref_losses))
    for name in LAYOUTS:
        rows = [results[r][name] for r in range(4)]
        dw = max(r["weight_diff"] for r in rows)
        dl = max(abs(a - b) / abs(b) for r in rows for a, b in zip(r["losses"], ref_losses))
        tps = rows[0]["tokens_per_s"]
        weight_max, loss_max = max(weight_max, dw), max(loss_max, dl)
        out[f"tokens_per_s_{name}"] = tps
        print(f"{name:<10}{dw:>12.2e}{dl:>15.2e}{tps:>10.0f}   " + " ".join(f"{x:.6f}" for x in rows[0]["losses"]))
    out["max_abs_weight_diff_max"] = weight_max
    out["loss_rel_diff_max"] = loss_max
    out["seconds"] = time.perf_counter() - start
    print("RESULT " + json.dumps({k: (float(f"{v:.4g}") if isinstance(v, float) and not math.isnan(v) else v)
                                  for k, v in out.items()}))


if __name__ == "__main__":
    main()
