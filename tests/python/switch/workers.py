"""Rank functions of the switch tests (module-level so that spawned ranks can import them)."""

import os
import time

import torch

import hotswitch as hs
import hotswitch.redistribute as hs_switch

from tests.python.switch.placements import full_tensors, model_set, shards_for


def _equal(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)


def every_pair(rank, world, pairs, tied, ranks_per_node=None, bandwidths=(0.0, 0.0)):
    """Switches through every (src, src_kind, dst, dst_kind) and compares with the reference;
    plans balance send time when ``bandwidths`` (intra, inter bytes/s) are given."""
    ts = model_set(tied=tied)
    topology = hs.Topology(world, ranks_per_node) if ranks_per_node else None
    fulls = full_tensors(ts)
    failures = []
    for src, src_kind, dst, dst_kind in pairs:
        a, b = hs.Layout.parse(src), hs.Layout.parse(dst)
        shards = shards_for(ts, fulls, a, rank, src_kind)
        before = {k: v.clone() for k, v in shards.items()} if isinstance(shards, dict) else shards.clone()
        result = hs.switch(shards, ts, a, b, src_kind=src_kind, dst_kind=dst_kind, timeout=60, topology=topology,
                           intra_node_bandwidth=bandwidths[0], inter_node_bandwidth=bandwidths[1])
        if not _equal(result.shards, shards_for(ts, fulls, b, rank, dst_kind)):
            failures.append(f"{src}:{src_kind} -> {dst}:{dst_kind}")
        if not _equal(shards, before):
            failures.append(f"{src}:{src_kind} -> {dst}:{dst_kind} modified its input")
        if result.stats["bytes_moved"] != result.stats["lower_bound_bytes"]:
            failures.append(f"{src} -> {dst} moved {result.stats['bytes_moved']} B over the bound")
    return failures


def partial_sum(rank, world, src, dst, dst_kind, tied=False):
    """Each data replica holds (k + 1) * value; the destination must hold the sum, including
    both pipeline stages' summands of a tied embedding."""
    ts = model_set(tied=tied)
    fulls = full_tensors(ts)
    a, b = hs.Layout.parse(src), hs.Layout.parse(dst)
    k = a.data_index(rank)
    shards = {n: t * (k + 1) for n, t in shards_for(ts, fulls, a, rank, "sharded").items()}
    result = hs.switch(shards, ts, a, b, src_kind="partial", dst_kind=dst_kind)
    total = sum(range(1, a.dp * a.cp + 1))
    copies = {s.name: 2 if s.stage == "first_and_last" and a.pp > 1 else 1 for s in ts.specs}
    expected = shards_for(ts, {n: t * total * copies[n] for n, t in fulls.items()}, b, rank, dst_kind)
    return _equal(result.shards, expected), result.stats["bytes_moved"]


def bounded_memory(rank, world, bound):
    ts = model_set()
    fulls = full_tensors(ts)
    a, b = hs.Layout.parse("tp4"), hs.Layout.parse("dp4")
    result = hs.switch(shards_for(ts, fulls, a, rank, "sharded"), ts, a, b, max_buffer_bytes=bound)
    return _equal(result.shards, shards_for(ts, fulls, b, rank, "sharded")), result.rounds


