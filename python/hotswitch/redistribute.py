"""Switching a tensor set between placements across real processes.

``switch`` takes this rank's local shards under one layout and returns its shards under
another, moving only what the destination lacks, through one batched point-to-point
exchange over a torch.distributed process group.
"""

import dataclasses
import hashlib
import os
from typing import Callable, Dict, List, Optional, Union

import torch
import torch.distributed as dist

from hotswitch import _C
from hotswitch.logging import get_logger

__all__ = ["SwitchResult", "TensorSet", "plan_switch", "switch", "default_topology"]

TensorSet = _C.TensorSet
PLACEMENT_KINDS = ("sharded", "zero", "partial")
DEFAULT_TIMEOUT_S = 300.0
MIN_BUFFER_BYTES = 16  # room for one element and its alignment
MAX_TIMEOUT_S = 1e7

_log = get_logger("switch")
_default_cache = _C.PlanCache()
_executors: Dict[object, tuple] = {}  # group -> (transport, executor)

Shards = Union[Dict[str, torch.Tensor], torch.Tensor]


@dataclasses.dataclass
class SwitchResult:
    """What a switch returned on this rank.

    ``shards``: the new local shards, a dict ``name -> tensor`` (shapes of the local shards
    under the destination layout) or, for a ``"zero"`` destination, one flat 1-D tensor.
    ``stats``: the plan's figures for the whole world, in bytes: bytes moved, inter-node
    bytes, largest per-rank send and receive, messages; lower bounds of the first two over
    every plan (``lower_bound_bytes``, ``lower_bound_inter_node_bytes``); and the smallest
    largest send when elements come from the receiver's node first
    (``same_node_first_max_send_bytes``), not a bound over every plan. Given link
    bandwidths, also in seconds: ``max_send_seconds`` (the slowest rank's send) and
    ``same_node_first_max_send_seconds`` (the least under that rule); else 0.
    ``seconds``: wall time of this rank's switch, split into ``pack_seconds`` (local copies
    and packing), ``exchange_seconds`` and ``unpack_seconds``; ``plan_cached``: whether the
    plan came from the cache; ``rounds``: exchanges run under ``max_buffer_bytes``.
    """

    shards: Shards
    stats: Dict[str, Union[int, float]]
    seconds: float
    pack_seconds: float
    exchange_seconds: float
    unpack_seconds: float
    rounds: int
    bytes_sent: int
    bytes_received: int
    plan_cached: bool


