"""Redistribution plans and switches.

Part 1 (planned only, no data moves): a LLaMA-7B tensor set (bf16) and every ordered pair of
distinct (dp, tp, pp) layouts of worlds 8 (one node), 16 and 32 (nodes of 8). Ours against
two baselines: *greedy* (tensors in order, sender = the same-node owner that has sent the
fewest bytes so far, as HotSPa's public code does) and *gather* (all-gather the full
tensors each rank needs, then slice); and against the linear program that lets any owner
send (``hotswitch.analysis.switch_lp``, CBC), which our plans, taking elements from the
receiver's node first, cannot always reach: its smallest largest send in bytes, and the
slowest rank's send time ``intra / intra_bw + inter / inter_bw`` with the links of
``--hardware`` (a prediction from link bandwidths, hence ``predicted_``), for our plans
balanced in time (given those bandwidths) and in bytes (the default). ``--quick`` solves the
program for world 16 only.

Part 2 (executed): 4 gloo ranks, a scaled-down LLaMA (fp32, ~94 MB), several layout pairs:
the switch against a bare batched send/recv of the same messages over the same transport
(what packing, unpacking and the agreement cost) and against all-gather then select: every
rank's source shards as one flat buffer, one ``all_gather_into_tensor``, then the new shards
taken from the gathered buffer with one index per buffer, computed once before timing.
The switch is timed in the steady state of training (switching back and forth, each switch
donating its old shards, so no new memory is touched) and fresh (new memory every time).
Medians of repeated runs in one process.

    .venv/bin/python -m benchmarks.redistribute [--quick] [--hardware a800]
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
from benchmarks import rounded
from hotswitch import _C
from hotswitch.analysis import switch_lp
from hotswitch.hardware import load_hardware

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


def plan_quality(worlds, lp_worlds, hardware):
    ts = hs.llama_tensor_set()  # 7B, bf16
    intra, inter = hardware.intra_node_bandwidth, hardware.inter_node_bandwidth
    rows = []
    memo = {}
    for world, per_node in worlds:
        topo = hs.Topology(world, per_node)
        layouts = hs.Layout.enumerate(world)
        placements = {l.name: _C.Placement(ts, l, "sharded") for l in layouts}
        pairs = [(a, b) for a, b in itertools.product(layouts, layouts) if a != b]
        lp_s = 0.0
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
            row = {
                "world": world, "src": a.name, "dst": b.name,
                "bytes": s["bytes_moved"], "lb_bytes": s["lower_bound_bytes"],
                "max_send": s["max_send_bytes"], "near_opt_max_send": s["same_node_first_max_send_bytes"],
                "inter": s["inter_node_bytes"], "greedy_max_send": g["max_send_bytes"],
                "greedy_inter": g["inter_node_bytes"], "greedy_bytes": g["bytes_moved"],
                "gather_bytes": _gather_bytes(ts, placements[a.name], placements[b.name], world),
                "messages": s["num_messages"], "greedy_messages": g["num_messages"],
                "cold_ms": cold_ms, "cached_ms": cached_ms,
            }
            if world in lp_worlds and s["bytes_moved"] > 0:
                timed = hs.plan_switch(ts, a, b, topology=topo, cache=cache, intra_node_bandwidth=intra,
                                       inter_node_bandwidth=inter)
                row["timed_send_s"] = timed.stats["max_send_seconds"]
                t0 = time.perf_counter()
                classes = switch_lp.demand_classes(ts, a, b, memo=memo)
                row["lp_max_send"] = switch_lp.solve(ts, a, b, per_node, classes=classes)["optimum"]
                row["lp_send_s"] = switch_lp.solve(ts, a, b, per_node, classes=classes, intra_node_bandwidth=intra,
                                                   inter_node_bandwidth=inter)["optimum"]
                row["send_s"] = switch_lp.plan_send_seconds(ours, per_node, intra, inter)
                lp_s += time.perf_counter() - t0
            rows.append(row)
        print(f"world {world}: {len(pairs)} ordered pairs planned"
              + (f", the any-owner program solved for each in {lp_s:.0f} s" if world in lp_worlds else ""), flush=True)
    moving = [r for r in rows if r["lb_bytes"] > 0]
    solved = [r for r in moving if "lp_max_send" in r]
    send_ratio = [_ratio(r["max_send"], r["near_opt_max_send"]) for r in moving]
    vs_greedy = [_ratio(r["max_send"], r["greedy_max_send"]) for r in moving]
    vs_lp = [r["max_send"] / r["lp_max_send"] for r in solved]
    time_vs_lp = [r["timed_send_s"] / r["lp_send_s"] for r in solved]
    bytes_time_vs_lp = [r["send_s"] / r["lp_send_s"] for r in solved]
    best_vs_greedy = min(moving, key=lambda r: _ratio(r["max_send"], r["greedy_max_send"]))
    print(f"largest gain over greedy: {best_vs_greedy['src']} -> {best_vs_greedy['dst']} "
          f"(world {best_vs_greedy['world']}): max send {best_vs_greedy['max_send'] / 2**20:.0f} MiB "
          f"vs {best_vs_greedy['greedy_max_send'] / 2**20:.0f} MiB")
    print(f"against the any-owner program ({len(solved)} pairs; links {intra / 1e9:.0f} / {inter / 1e9:.0f} GB/s "
          f"intra / inter node, {hardware.name}):")
    print("  bytes: our default plans (balanced in bytes) against the program in bytes; predicted ms: the slowest "
          "rank's send, our plans balanced in bytes and in time, against the program in seconds")
    print(f"{'world':>6}  {'switch':<22}{'max send MiB':>13}{'program MiB':>12}{'ratio':>7}"
          f"{'by bytes ms':>12}{'by time ms':>11}{'program ms':>11}{'ratio':>7}")
    worst = sorted(solved, key=lambda r: -r["timed_send_s"] / r["lp_send_s"])[:5]
    worst += [r for r in sorted(solved, key=lambda r: -r["send_s"] / r["lp_send_s"])[:3] if r not in worst]
    worst += [r for r in sorted(solved, key=lambda r: -r["max_send"] / r["lp_max_send"])[:3] if r not in worst]
    for r in worst:
        print(f"{r['world']:>6}  {r['src'] + ' -> ' + r['dst']:<22}{r['max_send'] / 2**20:>13.1f}"
              f"{r['lp_max_send'] / 2**20:>12.1f}{r['max_send'] / r['lp_max_send']:>7.3f}"
              f"{r['send_s'] * 1e3:>12.2f}{r['timed_send_s'] * 1e3:>11.2f}{r['lp_send_s'] * 1e3:>11.2f}"
              f"{r['timed_send_s'] / r['lp_send_s']:>7.3f}")
    per_world = {}
    for world in sorted({r["world"] for r in solved}):
        mine = [r["timed_send_s"] / r["lp_send_s"] for r in solved if r["world"] == world]
        per_world[str(world)] = {"median": statistics.median(mine), "max": max(mine)}
    return {
        "pairs_planned": len(rows),
        "bytes_over_lower_bound_max": max(_ratio(r["bytes"], r["lb_bytes"]) for r in moving),
        # Rounding only: the plan against its own fractional optimum under same-node-first.
        "max_send_over_same_node_first_optimum_max": max(send_ratio),
        "lp_pairs": len(solved),
        "lp_hardware": hardware.name,
        "max_send_bytes_over_lp_optimum_median": statistics.median(vs_lp) if vs_lp else None,
        "max_send_bytes_over_lp_optimum_max": max(vs_lp) if vs_lp else None,
        "predicted_max_send_time_over_lp_optimum_median": statistics.median(time_vs_lp) if time_vs_lp else None,
        "predicted_max_send_time_over_lp_optimum_max": max(time_vs_lp) if time_vs_lp else None,
        "predicted_max_send_time_over_lp_optimum_by_world": per_world,
        "predicted_max_send_time_over_lp_optimum_bytes_balanced_median":
            statistics.median(bytes_time_vs_lp) if bytes_time_vs_lp else None,
        "predicted_max_send_time_over_lp_optimum_bytes_balanced_max":
            max(bytes_time_vs_lp) if bytes_time_vs_lp else None,
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


def _gather_index(ts, src, dst, rank, world):
    """What all-gather then select needs, computed once per switch: the flat size every rank
    gathers, and per destination buffer of ``rank`` the positions of its elements in the
    gathered buffer (rank r's source buffers, back to back, at r * width)."""
    spl, dpl = _C.Placement(ts, src, "sharded"), _C.Placement(ts, dst, "sharded")
    sizes = [sum(torch.Size(s).numel() for _, s, _ in spl.buffers(r)) for r in range(world)]
    width = max(sizes)
    where = [torch.full((spec.numel,), -1, dtype=torch.long) for spec in ts.specs]
    for r in range(world):
        starts, at = [], r * width
        for _, shape, _ in spl.buffers(r):
            starts.append(at)
            at += torch.Size(shape).numel()
        for tensor, lo, hi, buffer, offset, strides, _ in spl.pieces(r):
            box = tuple(slice(a, b) for a, b in zip(lo, hi))
            sizes_ = [b - a for a, b in zip(lo, hi)]
            full = torch.arange(ts.specs[tensor].numel).view(ts.specs[tensor].shape)[box]
            pos = torch.arange(starts[buffer], at).as_strided(sizes_, strides, offset)
            where[tensor][full.reshape(-1)] = pos.reshape(-1)
    index = []
    for t, shape, _ in dpl.buffers(rank):
        out = torch.full((torch.Size(shape).numel(),), -1, dtype=torch.long)
        for tensor, lo, hi, buffer, offset, strides, _ in dpl.pieces(rank):
            if tensor != t:
                continue
            box = tuple(slice(a, b) for a, b in zip(lo, hi))
            sizes_ = [b - a for a, b in zip(lo, hi)]
            full = torch.arange(ts.specs[tensor].numel).view(ts.specs[tensor].shape)[box]
            out.as_strided(sizes_, strides, offset).copy_(where[tensor][full])
        assert (out >= 0).all(), "a destination element has no source"
        index.append((ts.specs[t].name, tuple(shape), out))
    return width, index


def _gather_then_select(shards, order, width, index, world):
    """All-gather every rank's source shards as one flat buffer, select the new shards."""
    flat = torch.cat([shards[name].reshape(-1) for name in order])
    padded = torch.zeros(width, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    gathered = torch.empty(world * width, dtype=flat.dtype)
    dist.all_gather_into_tensor(gathered, padded)
    return {name: gathered.index_select(0, idx).view(shape) for name, shape, idx in index}


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
        order = [ts.specs[t].name for t, _, _ in _C.Placement(ts, src, "sharded").buffers(rank)]
        width, index = _gather_index(ts, src, dst, rank, world)
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
            t, sliced = _timed(lambda: _gather_then_select(shards, order, width, index, world))
            gather.append(t)
        assert sliced.keys() == result.shards.keys(), "switch and gather hold different tensors"
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
    print("switch: steady state (old shards donated); fresh: new memory every switch; gather: "
          "all_gather_into_tensor of flat buffers, then select")
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
    parser.add_argument("--quick", action="store_true",
                        help="fewer repeats, the any-owner program for world 16 only")
    parser.add_argument("--only", choices=["plans", "switches"], help="run one part")
    parser.add_argument("--hardware", default="a800", help="links of the predicted send times: a preset or FILE.json")
    args = parser.parse_args(argv)
    try:
        hardware = load_hardware(args.hardware)
    except ValueError as e:
        parser.error(str(e))
    start = time.perf_counter()
    result = {}
    if args.only != "switches":
        result.update(plan_quality([(8, 8), (16, 8), (32, 8)], (16,) if args.quick else (8, 16, 32), hardware))
    if args.only != "plans":
        result.update(executed(3 if args.quick else 9))
    result["seconds"] = round(time.perf_counter() - start, 1)
    print("RESULT " + json.dumps(rounded(result)))


if __name__ == "__main__":
    sys.exit(main())
