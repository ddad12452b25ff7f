"""Collectives of the tensor-parallel region, as autograd functions, and the
point-to-point exchange of the pipeline.

Sequence parallelism: between blocks, each of the ``tp`` ranks holds the residual stream of
its contiguous slice of the pack's tokens, ``[T / tp, hidden]``. A block gathers the slices
before its column-parallel matrix (backward: reduce-scatter) and reduce-scatters the
row-parallel matrix's partial sums (backward: all-gather).

Both run as one collective into or out of one tensor, in the tensors' own dtype (bf16
included), on NCCL and on gloo alike (``all_gather_single`` / ``reduce_scatter_single``, or
their older names ``all_gather_into_tensor`` / ``reduce_scatter_tensor``). Under
``torch.compile`` (``torch.compiler.is_compiling()``) they are the functional collectives of
``torch.distributed._functional_collectives`` instead, which Dynamo traces into the graph: a
compiled tensor-parallel layer is one graph, not one broken at every collective, so it can be
captured in a CUDA graph. Each is waited for where it is issued (the tracer inserts the wait,
and inductor's reordering passes are off): the compiled backward runs its collectives and
products one after the other, where the eager one runs them side by side.

``gathered_linear`` joins the gather with the column-parallel matrix product that follows
it, as Megatron-LM's sequence-parallel linear does: only this rank's slice stays for the
backward, which gathers it again while computing the input gradient, and reduce-scatters
that gradient while computing the weight gradient (each collective on NCCL's own stream, or
gloo's thread, beside the product). Given the parameter the weight is (or copies), the weight
gradient accumulates straight into its ``.grad`` (``hotswitch.model.wgrad``).
"""

from datetime import timedelta
from typing import List, Sequence

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn.functional as F

from hotswitch.model import wgrad

__all__ = ["all_reduce", "all_gather_rows", "reduce_scatter_rows", "gather_from_sequence",
           "scatter_to_sequence", "gathered_linear", "exchange"]

# The single-tensor collectives under their current names, else the names they had.
_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
# Their functional forms (a new tensor; traced with its wait), under either name.
_traced_gather = getattr(funcol, "all_gather_single", None) or funcol.all_gather_tensor
_traced_scatter = getattr(funcol, "reduce_scatter_single", None) or funcol.reduce_scatter_tensor