def default_topology(world: int) -> "_C.Topology":
    """One node of ``LOCAL_WORLD_SIZE`` ranks (set by torchrun) per node, or a single node."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    per_node = int(local) if local and local.isdigit() and int(local) > 0 else world
    if world % per_node:
        per_node = world
    return _C.Topology(world, per_node)


def _check_kind(kind: str, what: str) -> None:
    if kind not in PLACEMENT_KINDS:
        raise ValueError(f"{what} {kind!r} is not one of {', '.join(PLACEMENT_KINDS)}")


def _check_inputs(tensor_set, src, dst, src_kind: str, dst_kind: str) -> None:
    if not isinstance(tensor_set, _C.TensorSet):
        raise ValueError(f"tensor_set must be a hotswitch.TensorSet, got {type(tensor_set).__name__}")
    for name, layout in (("src", src), ("dst", dst)):
        if not isinstance(layout, _C.Layout):
            raise ValueError(f"{name} must be a hotswitch.Layout, got {type(layout).__name__}")
    _check_kind(src_kind, "src_kind")
    _check_kind(dst_kind, "dst_kind")


def plan_switch(
    tensor_set: "_C.TensorSet",
    src: "_C.Layout",
    dst: "_C.Layout",
    *,
    src_kind: str = "sharded",
    dst_kind: str = "sharded",
    topology: Optional["_C.Topology"] = None,
    policy: str = "balanced",
    cache: Optional["_C.PlanCache"] = None,
    intra_node_bandwidth: float = 0.0,
    inter_node_bandwidth: float = 0.0,
) -> "_C.Plan":
    """The redistribution plan between two placements; cached per (set, src, dst, topology,
    policy, bandwidths).

    No data moves. ``plan.stats`` holds the figures of ``SwitchResult.stats``. ``policy`` is
    ``"balanced"`` (ours) or ``"greedy"`` (a baseline: tensors in order, sender = the
    same-node owner that has sent the least). The balanced policy takes each element from
    the receiver's node when it can and balances the senders' bytes; given both link
    bandwidths (bytes/s one rank sends within its node and to another node, e.g. a
    ``HardwareProfile``'s), it balances their send seconds instead. Raises ``ValueError``
    for bad input.
    """
    _check_inputs(tensor_set, src, dst, src_kind, dst_kind)
    if topology is None:
        topology = _C.Topology(src.world, src.world)
    plan, _ = (_default_cache if cache is None else cache).get(
        tensor_set, src, src_kind, dst, dst_kind, topology, policy, float(intra_node_bandwidth),
        float(inter_node_bandwidth))
    return plan


def _executor(group):
    """The (transport, executor) of ``group``, made on first use."""
    pair = _executors.get(group)
    if pair is None:
        transport = _C.C10dTransport(group)
        pair = (transport, _C.SwitchExecutor(transport))
        _executors[group] = pair
    return pair


def _describe(tensor_set, src, dst, src_kind, dst_kind, extra: List[str]) -> List[str]:
    """One line per thing ranks must agree on; read only when they disagree."""
    lines = [
        f"src layout {src} ({src_kind})",
        f"dst layout {dst} ({dst_kind})",
        f"num_layers {tensor_set.num_layers}",
        f"{len(tensor_set.specs)} tensors",
    ]
    return lines + [repr(spec) for spec in tensor_set.specs] + extra


def _digest(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=7).digest(), "little")


def _comm_device(group) -> torch.device:
    """Where the group's point-to-point traffic lives: the current CUDA device for NCCL."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree(transport, rank: int, world: int, error: Optional[str], key: str,
           describe: Callable[[], List[str]], timeout: float, device: torch.device):
    """All ranks learn whether every rank accepted its input and described the same switch.

    ``key`` sums up the switch in one line (equal keys: equal switches); ``describe()`` gives
    its lines, built only when ranks differ. Raises ValueError on every rank otherwise: first
    for ranks that disagree (naming the first differing line), then for a rank that refused
    its input (with its message).
    """
    header = torch.tensor([0 if error is not None else 1, _digest(key)], dtype=torch.int64)
    peers = [p for p in range(world) if p != rank]
    received = {p: torch.empty(2, dtype=torch.int64, device=device) for p in peers}
    transport.exchange([(p, header.to(device)) for p in peers], [(p, received[p]) for p in peers], timeout)
    received = {p: t.cpu() for p, t in received.items()}
    headers = {rank: header, **received}
    if all(int(h[0]) == 1 and int(h[1]) == int(header[1]) for h in headers.values()):
        return
    text = ("\n".join(describe() if key else []) + "\0" + (error or "")).encode()
    # Second round: text sizes, then the texts.
    size = torch.tensor([len(text)], dtype=torch.int64)
    sizes = {p: torch.empty(1, dtype=torch.int64, device=device) for p in peers}
    transport.exchange([(p, size.to(device)) for p in peers], [(p, sizes[p]) for p in peers], timeout)
    received = {p: int(t.cpu()[0]) for p, t in sizes.items()}
    payload = torch.frombuffer(bytearray(text), dtype=torch.uint8).to(device)
    texts = {p: torch.empty(received[p], dtype=torch.uint8, device=device) for p in peers}
    transport.exchange([(p, payload) for p in peers], [(p, texts[p]) for p in peers], timeout)
    decoded = {p: bytes(texts[p].cpu().tolist()).decode() for p in peers}
    decoded[rank] = text.decode()
    described = {p: decoded[p].split("\0", 1)[0].split("\n") for p in range(world)}
    # Compare the ranks that got far enough to describe their switch; the rest refused it.
    complete = [p for p in range(world) if described[p] != [""]]
    for p in complete[1:]:
        ref, other = described[complete[0]], described[p]
        for i in range(max(len(ref), len(other))):
            a = ref[i] if i < len(ref) else "<nothing>"
            b = other[i] if i < len(other) else "<nothing>"
            if a != b:
                raise ValueError(f"ranks disagree on the switch: rank {complete[0]} has {a!r} "
                                 f"where rank {p} has {b!r}")
    for p in range(world):
        if int(headers[p][0]) == 0:
            raise ValueError(f"switch refused by rank {p}: {decoded[p].split(chr(0), 1)[1]}")
    raise ValueError("ranks disagree on the switch: their summaries differ")


