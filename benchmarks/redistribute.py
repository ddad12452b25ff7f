"""Redistribution plans and switches.

Part 1 (planned only, no data moves): a LLaMA-7B tensor set (bf16) and every ordered pair of
distinct (dp, tp, pp) layouts of worlds 8 (one node), 16 and 32 (nodes of 8). Ours against
two baselines: *greedy* (tensors in order, sender = the same-node owner that has sent the
fewest bytes so far, as HotSPa's public code does) and *gather* (all-gather the full
tensors each rank needs, then slice).

Part 2 (executed): 4 gloo ranks, a scaled-down LLaMA (fp32, ~94 MB), several layout pairs:
the switch against a bare batched send/recv of the same messages over the same transport
(what packing, unpacking and the agreement cost) and against all-gather then slice.
The switch is timed in the steady state of training (switching back and forth, each switch
donating its old shards, so no new memory is touched) and fresh (new memory every time).
Medians of repeated runs in one process.

    /usr/bin/python3 -m benchmarks.redistribute [--quick]
"""

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hotswitch as hs
from hotswitch import _C

EXEC_PAIRS = [("tp4", "dp4"), ("pp4", "dp2tp2"), ("tp2pp2", "dp2pp2"), ("dp2pp2", "tp4"), ("tp4", "pp4")]


def _ratio(a, b):
    if b == 0:
        return 1.0 if a == 0 else float("inf")
    return a / b