def bad_input(rank, world, case):
    """Every rank must raise ValueError; returns the messages and whether the shards survived."""
    ts = model_set()
    fulls = full_tensors(ts)
    a, b = hs.Layout.parse("dp2tp2"), hs.Layout.parse("tp2pp2")
    shards = shards_for(ts, fulls, a, rank, "sharded")
    kwargs = {}
    if case == "shape" and rank == 1:
        shards["layers.0.qkv.weight"] = torch.zeros(3, 16)
    elif case == "missing" and rank == 2:
        del shards["head.weight"]
    elif case == "dtype" and rank == 0:
        shards["final_norm.weight"] = shards["final_norm.weight"].double()
    elif case == "disagree" and rank == 3:
        specs = list(ts.specs)
        specs[3] = hs.ParamSpec(specs[3].name, [16, 16], "float32", "column", layer=0)
        ts = hs.TensorSet(specs, ts.num_layers)
    elif case == "layout_world":
        b = hs.Layout.parse("dp2tp4")
    elif case == "layout_disagree" and rank == 2:
        b = hs.Layout.parse("tp4")
    elif case == "bound" and rank == 1:
        kwargs["max_buffer_bytes"] = 4096
    elif case == "bad_bound" and rank == 0:
        kwargs["max_buffer_bytes"] = -5
    elif case == "timeout_inf" and rank == 3:
        kwargs["timeout"] = float("inf")
    elif case == "topology_type" and rank == 2:
        kwargs["topology"] = "two nodes"
    elif case == "topology_disagree" and rank == 1:
        kwargs["topology"] = hs.Topology(4, 2)
    elif case == "kind":
        kwargs["dst_kind"] = "sharded_zero"
    elif case == "bandwidth_disagree" and rank == 1:
        kwargs.update(intra_node_bandwidth=200e9, inter_node_bandwidth=25e9)
    elif case == "bandwidth_one":
        kwargs["inter_node_bandwidth"] = 25e9
    elif case == "bandwidth_type" and rank == 2:
        kwargs["intra_node_bandwidth"] = "fast"
    elif case == "uneven":
        b = hs.Layout.parse("tp4")
        ts = model_set(hidden=6, ffn=12, vocab=12)
        fulls = full_tensors(ts)
        shards = {}
    before = {k: v.clone() for k, v in shards.items()}
    kwargs.setdefault("timeout", 30)
    try:
        hs.switch(shards, ts, a, b, **kwargs)
        message = None
    except ValueError as e:
        message = str(e)
    intact = _equal(shards, before)
    # The group still works after a refused switch.
    good = model_set()
    again = hs.switch(shards_for(good, full_tensors(good), a, rank, "sharded"), good, a,
                      hs.Layout.parse("tp4"), timeout=30)
    return message, intact, again.stats["bytes_moved"] > 0


class _DyingExecutor:
    """Stands in for the executor on the failing rank: dies or stalls inside the switch."""

    def __init__(self, mode):
        self.mode = mode

    def run(self, *args):
        if self.mode == "die":
            os._exit(17)
        time.sleep(8)  # well past the peers' timeout
        os._exit(18)


def peer_fault(rank, world, mode, victim, timeout):
    ts = model_set()
    fulls = full_tensors(ts)
    a, b = hs.Layout.parse("tp2pp2"), hs.Layout.parse("dp4")
    shards = shards_for(ts, fulls, a, rank, "sharded")
    before = {k: v.clone() for k, v in shards.items()}
    if rank == victim:
        real = hs_switch._executor
        hs_switch._executor = lambda group: (real(group)[0], _DyingExecutor(mode))
    start = time.monotonic()
    try:
        hs.switch(shards, ts, a, b, timeout=timeout)
        outcome = "returned"
    except hs.SwitchTimeout as e:
        outcome = f"SwitchTimeout: {e}"
    except hs.SwitchFault as e:
        outcome = f"SwitchFault: {e}"
    return outcome, time.monotonic() - start, _equal(shards, before)


def donated_ping_pong(rank, world):
    """Switching back and forth with donate=True reuses memory yet stays exact, and never
    overwrites a donated shard the caller kept."""
    ts = model_set()
    fulls = full_tensors(ts)
    a, b = hs.Layout.parse("tp2pp2"), hs.Layout.parse("dp2tp2")
    kept = shards_for(ts, fulls, a, rank, "sharded")
    kept_copy = {k: v.clone() for k, v in kept.items()}
    shards = hs.switch(kept, ts, a, b, donate=True).shards  # `kept` is still referenced
    reused = 0
    for step in range(4):
        src, dst = (b, a) if step % 2 == 0 else (a, b)
        ptrs = {v.data_ptr() for v in shards.values()}
        out = hs.switch(shards, ts, src, dst, donate=True).shards
        del shards
        shards = out
        if step >= 1:
            reused += sum(v.data_ptr() in previous for v in shards.values())
        previous = ptrs
        if not _equal(shards, shards_for(ts, fulls, dst, rank, "sharded")):
            return False, reused, "wrong shards"
    return _equal(kept, kept_copy), reused, "ok"


