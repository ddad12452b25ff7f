"""Switches a small LLaMA-style model's weights through a tour of layouts on real processes
and prints what moved.

    python examples/switch_demo.py --world 4            # spawns 4 local gloo ranks
    torchrun --nproc-per-node 4 examples/switch_demo.py           # or torchrun (PyTorch 2.x)
"""

import argparse
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hotswitch as hs

TOUR = ["dp4", "dp2tp2", "tp2pp2", "pp4", "tp4", "dp2pp2", "dp4"]


def full_weights(tensor_set):
    gen = torch.Generator().manual_seed(0)
    return {s.name: torch.randn(s.shape, generator=gen) for s in tensor_set.specs}


def run(rank, world, args):
    torch.set_num_threads(1)
    ts = hs.llama_tensor_set(num_layers=8, hidden_size=256, ffn_hidden_size=704,
                             num_attention_heads=8, num_query_groups=4, vocab_size=1024,
                             dtype="float32")
    full = full_weights(ts)
    tour = [hs.Layout.parse(name) for name in args.tour.split(",")]
    shards = hs.shard_tensors(full, ts, tour[0], rank)
    rows = []
    for src, dst in zip(tour, tour[1:]):
        result = hs.switch(shards, ts, src, dst, timeout=60)
        shards = result.shards
        expected = hs.shard_tensors(full, ts, dst, rank)
        exact = all(torch.equal(shards[n], expected[n]) for n in expected)
        flags = torch.tensor([int(exact)])
        dist.all_reduce(flags, op=dist.ReduceOp.MIN)
        seconds = torch.tensor([result.seconds])
        dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
        rows.append((src.name, dst.name, result.stats, seconds.item(), bool(flags.item())))
    if rank == 0:
        mib = 1 / 2**20
        total = sum(s.nbytes for s in ts.specs)
        print(f"hotswitch demo: {len(ts.specs)} tensors, {total * mib:.1f} MiB, {world} gloo ranks")
        print(f"{'switch':<18}{'moved MiB':>10}{'bound MiB':>10}{'max send':>10}{'near opt':>9}"
              f"{'msgs':>6}{'ms':>8}  exact")
        print("(bound: bytes the destinations lack; near opt: the smallest largest send when elements "
              "come from the receiver's node first)")
        for src, dst, st, sec, exact in rows:
            print(f"{src + ' -> ' + dst:<18}{st['bytes_moved'] * mib:>10.2f}{st['lower_bound_bytes'] * mib:>10.2f}"
                  f"{st['max_send_bytes'] * mib:>10.2f}{st['same_node_first_max_send_bytes'] * mib:>9.2f}"
                  f"{st['num_messages']:>6}{sec * 1e3:>8.1f}  {'yes' if exact else 'NO'}")
        ok = all(r[4] for r in rows)
        print("every rank's shards equal the slices of the full weights after every switch" if ok
              else "MISMATCH: some shards differ from the full weights")
    return all(r[4] for r in rows)


def _spawned(rank, world, store, args):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    ok = run(rank, world, args)
    dist.barrier()
    dist.destroy_process_group()
    if not ok:
        sys.exit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=4, help="ranks to spawn when not under torchrun")
    parser.add_argument("--tour", default=",".join(TOUR), help="comma-separated layouts to switch through")
    args = parser.parse_args()
    if "RANK" in os.environ:  # launched by torchrun
        dist.init_process_group("gloo")
        ok = run(dist.get_rank(), dist.get_world_size(), args)
        dist.barrier()
        dist.destroy_process_group()
        sys.exit(0 if ok else 1)
    if args.world < 1:
        parser.error(f"--world must be >= 1, got {args.world}")
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_spawned, args=(args.world, os.path.join(tmp, "store"), args), nprocs=args.world)


if __name__ == "__main__":
    main()