def _flatten_shards(shards: Shards, plan, tensor_set, rank: int, kind: str) -> List[torch.Tensor]:
    expected = plan.src_buffers(rank)
    if kind == "zero":
        if not isinstance(shards, torch.Tensor):
            raise ValueError(f"a zero placement's shards are one flat tensor, got {type(shards).__name__}")
        (_, shape, dtype), = expected
        if tuple(shards.shape) != tuple(shape) or str(shards.dtype) != f"torch.{dtype}":
            raise ValueError(
                f"rank {rank}: zero shard has shape {tuple(shards.shape)} and {shards.dtype}, "
                f"expected {tuple(shape)} and torch.{dtype}")
        return [shards.detach()]
    if not isinstance(shards, dict):
        raise ValueError(f"shards must be a dict of name -> tensor, got {type(shards).__name__}")
    specs = tensor_set.specs  # (a new list of every spec at each access: read once)
    names = [specs[t].name for t, _, _ in expected]
    missing = [n for n in names if n not in shards]
    extra = sorted(set(shards) - set(names))
    if missing or extra:
        raise ValueError(f"rank {rank}: shards under the source layout are {names}; "
                         f"missing {missing}, unexpected {extra}")
    out = []
    for (t, shape, dtype), name in zip(expected, names):
        tensor = shards[name]
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"rank {rank}: shard {name!r} is a {type(tensor).__name__}, expected a tensor")
        if tuple(tensor.shape) != tuple(shape) or str(tensor.dtype) != f"torch.{dtype}":
            raise ValueError(
                f"rank {rank}: shard {name!r} has shape {tuple(tensor.shape)} and {tensor.dtype}, "
                f"expected the local shard shape {tuple(shape)} and torch.{dtype}")
        out.append(tensor.detach())
    return out


