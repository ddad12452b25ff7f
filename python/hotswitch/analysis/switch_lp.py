"""The send load of a switch as a linear program (PuLP + CBC): the reference the redistribution
plans are judged against.

A redistribution plan (``hotswitch.plan_switch``) takes each element from an owner on the
receiver's node whenever there is one, and balances the largest per-rank send under that
rule (``same_node_first_max_send_bytes``, exact). The program here has no such rule: *any*
rank that holds an element under the source placement may send it. Variables

    x[c, r] >= 0   bytes of demand class c sent by owner r

where a demand class c = (receiver, owner set) gathers the bytes a receiver lacks that
exactly those ranks hold (a receiver's own elements are local copies and cost nothing).
Each class is fully received, ``sum_r x[c, r] = bytes(c)``, and the program minimises the
slowest sender: with bandwidths, its seconds ``intra / intra_bw + inter / inter_bw``; without,
its bytes. ``same_node_first=True`` restores the plans' rule, to check their optima. The program is fractional (any split of a class among its owners); a plan moves
whole elements, which can cost it less than one element per class and sender.

The demand classes are computed here from the placements' pieces (``Placement.pieces``),
independently of the C++ plan generator.
"""

from collections import defaultdict
from typing import Dict, FrozenSet, List, Optional, Sequence, Tuple

import pulp

from hotswitch import _C

__all__ = ["CBC_PATH", "demand_classes", "solve", "plan_send_seconds"]

CBC_PATH = pulp.PULP_CBC_CMD().path  # the CBC binary that PuLP ships

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]


def _pieces_by_tensor(placement, world: int) -> Dict[int, List[Tuple[int, int, Box]]]:
    """tensor -> [(rank, summand, box)] over the world."""
    out = defaultdict(list)
    for rank in range(world):
        for tensor, lo, hi, _buffer, _offset, _strides, summand in placement.pieces(rank):
            out[tensor].append((rank, summand, (tuple(lo), tuple(hi))))
    return out


def _cells(box: Box, sources: Sequence[Tuple[int, Box]]):
    """Splits ``box`` along every source box edge; yields (numel, owners) per cell, owners the
    ranks whose box holds the whole cell."""
    lo, hi = box
    ndim = len(lo)
    overlapping = []
    cuts = [{lo[d], hi[d]} for d in range(ndim)]
    for rank, (slo, shi) in sources:
        olo = [max(lo[d], slo[d]) for d in range(ndim)]
        ohi = [min(hi[d], shi[d]) for d in range(ndim)]
        if any(a >= b for a, b in zip(olo, ohi)):
            continue
        overlapping.append((rank, slo, shi))
        for d in range(ndim):
            cuts[d].update((olo[d], ohi[d]))
    edges = [sorted(c) for c in cuts]
    counts = [len(e) - 1 for e in edges]
    index = [0] * ndim
    while True:
        clo = [edges[d][index[d]] for d in range(ndim)]
        chi = [edges[d][index[d] + 1] for d in range(ndim)]
        numel = 1
        for a, b in zip(clo, chi):
            numel *= b - a
        owners = frozenset(rank for rank, slo, shi in overlapping
                           if all(slo[d] <= clo[d] and chi[d] <= shi[d] for d in range(ndim)))
        yield numel, owners
        d = ndim - 1
        while d >= 0:
            index[d] += 1
            if index[d] < counts[d]:
                break
            index[d] = 0
            d -= 1
        if d < 0:
            return