def _gather_bytes(ts, src_pl, dst_pl, world):
    """Bytes that all-gather-then-slice receives: each rank gets the full tensors it holds
    under dst, less what it already holds of them under src."""
    full = [s.nbytes for s in ts.specs]
    elem = [s.nbytes // s.numel for s in ts.specs]
    total = 0
    for r in range(world):
        held = {t: torch.Size(shape).numel() for t, shape, _ in src_pl.buffers(r)}
        for t in {t for t, _, _ in dst_pl.buffers(r)}:
            total += full[t] - held.get(t, 0) * elem[t]
    return total


def plan_quality(worlds, quick):
    ts = hs.llama_tensor_set()  # 7B, bf16
    rows = []
    for world, per_node in worlds:
        topo = hs.Topology(world, per_node)
        layouts = hs.Layout.enumerate(world)
        placements = {l.name: _C.Placement(ts, l, "sharded") for l in layouts}
        pairs = [(a, b) for a, b in itertools.product(layouts, layouts) if a != b]
        for a, b in pairs:
            cache = _C.PlanCache()
            t0 = time.perf_counter()
            ours = hs.plan_switch(ts, a, b, topology=topo, cache=cache)
            cold_ms = (time.perf_counter() - t0) * 1e3
            t0 = time.perf_counter()
            hs.plan_switch(ts, a, b, topology=topo, cache=cache)
            cached_ms = (time.perf_counter() - t0) * 1e3
            greedy = hs.plan_switch(ts, a, b, topology=topo, policy="greedy", cache=cache)
            s, g = ours.stats, greedy.stats
            rows.append({
                "world": world, "src": a.name, "dst": b.name,
                "bytes": s["bytes_moved"], "lb_bytes": s["lower_bound_bytes"],
                "max_send": s["max_send_bytes"], "snf_max_send": s["same_node_first_max_send_bytes"],
                "inter": s["inter_node_bytes"], "greedy_max_send": g["max_send_bytes"],
                "greedy_inter": g["inter_node_bytes"], "greedy_bytes": g["bytes_moved"],
                "gather_bytes": _gather_bytes(ts, placements[a.name], placements[b.name], world),
                "messages": s["num_messages"], "greedy_messages": g["num_messages"],
                "cold_ms": cold_ms, "cached_ms": cached_ms,
            })
        print(f"world {world}: {len(pairs)} ordered pairs planned", flush=True)
    moving = [r for r in rows if r["lb_bytes"] > 0]
    send_ratio = [_ratio(r["max_send"], r["snf_max_send"]) for r in moving]
    vs_greedy = [_ratio(r["max_send"], r["greedy_max_send"]) for r in moving]
    worst = max(moving, key=lambda r: _ratio(r["max_send"], r["snf_max_send"]))
    best_vs_greedy = min(moving, key=lambda r: _ratio(r["max_send"], r["greedy_max_send"]))
    print(f"worst max-send ratio: {worst['src']} -> {worst['dst']} (world {worst['world']}): "
          f"{worst['max_send']} B vs the same-node-first optimum {worst['snf_max_send']} B")
    print(f"largest gain over greedy: {best_vs_greedy['src']} -> {best_vs_greedy['dst']} "
          f"(world {best_vs_greedy['world']}): max send {best_vs_greedy['max_send'] / 2**20:.0f} MiB "
          f"vs {best_vs_greedy['greedy_max_send'] / 2**20:.0f} MiB")
    return {
        "pairs_planned": len(rows),
        "bytes_over_lower_bound_max": max(_ratio(r["bytes"], r["lb_bytes"]) for r in moving),
        "max_send_over_same_node_first_optimum_median": statistics.median(send_ratio),
        "max_send_over_same_node_first_optimum_max": max(send_ratio),
        "max_send_vs_greedy_median": statistics.median(vs_greedy),
        "max_send_vs_greedy_min": min(vs_greedy),
        "inter_node_bytes_vs_greedy_max": max(_ratio(r["inter"], r["greedy_inter"]) for r in moving),
        "inter_node_bytes_vs_greedy_median": statistics.median(
            [_ratio(r["inter"], r["greedy_inter"]) for r in moving if r["greedy_inter"] > 0] or [1.0]),
        "bytes_vs_gather_median": statistics.median(_ratio(r["bytes"], r["gather_bytes"]) for r in moving),
        "messages_vs_greedy_median": statistics.median(_ratio(r["messages"], r["greedy_messages"]) for r in moving),
        "plan_ms_cold_median": statistics.median(r["cold_ms"] for r in rows),
        "plan_ms_cold_max": max(r["cold_ms"] for r in rows),
        "plan_ms_cached_median": statistics.median(r["cached_ms"] for r in rows),
    }


# --- Part 2: executed switches ---------------------------------------------------------

def _exec_set():
    return hs.llama_tensor_set(num_layers=6, hidden_size=512, ffn_hidden_size=1408,
                               num_attention_heads=8, num_query_groups=8, vocab_size=4096,
                               dtype="float32")


def _timed(fn):
    dist.barrier()
    t0 = time.perf_counter()
    out = fn()
    elapsed = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    return elapsed.item(), out


def _gather_then_slice(ts, src, dst, shards, rank, world):
    """All-gather every rank's source shards, rebuild the full tensors, slice the new shards."""
    pl = _C.Placement(ts, src, "sharded")
    flat = torch.cat([shards[ts.specs[t].name].reshape(-1) for t, _, _ in pl.buffers(rank)])
    sizes = [sum(torch.Size(s).numel() for _, s, _ in pl.buffers(r)) for r in range(world)]
    padded = torch.zeros(max(sizes))
    padded[: flat.numel()] = flat
    gathered = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(gathered, padded)
    full = {s.name: torch.empty(s.shape) for s in ts.specs}
    for r in range(world):
        starts, at = [], 0
        for _, shape, _ in pl.buffers(r):
            starts.append(at)
            at += torch.Size(shape).numel()
        for tensor, lo, hi, buffer, offset, strides, _ in pl.pieces(r):
            sizes_ = [b - a for a, b in zip(lo, hi)]
            view = gathered[r].as_strided(sizes_, strides, starts[buffer] + offset)
            full[ts.specs[tensor].name][tuple(slice(a, b) for a, b in zip(lo, hi))] = view
    return hs.shard_tensors(full, ts, dst, rank)


def _exec_rank(rank, world, store, repeats, queue):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=300))
    ts = _exec_set()
    gen = torch.Generator().manual_seed(0)
    full = {s.name: torch.randn(s.shape, generator=gen) for s in ts.specs}
    transport = _C.C10dTransport(dist.group.WORLD)
    rows = []
    for src_name, dst_name in EXEC_PAIRS:
        src, dst = hs.Layout.parse(src_name), hs.Layout.parse(dst_name)
        shards = hs.shard_tensors(full, ts, src, rank)
        plan = hs.plan_switch(ts, src, dst, topology=hs.Topology(world, world))
        sends = [(m[1], torch.empty(m[2], dtype=torch.uint8)) for m in plan.messages() if m[0] == rank]
        recvs = [(m[0], torch.empty(m[2], dtype=torch.uint8)) for m in plan.messages() if m[1] == rank]
        cold, ours, raw, gather, parts = [], [], [], [], []
        for _ in range(repeats):
            # A fresh switch: its new shards are freshly allocated memory.
            t, result = _timed(lambda: hs.switch(shards, ts, src, dst, timeout=120))
            cold.append(t)
            t, _ = _timed(lambda: transport.exchange(sends, recvs, 120.0))
            raw.append(t)
            t, sliced = _timed(lambda: _gather_then_slice(ts, src, dst, shards, rank, world))
            gather.append(t)
        assert all(torch.equal(result.shards[n], sliced[n]) for n in sliced), "switch and gather disagree"
        del result
        # Steady state, as in training: back and forth, each switch donating its old shards.
        current = {n: t.clone() for n, t in shards.items()}
        for _ in range(repeats + 1):
            t, result = _timed(lambda: hs.switch(current, ts, src, dst, timeout=120, donate=True))
            ours.append(t)
            parts.append((result.pack_seconds, result.exchange_seconds, result.unpack_seconds))
            current = result.shards
            del result
            current = hs.switch(current, ts, dst, src, timeout=120, donate=True).shards
        ours, parts = ours[1:], parts[1:]  # the first donation has nothing to reuse yet
        assert all(torch.equal(current[n], shards[n]) for n in shards), "round trips changed the shards"
        del current
        rows.append({"src": src_name, "dst": dst_name, "bytes": plan.stats["bytes_moved"],
                     "switch_s": statistics.median(ours), "cold_s": statistics.median(cold),
                     "raw_s": statistics.median(raw), "gather_s": statistics.median(gather),
                     "pack_s": statistics.median(p[0] for p in parts),
                     "exchange_s": statistics.median(p[1] for p in parts),
                     "unpack_s": statistics.median(p[2] for p in parts)})
    if rank == 0:
        queue.put(rows)
    dist.barrier()