def switch(
    shards: Shards,
    tensor_set: "_C.TensorSet",
    src: "_C.Layout",
    dst: "_C.Layout",
    *,
    src_kind: str = "sharded",
    dst_kind: str = "sharded",
    group: Optional[dist.ProcessGroup] = None,
    topology: Optional["_C.Topology"] = None,
    max_buffer_bytes: int = 0,
    timeout: float = DEFAULT_TIMEOUT_S,
    cache: Optional["_C.PlanCache"] = None,
    donate: bool = False,
    intra_node_bandwidth: float = 0.0,
    inter_node_bandwidth: float = 0.0,
) -> SwitchResult:
    """Switches this rank's shards of ``tensor_set`` from layout ``src`` to layout ``dst``.

    Collective: every rank of ``group`` (default: the world) calls it with the same set,
    layouts and kinds. ``shards`` maps each tensor name this rank owns under ``src`` to its
    local shard (the shape from the placement: e.g. ``[out / tp, in]`` for a column split),
    or is one flat tensor for ``src_kind="zero"``. With ``src_kind="partial"`` (gradients
    before data-parallel reduction) the destination receives the sum of all summands.

    ``max_buffer_bytes`` bounds the staging memory of one exchange round per rank (0: none);
    ``timeout`` (seconds, default 300) bounds the whole exchange. With ``donate=True`` the
    memory of the input shards may be reused for the outputs of a later switch of this
    group, once nothing else refers to it: the steady state of switching back and forth
    then allocates nothing. A shard the caller still holds is never overwritten.
    ``intra_node_bandwidth`` and ``inter_node_bandwidth`` (bytes/s, both or neither): balance
    the ranks' send time rather than their bytes (see ``plan_switch``).

    Raises ``ValueError`` on every rank, before any shard data moves, when a rank's input is
    wrong or ranks disagree (the message names the rank and the first difference);
    ``SwitchTimeout`` or ``SwitchFault`` naming the peer when a peer stalls or dies. The
    input shards are never modified, so after any error the caller still holds the old layout;
    after a fault the group itself is usually unusable (as with NCCL) and should be rebuilt.
    """
    if group is None:
        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized; call init_process_group first")
        group = dist.group.WORLD
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given group")
    transport, executor = _executor(group)
    device = _comm_device(group)

    error, key, describe, plan, cached, buffers = None, "", list, None, False, []
    # Every check below runs on every rank and reaches the others through _agree, so that a
    # rank's bad input makes all ranks raise instead of leaving them waiting.
    agree_timeout = timeout
    try:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not (
                0 < timeout <= MAX_TIMEOUT_S):
            agree_timeout = DEFAULT_TIMEOUT_S
            raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT_S:g}] seconds, got {timeout!r}")
        if isinstance(max_buffer_bytes, bool) or not isinstance(max_buffer_bytes, int) or not (
                max_buffer_bytes == 0 or max_buffer_bytes >= MIN_BUFFER_BYTES):
            raise ValueError(f"max_buffer_bytes must be 0 (no bound) or an int >= {MIN_BUFFER_BYTES}, "
                             f"got {max_buffer_bytes!r}")
        _check_inputs(tensor_set, src, dst, src_kind, dst_kind)
        src.validate(world)
        dst.validate(world)
        topology = default_topology(world) if topology is None else topology
        if not isinstance(topology, _C.Topology):
            raise ValueError(f"topology must be a hotswitch.Topology, got {type(topology).__name__}")
        # Ranks must agree on everything that shapes the exchange: the plan's inputs, the
        # memory bound (it decides the rounds) and the device.
        for name, value in (("intra_node_bandwidth", intra_node_bandwidth),
                            ("inter_node_bandwidth", inter_node_bandwidth)):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"{name} must be a number of bytes/s, got {value!r}")
        extra = [f"topology {topology!r}", f"max_buffer_bytes {max_buffer_bytes}", f"device {device.type}",
                 f"link bandwidths {float(intra_node_bandwidth)!r} / {float(inter_node_bandwidth)!r} B/s"]
        key = "|".join([str(tensor_set.fingerprint()), f"{src}:{src_kind}", f"{dst}:{dst_kind}", *extra])
        describe = lambda: _describe(tensor_set, src, dst, src_kind, dst_kind, extra)  # noqa: E731
        plan, cached = (_default_cache if cache is None else cache).get(
            tensor_set, src, src_kind, dst, dst_kind, topology, "balanced", float(intra_node_bandwidth),
            float(inter_node_bandwidth))
        buffers = _flatten_shards(shards, plan, tensor_set, rank, src_kind)
        for i, b in enumerate(buffers):
            if b.device.type != device.type:
                raise ValueError(f"rank {rank}: shard {i} is on {b.device}, but the group communicates on "
                                 f"{device.type}")
    except Exception as e:  # every refusal must reach the other ranks, whatever its type
        error = str(e) if isinstance(e, ValueError) else f"{type(e).__name__}: {e}"
    _agree(transport, rank, world, error, key, describe, agree_timeout, device)

    try:
        new_buffers, info = executor.run(plan, buffers, max_buffer_bytes, float(timeout), str(device))
    except RuntimeError:  # SwitchFault, SwitchTimeout, or a torch error inside the exchange
        # The exchange counters of the ranks may now differ: a later switch of this group
        # starts from a fresh transport. After a fault the group itself is usually broken.
        _executors.pop(group, None)
        raise
    if donate:
        executor.donate(buffers)
    del buffers
    specs = plan.dst_buffers(rank)
    if dst_kind == "zero":
        out: Shards = new_buffers[0]
    else:
        set_specs = tensor_set.specs  # (a new list of every spec at each access: read once)
        out = {set_specs[t].name: buf.view(shape) for (t, shape, _), buf in zip(specs, new_buffers)}
    _log.debug("rank %d: %s -> %s sent %d B in %.3f ms", rank, src, dst, info["bytes_sent"], info["seconds"] * 1e3)
    return SwitchResult(
        shards=out,
        stats=plan.stats,
        seconds=info["seconds"],
        pack_seconds=info["pack_seconds"],
        exchange_seconds=info["exchange_seconds"],
        unpack_seconds=info["unpack_seconds"],
        rounds=info["rounds"],
        bytes_sent=info["bytes_sent"],
        bytes_received=info["bytes_received"],
        plan_cached=cached,
    )