def demand_classes(tensor_set, src, dst, src_kind: str = "sharded", dst_kind: str = "sharded",
                   memo: Optional[dict] = None) -> Dict[Tuple[int, FrozenSet[int]], int]:
    """Bytes each receiver lacks, by the set of ranks that hold them under the source:
    ``{(receiver, owners): bytes}``. A ``"partial"`` source counts every summand separately.
    ``memo``: a dict kept between calls on the same tensor set, to reuse placements and
    tensors seen before. Raises ValueError when the layouts are over different worlds or the
    destination is partial."""
    if src.world != dst.world:
        raise ValueError(f"src {src.name} (world {src.world}) and dst {dst.name} (world {dst.world}) "
                         "must cover the same world")
    if dst_kind == "partial":
        raise ValueError("dst_kind 'partial' cannot be a destination")
    world = src.world
    elem = [spec.nbytes // spec.numel for spec in tensor_set.specs]
    memo = {} if memo is None else memo

    def pieces(layout, kind):
        key = ("pieces", layout.name, layout.order, kind)
        if key not in memo:
            memo[key] = _pieces_by_tensor(_C.Placement(tensor_set, layout, kind), world)
        return memo[key]

    sources = pieces(src, src_kind)
    targets = pieces(dst, dst_kind)
    # Tensors of identical shape and ownership (the same rule in every layer of one pipeline
    # stage) have identical classes: count one, scale by element size.
    out: Dict[Tuple[int, FrozenSet[int]], int] = defaultdict(int)
    for tensor, dst_pieces in targets.items():
        src_pieces = sources[tensor]
        signature = ("cells", tuple(dst_pieces), tuple(src_pieces))
        counts = memo.get(signature)
        if counts is None:
            counts = defaultdict(int)
            by_summand = defaultdict(list)
            for rank, summand, box in src_pieces:
                by_summand[summand].append((rank, box))
            for receiver, _, box in dst_pieces:
                for owned in by_summand.values():
                    for numel, owners in _cells(box, owned):
                        if not owners:
                            raise RuntimeError(f"no source holds part of {tensor_set.specs[tensor].name}")
                        if receiver not in owners:
                            counts[receiver, owners] += numel
            memo[signature] = counts
        for key, numel in counts.items():
            out[key] += numel * elem[tensor]
    return dict(out)


def solve(tensor_set, src, dst, ranks_per_node: int, *, src_kind: str = "sharded", dst_kind: str = "sharded",
          intra_node_bandwidth: Optional[float] = None, inter_node_bandwidth: Optional[float] = None,
          classes: Optional[Dict[Tuple[int, FrozenSet[int]], int]] = None, same_node_first: bool = False) -> dict:
    """The smallest largest per-rank send of the switch ``src -> dst`` when any owner may send
    (``same_node_first``: only owners on the receiver's node where there are any, the plans'
    rule).

    With both bandwidths (bytes/s) the program minimises the slowest rank's send seconds
    ``intra / intra_node_bandwidth + inter / inter_node_bandwidth``; without, its send bytes.
    ``classes``: ``demand_classes`` already computed. Returns a dict: ``optimum`` (seconds or
    bytes), ``objective`` (``"seconds"`` or ``"bytes"``), ``send_intra_bytes`` and
    ``send_inter_bytes`` per rank of the optimal solution, ``status`` (PuLP's) and
    ``num_classes``. Raises ValueError for a bad topology or bandwidth.
    """
    world = src.world
    if ranks_per_node < 1 or world % ranks_per_node:
        raise ValueError(f"ranks_per_node({ranks_per_node}) must divide world({world})")
    timed = intra_node_bandwidth is not None or inter_node_bandwidth is not None
    if timed and not (intra_node_bandwidth and intra_node_bandwidth > 0
                      and inter_node_bandwidth and inter_node_bandwidth > 0):
        raise ValueError(f"bandwidths must both be > 0 bytes/s, got intra {intra_node_bandwidth}, "
                         f"inter {inter_node_bandwidth}")
    if classes is None:
        classes = demand_classes(tensor_set, src, dst, src_kind, dst_kind)
    send_intra = [0.0] * world
    send_inter = [0.0] * world
    if not classes:
        return {"optimum": 0.0, "objective": "seconds" if timed else "bytes", "send_intra_bytes": send_intra,
                "send_inter_bytes": send_inter, "status": "Optimal", "num_classes": 0}
    # Bytes in units of the largest class and seconds in units of its intra-node time, so CBC
    # sees numbers near 1.
    scale = float(max(classes.values()))
    node = [r // ranks_per_node for r in range(world)]
    unit = scale / intra_node_bandwidth if timed else scale

    def cost(sender: int, receiver: int) -> float:
        if not timed or node[sender] == node[receiver]:
            return 1.0
        return intra_node_bandwidth / inter_node_bandwidth

    prob = pulp.LpProblem("switch_send", pulp.LpMinimize)
    top = pulp.LpVariable("top", lowBound=0)
    x = {}
    load = defaultdict(list)
    ordered = sorted(classes.items(), key=lambda kv: (kv[0][0], sorted(kv[0][1])))
    for c, ((receiver, owners), numel_bytes) in enumerate(ordered):
        near = [r for r in owners if node[r] == node[receiver]]
        if same_node_first and near:
            owners = near
        vars_ = []
        for r in sorted(owners):
            v = pulp.LpVariable(f"x_{c}_{r}", lowBound=0)
            x[c, r, receiver] = v
            vars_.append(v)
            load[r].append(cost(r, receiver) * v)
        prob += pulp.lpSum(vars_) == numel_bytes / scale, f"class_{c}"
    for r, terms in load.items():
        prob += pulp.lpSum(terms) <= top, f"sender_{r}"
    prob += top
    prob.solve(pulp.COIN_CMD(path=CBC_PATH, msg=False))
    status = pulp.LpStatus[prob.status]
    if prob.status != pulp.LpStatusOptimal:
        raise RuntimeError(f"CBC did not solve the switch program {src.name} -> {dst.name}: {status}")
    for (c, r, receiver), v in x.items():
        sent = (v.value() or 0.0) * scale
        if node[r] == node[receiver]:
            send_intra[r] += sent
        else:
            send_inter[r] += sent
    optimum = top.value() * unit
    return {"optimum": optimum, "objective": "seconds" if timed else "bytes", "send_intra_bytes": send_intra,
            "send_inter_bytes": send_inter, "status": status, "num_classes": len(classes)}


def plan_send_seconds(plan, ranks_per_node: int, intra_node_bandwidth: float, inter_node_bandwidth: float) -> float:
    """The slowest rank's send seconds of a plan (``hotswitch.plan_switch``): max over ranks of
    its intra-node bytes / ``intra_node_bandwidth`` + inter-node bytes / ``inter_node_bandwidth``."""
    seconds = defaultdict(float)
    for src, dst, nbytes, _ in plan.messages():
        same = src // ranks_per_node == dst // ranks_per_node
        seconds[src] += nbytes / (intra_node_bandwidth if same else inter_node_bandwidth)
    return max(seconds.values(), default=0.0)