def executed(repeats):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(_exec_rank, args=(4, os.path.join(tmp, "store"), repeats, queue),
                           nprocs=4, start_method="spawn")
        rows = queue.get(timeout=60)
    mb = sum(s.nbytes for s in _exec_set().specs) / 1e6
    print(f"executed switches, 4 gloo ranks, model {mb:.0f} MB, medians of {repeats} runs:")
    print("switch: steady state (old shards donated); fresh: new memory every switch")
    print(f"{'switch':<18}{'MB moved':>9}{'switch ms':>11}{'fresh ms':>10}{'raw ms':>9}{'gather ms':>11}"
          f"   rank 0: pack / exchange / unpack ms")
    for r in rows:
        print(f"{r['src'] + ' -> ' + r['dst']:<18}{r['bytes'] / 1e6:>9.1f}{r['switch_s'] * 1e3:>11.1f}"
              f"{r['cold_s'] * 1e3:>10.1f}{r['raw_s'] * 1e3:>9.1f}{r['gather_s'] * 1e3:>11.1f}"
              f"   {r['pack_s'] * 1e3:.1f} / {r['exchange_s'] * 1e3:.1f} / {r['unpack_s'] * 1e3:.1f}")
    return {
        "exec_model_mb": round(mb, 1),
        "exec_pairs": len(rows),
        "switch_overhead_vs_raw_median": statistics.median(r["switch_s"] / r["raw_s"] for r in rows),
        "switch_overhead_vs_raw_max": max(r["switch_s"] / r["raw_s"] for r in rows),
        "fresh_switch_overhead_vs_raw_median": statistics.median(r["cold_s"] / r["raw_s"] for r in rows),
        "speedup_vs_gather_median": statistics.median(r["gather_s"] / r["switch_s"] for r in rows),
        "speedup_vs_gather_min": min(r["gather_s"] / r["switch_s"] for r in rows),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repeats (under two minutes)")
    parser.add_argument("--only", choices=["plans", "switches"], help="run one part")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    result = {}
    if args.only != "switches":
        result.update(plan_quality([(8, 8), (16, 8), (32, 8)], args.quick))
    if args.only != "plans":
        result.update(executed(3 if args.quick else 9))
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in result.items()}))


if __name__ == "__main__":
    sys.exit(main())