def _on(shards, device):
    if isinstance(shards, dict):
        return {k: v.to(device) for k, v in shards.items()}
    return shards.to(device)


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu())
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def switch_on_device(rank, world, pairs):
    """Switches shards on the backend's device (CUDA under NCCL) through each (src, src_kind,
    dst, dst_kind): the executor packs, copies and unpacks strided views there. Returns the
    failures."""
    nccl = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    failures = []
    for dtype in ("float32", "bfloat16"):
        ts = model_set(tied=True, dtype=dtype)
        fulls = full_tensors(ts)
        for src, src_kind, dst, dst_kind in pairs:
            a, b = hs.Layout.parse(src), hs.Layout.parse(dst)
            shards = _on(shards_for(ts, fulls, a, rank, src_kind), device)
            result = hs.switch(shards, ts, a, b, src_kind=src_kind, dst_kind=dst_kind, timeout=60)
            out = result.shards
            on_device = all(v.device == device for v in out.values()) if isinstance(out, dict) else out.device == device
            if not on_device:
                failures.append(f"{dtype} {src}:{src_kind} -> {dst}:{dst_kind} left the device")
            if not _same(out, shards_for(ts, fulls, b, rank, dst_kind)):
                failures.append(f"{dtype} {src}:{src_kind} -> {dst}:{dst_kind} differs from the reference")
    return failures


def llama_round_trip(rank, world):
    """LLaMA-7B's bf16 tensor set on the backend's device, world 1: "sharded" -> "zero" and
    back, and "partial" -> "zero" (one summand: the same bytes). Returns the failures."""
    nccl = torch.distributed.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if nccl else torch.device("cpu")
    ts = hs.llama_tensor_set(dtype="bfloat16")
    dp1 = hs.Layout.parse("dp1")
    # Distinct small integers per tensor, exact in bf16.
    shards = {s.name: ((torch.arange(s.numel, device=device) + 7 * i) % 251).to(torch.bfloat16).view(s.shape)
              for i, s in enumerate(ts.specs)}
    failures = []
    flat = hs.switch(shards, ts, dp1, dp1, dst_kind="zero", timeout=120).shards
    if flat.numel() != sum(s.numel for s in ts.specs) or flat.device != device:
        failures.append(f"sharded -> zero gave {flat.numel()} elements on {flat.device}")
    back = hs.switch(flat, ts, dp1, dp1, src_kind="zero", timeout=120).shards
    if not _equal(back, shards):
        failures.append("sharded -> zero -> sharded differs from the input")
    del back
    summed = hs.switch(shards, ts, dp1, dp1, src_kind="partial", dst_kind="zero", timeout=120).shards
    if not torch.equal(summed, flat):
        failures.append("partial -> zero differs from sharded -> zero")
    return failures


def _bits(x):
    """A 16-bit tensor's (or a dict's) bit patterns as int16: NaN payloads compare too."""
    if isinstance(x, torch.Tensor):
        return x.view(torch.int16) if x.element_size() == 2 else x
    return {k: _bits(v) for k, v in x.items()}


def every_pair_16bit(rank, world, pairs, dtype, tied):
    """Switches a ``dtype`` (bfloat16 or float16) tensor set through every (src, src_kind,
    dst, dst_kind) of ``pairs``; the full tensors hold random bit patterns (subnormals, infs
    and NaNs among them). Returns the pairs whose result is not bit for bit the reference
    placement's, or whose shards changed dtype."""
    ts = model_set(tied=tied, dtype=dtype)
    g = torch.Generator().manual_seed(5)
    fulls = {s.name: torch.randint(-2 ** 15, 2 ** 15, tuple(s.shape), dtype=torch.int16, generator=g).view(
        getattr(torch, dtype)) for s in ts.specs}
    failures = []
    for src, src_kind, dst, dst_kind in pairs:
        a, b = hs.Layout.parse(src), hs.Layout.parse(dst)
        result = hs.switch(shards_for(ts, fulls, a, rank, src_kind), ts, a, b, src_kind=src_kind,
                           dst_kind=dst_kind, timeout=60)
        expected = shards_for(ts, fulls, b, rank, dst_kind)
        dtypes = {t.dtype for t in ([result.shards] if isinstance(result.shards, torch.Tensor)
                                    else result.shards.values())}
        if dtypes != {getattr(torch, dtype)} or not _equal(_bits(result.shards), _bits(expected)):
            failures.append(f"{src}:{src_kind} -> {dst}:{dst_kind}")
    return failures