def all_reduce(x: torch.Tensor, group, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Sums ``x`` in place over ``group`` (no-op for ``None``); returns ``x``."""
    if group is not None:
        dist.all_reduce(x, op=op, group=group)
    return x


def all_gather_rows(x: torch.Tensor, group, size: int, async_op: bool = False):
    """``[n, ...]`` on each rank -> ``[size * n, ...]``, the ranks' rows in group-rank order.
    With ``async_op``: ``(rows, work)``, the rows valid once ``work.wait()`` returns (``work``
    None for no group, or under ``torch.compile``, where the traced wait follows at once)."""
    if group is None:
        return (x, None) if async_op else x
    if torch.compiler.is_compiling():
        out = _traced_gather(x.contiguous(), 0, group)
        return (out, None) if async_op else out
    x = x.contiguous()
    out = torch.empty((size * x.shape[0],) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    work = _gather_single(out, x, group=group, async_op=async_op)
    return (out, work) if async_op else out


def reduce_scatter_rows(x: torch.Tensor, group, size: int, index: int, async_op: bool = False):
    """``[size * n, ...]`` summands on each rank -> rows ``[index * n, (index + 1) * n)`` of
    their sum (``index``: this rank's place in ``group``). With ``async_op``: ``(rows,
    work)``, the rows valid once ``work.wait()`` returns (``work`` None for no group, or
    under ``torch.compile``, where the traced wait follows at once)."""
    if group is None:
        return (x, None) if async_op else x
    if torch.compiler.is_compiling():
        out = _traced_scatter(x.contiguous(), "sum", 0, group)
        return (out, None) if async_op else out
    out = torch.empty((x.shape[0] // size,) + tuple(x.shape[1:]), dtype=x.dtype, device=x.device)
    work = _scatter_single(out, x.contiguous(), group=group, async_op=async_op)
    return (out, work) if async_op else out


class _GatherFromSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, size, index):
        ctx.group, ctx.size, ctx.index = group, size, index
        return all_gather_rows(x, group, size)

    @staticmethod
    def backward(ctx, grad):
        return reduce_scatter_rows(grad, ctx.group, ctx.size, ctx.index), None, None, None


class _ScatterToSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, size, index):
        ctx.group, ctx.size = group, size
        return reduce_scatter_rows(x, group, size, index)

    @staticmethod
    def backward(ctx, grad):
        return all_gather_rows(grad, ctx.group, ctx.size), None, None, None


class _GatheredLinear(torch.autograd.Function):
    """``all_gather_rows(x)`` in ``dtype`` (autocast's, or None: ``x``'s own) ``@ weight.T``.

    ``x`` is cast before the gather (the same rows as casting after: a gather copies), and
    only that cast slice stays for the backward (not the gathered rows: a ``tp``-th of the
    bytes). Backward: the gather of the slice again, posted first and run while the input
    gradient ``g @ weight`` is computed; that gradient, cast back to ``x``'s dtype, posted to
    its reduce-scatter and run while the weight gradient ``g.T @ gathered`` is computed. The
    same products of the same operands as ``F.linear``'s backward, so the same gradients.
    ``holder``: ``(main,)``, the parameter whose ``.grad`` the weight gradient accumulates into
    (``wgrad.accumulate_weight_grad``; none is returned for ``weight``), or ``()``."""

    @staticmethod
    def forward(ctx, x, weight, group, size, index, dtype, holder=()):
        ctx.x_dtype = x.dtype
        if dtype is not None:
            x = x.to(dtype)
        ctx.save_for_backward(x, weight)
        ctx.group, ctx.size, ctx.index = group, size, index
        ctx.main = holder[0] if holder else None
        return F.linear(all_gather_rows(x, group, size), weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1] or ctx.main is not None
        gathered = gather = None
        if need_dw:
            gathered, gather = all_gather_rows(x, ctx.group, ctx.size, async_op=True)
        dx = scatter = dw = None
        if need_dx:
            dx = grad.matmul(weight).to(ctx.x_dtype)
        if gather is not None:
            gather.wait()  # before the next collective is posted: one in flight at a time
        if need_dx:
            dx, scatter = reduce_scatter_rows(dx, ctx.group, ctx.size, ctx.index, async_op=True)
        if need_dw and ctx.main is not None:
            wgrad.accumulate_weight_grad(ctx.main, grad, gathered)
        elif need_dw:
            dw = grad.reshape(-1, grad.shape[-1]).t().mm(gathered.reshape(-1, gathered.shape[-1]))
        if scatter is not None:
            scatter.wait()
        return dx, dw, None, None, None, None, None


def gathered_linear(x: torch.Tensor, weight: torch.Tensor, group, size: int, index: int,
                    main=None) -> torch.Tensor:
    """``F.linear(gather_from_sequence(x, ...), weight)``: the whole pack's rows of a
    column-parallel matrix product from this rank's sequence-parallel slice, keeping only
    the slice for the backward, whose collectives run beside its products (``_GatheredLinear``).
    Under autocast the operands are cast to its dtype as ``F.linear`` would cast them (the
    rows before the gather, so it moves the narrower dtype); the input gradient returns, and
    is reduce-scattered, in ``x``'s dtype. ``main``: the parameter ``weight`` is or copies,
    whose ``.grad`` the weight gradient accumulates into (``wgrad.linear``)."""
    if group is None:
        return wgrad.linear(x, weight, main)
    kind, dtype = x.device.type, None
    if torch.is_autocast_enabled(kind):
        dtype = torch.get_autocast_dtype(kind)
        weight = weight.to(dtype)
    holder = (main,) if main is not None and wgrad.fusing(main) else ()
    return _GatheredLinear.apply(x, weight, group, size, index, dtype, holder)


def gather_from_sequence(x: torch.Tensor, group, size: int, index: int) -> torch.Tensor:
    """Sequence-parallel slices ``[T / tp, h]`` -> the whole pack ``[T, h]`` on every TP rank."""
    if group is None:
        return x
    return _GatherFromSequence.apply(x, group, size, index)


def scatter_to_sequence(x: torch.Tensor, group, size: int, index: int) -> torch.Tensor:
    """Partial sums ``[T, h]`` on each TP rank -> this rank's slice ``[T / tp, h]`` of the sum."""
    if group is None:
        return x
    return _ScatterToSequence.apply(x, group, size, index)


def exchange(sends: Sequence, recvs: Sequence, group, timeout: float) -> None:
    """Posts every ``(tensor, peer)`` send and receive (peers are global ranks) as one batch
    and waits for all of them, each for at most ``timeout`` seconds (then ``RuntimeError``).
    Posting both directions together is what keeps the 1F1B schedule free of deadlocks on
    NCCL, whose sends block until the peer receives."""
    ops: List[dist.P2POp] = [dist.P2POp(dist.isend, t, peer, group) for t, peer in sends]
    ops += [dist.P2POp(dist.irecv, t, peer, group) for t, peer in recvs]
    if not ops:
        return
    for work in dist.batch_isend_irecv(ops):
        work.wait(timedelta(seconds=timeout))
