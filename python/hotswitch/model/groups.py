"""The torch.distributed process groups of a layout."""

from datetime import timedelta
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from hotswitch import _C
from hotswitch.logging import get_logger

__all__ = ["ParallelGroups", "backend_device", "global_ranks"]

_log = get_logger("model")
# (base group, global ranks) -> process group. Every rank makes every group of a layout in
# the same order, so this cache holds the same keys on every rank and layouts that share a
# rank set (the tp pairs of dp2tp2 and tp2pp2, say) share one process group.
_process_groups: Dict[Tuple[object, Tuple[int, ...]], object] = {}


def global_ranks(group) -> List[int]:
    """Global rank of each rank of ``group``, in group-rank order."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    return list(dist.get_process_group_ranks(group))


def backend_device(group) -> torch.device:
    """The device a rank of ``group`` computes on: its current CUDA device under NCCL, else
    the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _new_group(base, ranks: Tuple[int, ...], backend: str, timeout: float):
    key = (base, ranks)
    pg = _process_groups.get(key)
    if pg is None:
        # Collectives of the group give up after `timeout` (a stalled peer raises, never hangs);
        # a group shared by several layouts keeps the timeout it was made with.
        pg = dist.new_group(list(ranks), timeout=timedelta(seconds=timeout))
        if backend == "nccl" and dist.get_rank() in ranks:
            # NCCL sets its communicators up lazily on the first collective; point-to-point
            # batches on a fresh communicator need every member present, so do it here.
            probe = torch.zeros(1, device=torch.device("cuda", torch.cuda.current_device()))
            dist.all_reduce(probe, group=pg)
        _process_groups[key] = pg
    return pg


class ParallelGroups:
    """The process groups of one layout, and where this rank sits in it.

    Axes (docs/architecture.md): ``tp`` ranks split each layer's matrices (and, with sequence
    parallelism, the tokens of the norm regions); ``cp`` ranks split the tokens of every
    sequence of a pack (context parallelism) and hold the same parameters; ``pp`` ranks hold
    consecutive layer stages; ``dp`` ranks are data replicas. The ``data`` group of a rank is
    its dp x cp group: the ranks that hold the same shards, over which gradients are summed
    and ZeRO chunks spread (``data_rank``, the layout's data index, is dp coordinate * cp +
    cp coordinate). ``tied`` joins the first and last pipeline stage of one (dp, tp, cp)
    coordinate, which both hold a tied embedding (only when pp > 1). Every group follows the
    layout's rank order (``Layout.coord``), the order the switch engine places shards by.

    Construction is collective over the default process group: every process builds the
    groups of the same layouts in the same order (``dist.new_group`` requires it). Groups
    are cached by rank set, so building the groups of a layout again costs nothing.
    ``group`` is the process group the layout's ranks index (default: the world).
    ``timeout`` bounds each point-to-point wait of the pipeline, in seconds (collectives
    follow the process group's own timeout).

    Attributes: ``layout``, ``rank`` (this rank in ``group``), ``coord`` (``{"dp", "tp",
    "pp", "cp"}`` indices), ``tp_rank``/``pp_rank``/``dp_rank``/``cp_rank``/``data_rank``,
    ``tp_group``/``pp_group``/``dp_group``/``cp_group``/``data_group``/``tied_group``
    (``None`` when the group has one rank, or, for ``tied``, when this rank holds no tied
    copy), ``tp_ranks``/``pp_ranks``/``dp_ranks``/``cp_ranks``/``data_ranks``/``tied_ranks``
    (global ranks of this rank's groups, by axis index; ``data_ranks`` by data index),
    ``data_order`` (the data index of each member of ``data_group`` in its group-rank order:
    torch orders a group's members by global rank, which differs from the data index when
    dp varies faster than cp), ``backend``, ``device`` (the current CUDA device under NCCL,
    else the CPU) and ``timeout``.
    """

    def __init__(self, layout: "_C.Layout", group: Optional[object] = None, timeout: float = 300.0):
        if not isinstance(layout, _C.Layout):
            raise ValueError(f"layout must be a hotswitch.Layout, got {type(layout).__name__}")
        if not dist.is_initialized():
            raise ValueError("torch.distributed is not initialized; call init_process_group first")
        base = dist.group.WORLD if group is None else group
        world = dist.get_world_size(base)
        rank = dist.get_rank(base)
        if rank < 0:
            raise ValueError("this process is not a member of the given group")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 1e7:
            raise ValueError(f"timeout must be in (0, 1e7] seconds, got {timeout!r}")
        if layout.world != world:
            raise ValueError(f"layout {layout} has dp({layout.dp}) * tp({layout.tp}) * pp({layout.pp}) "
                             f"* cp({layout.cp}) = {layout.world} ranks != world({world}) of the group")
        self.layout = layout
        self.timeout = float(timeout)
        self.rank = rank
        self.world = world
        self.backend = dist.get_backend(base)
        self.device = backend_device(base)
        self.coord = dict(layout.coord(rank))
        self.tp_rank, self.pp_rank, self.dp_rank = self.coord["tp"], self.coord["pp"], self.coord["dp"]
        self.cp_rank = self.coord["cp"]
        self.data_rank = layout.data_index(rank)
        glob = global_ranks(base)
        self.global_rank = glob[rank]

        def build(axis_groups: List[List[int]]):
            mine, ranks = None, [self.global_rank]
            for members in axis_groups:
                g = tuple(glob[r] for r in members)
                if len(g) < 2:
                    continue
                pg = _new_group(base, g, self.backend, self.timeout)
                if rank in members:
                    mine, ranks = pg, list(g)
            return mine, ranks

        self.tp_group, self.tp_ranks = build(layout.groups("tp"))
        self.pp_group, self.pp_ranks = build(layout.groups("pp"))
        self.dp_group, self.dp_ranks = build(layout.groups("dp"))
        self.cp_group, self.cp_ranks = build(layout.groups("cp"))
        data_groups, seen = [], set()
        for r in range(world):
            members = layout.data_group(r)
            if min(members) not in seen:
                seen.add(min(members))
                data_groups.append(members)
        data_groups.sort(key=min)
        self.data_group, self.data_ranks = build(data_groups)
        mine = layout.data_group(rank)
        self.data_order = [mine.index(r) for r in sorted(mine)]
        tied = []
        if layout.pp > 1:
            for d in range(layout.dp):
                for t in range(layout.tp):
                    for c in range(layout.cp):
                        tied.append([layout.rank(dp=d, tp=t, pp=0, cp=c),
                                     layout.rank(dp=d, tp=t, pp=layout.pp - 1, cp=c)])
        self.tied_group, self.tied_ranks = build(tied)
        _log.debug("rank %d: groups of %s: tp %s pp %s dp %s cp %s", rank, layout, self.tp_ranks,
                   self.pp_ranks, self.dp_ranks, self.cp_ranks)

    @property
    def tp(self) -> int:
        return self.layout.tp

    @property
    def pp(self) -> int:
        return self.layout.pp

    @property
    def dp(self) -> int:
        return self.layout.dp

    @property
    def cp(self) -> int:
        return self.layout.cp

    @property
    def data_size(self) -> int:
        return self.layout.dp * self.layout.cp

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.layout.pp - 1

    def __repr__(self) -> str:
        return f"ParallelGroups({self.layout}, rank={self.rank}, coord={self.coord})"
