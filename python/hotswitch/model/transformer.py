"""The parallel decoder: this rank's stage of layers, holding only its local shards."""

import functools
import math
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from hotswitch import _C
from hotswitch._checks import check_bool, check_token_counts
from hotswitch.logging import get_logger
from hotswitch.model.attention import PackAttention, select_kernel
from hotswitch.model.batch import MicroBatch, to_device
from hotswitch.model.comm import (all_gather_rows, all_reduce, exchange, gather_from_sequence,
                                  gathered_linear, reduce_scatter_rows, scatter_to_sequence)
from hotswitch.model.config import TransformerConfig
from hotswitch.model.context import ContextAttention, ContextSplit
from hotswitch.model.groups import ParallelGroups
from hotswitch.model.init import init_shards
from hotswitch.model.fused import add_norm, cross_entropy, norm, rotary_qkv, select_fused, swiglu
from hotswitch.model.layers import Shard, rotary_tables, vocab_parallel_embedding
from hotswitch.model.pipeline import StageFunctions, run_1f1b
from hotswitch.model import wgrad

__all__ = ["RECOMPUTE_GRANULARITIES", "LocalRegion", "ParallelTransformer", "TransformerLayer", "PackContext",
           "compute_copy"]

_log = get_logger("model")

# A layer's weights that enter matrix products (and so the compute dtype).
_MATRICES = ("qkv", "proj", "gate_up", "down")
# All of a layer's weights, in its parameters' order.
_LAYER_WEIGHTS = ("input_norm", "qkv", "proj", "post_norm", "gate_up", "down")


def _add_grad_into(param: torch.Tensor, copy: torch.Tensor) -> None:
    """A compute-dtype copy's accumulated gradient -> its parameter's ``.grad`` (as autograd
    accumulates: the first becomes ``.grad``, later ones add in place). Nothing when the
    copy's product added its gradient into ``param.grad`` itself (``hotswitch.model.wgrad``)."""
    if copy.grad is None:
        return
    if param.grad is None:
        # A copy even in the same dtype: a CUDA graph's output is overwritten by its next replay.
        param.grad = copy.grad.to(param.dtype, copy=True)
    else:
        param.grad.add_(copy.grad)
    copy.grad = None


def compute_copy(param: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A leaf copy of ``param`` in ``dtype`` (the compute dtype) for matrix products: once a
    micro-batch's gradient has accumulated into it, that gradient is added into ``param.grad``
    (in ``param``'s dtype) and dropped, as autocast's cast would have passed it back."""
    with torch.no_grad():
        w = param.detach().to(dtype, copy=True)
    w.requires_grad_()
    w.register_post_accumulate_grad_hook(functools.partial(_add_grad_into, param))
    return w


# Megatron-LM's --recompute-granularity, and no recomputation.
RECOMPUTE_GRANULARITIES = ("none", "selective", "full")


def _recomputed(fn, *args):
    """``fn(*args)`` keeping only ``args`` for the backward pass, which reruns ``fn`` first.
    Non-reentrant checkpointing: it nests inside autograd functions and pipeline sends, and
    the rerun restores the forward's autocast state."""
    return torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False)


class PackContext:
    """What every layer needs of one micro-batch under a layout: the pack padded to a
    multiple of ``tp``, or to ``pad_to`` tokens (a graph bucket: the pack then runs the
    layers' captured graphs, ``graphed``, and its attention is static), padding tokens forming
    one extra sequence with no targets, so they attend only to each other; rotary tables of the per-sequence positions, the pack's
    attention (``PackAttention`` for ``kernel``: masks or indices built once, one kernel call
    per layer), and the targets. Built with tensor operations only, whatever the number of
    sequences.

    Under ``cp > 1`` (``cp_gather``: the autograd all-gather over the cp group) this rank
    holds only its part of every sequence (``hotswitch.model.context``): the rows are its
    tokens, padded to the cp group's common row count, a multiple of ``tp``; positions and
    targets are those of each token in its own sequence, and attention is
    ``ContextAttention`` over the gathered keys and values.

    ``tokens``/``targets`` int64 ``[Tp]``, ``weights`` ``[Tp]`` (1 where a token has a
    target, else 0), ``rows = Tp / tp`` (the sequence-parallel slice each TP rank holds).
    ``num_targets`` counts the whole pack's targets (over all cp ranks). ``cos``/``sin``: the
    rotary tables ``[Tp, d / 2]`` in the config's dtype (``rotary`` casts them once per pack).
    """

    def __init__(self, mb: MicroBatch, config: TransformerConfig, tp: int, device: torch.device,
                 kernel: str = "grouped", cp: int = 1, cp_rank: int = 0, cp_gather=None,
                 pad_to: Optional[int] = None):
        n = mb.num_tokens
        self.num_targets = mb.num_targets
        self._rotary: Dict[torch.dtype, Tuple[torch.Tensor, torch.Tensor]] = {}
        # Whether the pack runs the layers' captured graphs (padded to a graph bucket).
        self.graphed = pad_to is not None
        if pad_to is not None and (cp > 1 or isinstance(pad_to, bool) or not isinstance(pad_to, int)
                                   or pad_to < n or pad_to % tp):
            raise ValueError(f"pad_to must be an int >= the pack's {n} tokens and a multiple of tp ({tp}), "
                             f"without context parallelism (cp {cp}); got {pad_to!r}")
        if cp > 1:
            self._init_context(mb, config, tp, device, kernel, cp, cp_rank, cp_gather)
            return
        padded = -(-n // tp) * tp if pad_to is None else pad_to
        cu = mb.cu_seqlens
        if padded > n:
            cu = torch.cat([cu, torch.tensor([padded], dtype=torch.int64)])
        lengths = cu[1:] - cu[:-1]
        self.num_tokens = padded
        self.rows = padded // tp
        tokens = torch.zeros(padded, dtype=torch.int64)
        tokens[:n] = mb.tokens
        positions = torch.arange(padded, dtype=torch.int64) - torch.repeat_interleave(cu[:-1], lengths)
        targets = torch.zeros(padded, dtype=torch.int64)
        targets[:n - 1] = mb.tokens[1:]
        weights = torch.zeros(padded, dtype=torch.float32)
        weights[:n] = 1.0
        weights[mb.cu_seqlens[1:] - 1] = 0.0  # the last token of each sequence
        self.tokens = to_device(tokens, device)
        self.targets = to_device(targets, device)
        self.weights = to_device(weights, device)
        self.cos, self.sin = rotary_tables(to_device(positions, device), config.head_dim, config.rope_theta,
                                           getattr(torch, config.dtype), config.rope_scaling_dict)
        self.attention = PackAttention(cu, kernel, config.num_attention_heads // tp, device, static=self.graphed)

    def rotary(self, dtype: torch.dtype) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` in ``dtype``, cast at the first call and shared by every layer after
        (the PyTorch path of the rotation takes the tables in the activations' dtype)."""
        if self.cos.dtype == dtype:
            return self.cos, self.sin
        tables = self._rotary.get(dtype)
        if tables is None:
            tables = self._rotary[dtype] = (self.cos.to(dtype), self.sin.to(dtype))
        return tables

    def _init_context(self, mb, config, tp, device, kernel, cp, cp_rank, cp_gather) -> None:
        n = mb.num_tokens
        split = ContextSplit(mb.cu_seqlens, cp, cp_rank, multiple=tp)
        rows = split.rows
        index = split.index
        local = index >= 0
        pack_targets = torch.zeros(n, dtype=torch.int64)
        pack_targets[:n - 1] = mb.tokens[1:]
        pack_weights = torch.ones(n, dtype=torch.float32)
        pack_weights[mb.cu_seqlens[1:] - 1] = 0.0
        tokens = torch.zeros(rows, dtype=torch.int64)
        targets = torch.zeros(rows, dtype=torch.int64)
        weights = torch.zeros(rows, dtype=torch.float32)
        tokens[local] = mb.tokens[index[local]]
        targets[local] = pack_targets[index[local]]
        weights[local] = pack_weights[index[local]]
        self.num_tokens = rows
        self.rows = rows // tp
        self.tokens = to_device(tokens, device)
        self.targets = to_device(targets, device)
        self.weights = to_device(weights, device)
        self.cos, self.sin = rotary_tables(to_device(split.positions, device), config.head_dim, config.rope_theta,
                                           getattr(torch, config.dtype), config.rope_scaling_dict)
        self.attention = ContextAttention(split, cp_gather, kernel, config.num_attention_heads // tp, device)


def autocast_runs(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast(device_type, dtype=dtype)`` computes matrix products in
    ``dtype`` here (an autocast that lacks a dtype turns itself off with a warning, or
    raises)."""
    import warnings

    a = torch.ones(2, 2, device=device_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            with torch.autocast(device_type, dtype=dtype):
                return torch.mm(a, a).dtype == dtype
        except RuntimeError:
            return False


class _Region:
    """The tensor-parallel (or, with ``axis="cp"``, context-parallel) group of a stage, for
    the layers' collectives (in the activations' dtype, on NCCL and gloo alike)."""

    def __init__(self, groups: ParallelGroups, axis: str = "tp"):
        self.group = getattr(groups, axis + "_group")
        self.size, self.index = getattr(groups, axis), getattr(groups, axis + "_rank")

    def gather(self, x):
        return gather_from_sequence(x, self.group, self.size, self.index)

    def scatter(self, x):
        return scatter_to_sequence(x, self.group, self.size, self.index)

    def linear(self, x, weight, main=None):
        """``F.linear(self.gather(x), weight)``, keeping only this rank's slice for the backward,
        whose collectives run beside its products (``gathered_linear``); ``main``: the parameter
        whose ``.grad`` the weight gradient accumulates into."""
        return gathered_linear(x, weight, self.group, self.size, self.index, main)


class LocalRegion(_Region):
    """A layer's region without a group: every collective is the identity (as for a group of
    one), so a rank's shard layer computes alone (as a benchmark times tp shard shapes on one
    device)."""

    def __init__(self):
        self.group, self.size, self.index = None, 1, 0


def _pair_of(layer: "TransformerLayer", x, delta, ctx, region):
    return layer.forward_pair(x, delta, ctx, region, kernels="torch")


_graphed: Dict[str, Callable] = {}

# Dynamo's recompile limit while models compile their layers: every layout's layers share one
# compiled function (forward_pair's, graphed_pair's), and each layout adds its own variants of
# it (its groups and shard shapes, the first layer and the others, each recomputation), so a
# few layouts pass Dynamo's default of 8, after which the rest runs uncompiled.
RECOMPILE_LIMIT = 64


def _allow_recompiles() -> None:
    """Raises Dynamo's recompile limit to ``RECOMPILE_LIMIT`` (never lowers it)."""
    import torch._dynamo

    config = torch._dynamo.config
    name = "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit"
    if getattr(config, name) < RECOMPILE_LIMIT:
        _log.info("torch._dynamo.config.%s raised from %d to %d: every layout's layers share one compiled "
                  "function", name, getattr(config, name), RECOMPILE_LIMIT)
        setattr(config, name, RECOMPILE_LIMIT)


def graphed_pair(device: torch.device) -> Callable:
    """``f(layer, x, delta, ctx, region) = layer.forward_pair(x, delta, ctx, region)`` over the
    PyTorch path of the fused steps, through ``torch.compile(dynamic=True)``, for layers on
    ``device``: on a CUDA device with CUDA graphs (``mode="reduce-overhead"``): one compiled
    graph for every layer and pack, and one captured graph per layer and distinct input shape,
    replayed with a launch or two instead of the layer's kernels. Packs padded to a few token
    counts (``PackContext(pad_to=...)``) so take a few shapes. On the CPU the same compiled
    graph runs without capture. Built once per process and device type; a function of its own,
    so that its compiled code does not share ``compile_pair``'s cache."""
    mode = "reduce-overhead" if torch.device(device).type == "cuda" else "default"
    if mode not in _graphed:
        _graphed[mode] = torch.compile(_pair_of, dynamic=True, mode=mode)
    return _graphed[mode]


class TransformerLayer(nn.Module):
    """One decoder layer's local shards and forward.

    ``x`` ``[Tp / tp, hidden]`` (the sequence-parallel slice) -> same shape:
    ``x + proj(attention(qkv(norm(x))))``, then ``x + down(silu(gate) * up)`` of the norm.
    ``qkv`` and ``gate_up`` are column-parallel (this rank's heads and FFN columns), ``proj``
    and ``down`` row-parallel. With ``recompute_attention`` (selective recomputation) the
    attention core keeps only q, k and v for the backward pass and reruns in it.
    """

    def __init__(self, config: TransformerConfig, tp: int, shards: Dict[str, torch.Tensor], prefix: str):
        super().__init__()
        for part in ("input_norm", "qkv", "proj", "post_norm", "gate_up", "down"):
            setattr(self, part, Shard(shards[prefix + part + ".weight"]))
        self.eps = config.norm_eps
        self.head_dim = config.head_dim
        self.heads = config.num_attention_heads // tp
        self.kv_heads = config.num_query_groups // tp
        self.compute_dtype = getattr(torch, config.compute_dtype or config.dtype)
        self.recompute_attention = False
        self.kernels = "torch"
        # Weight gradients of the matrices accumulate into the parameters' .grad in the
        # products' backward (hotswitch.model.wgrad); eager calls only.
        self.fuse_wgrad = True
        # The matrix weights in the compute dtype for the current call (see ParallelTransformer).
        self.compute_weights: Dict[str, torch.Tensor] = {}
        # What the model calls for forward_pair: the method, or its compiled form (compile_pair).
        self.run_pair = self.forward_pair
        # What it calls for a pack padded to a graph bucket (PackContext.graphed): graphed_pair.
        self.run_graphed = functools.partial(graphed_pair(shards[prefix + "qkv.weight"].device), self)

    def compile_pair(self) -> None:
        """``run_pair`` becomes ``torch.compile(forward_pair, dynamic=True)``, over the PyTorch
        path of the fused steps, which inductor fuses itself (``compile_layers``)."""
        self.kernels = "torch"
        self.run_pair = torch.compile(self.forward_pair, dynamic=True)

    def use_compute_copies(self) -> None:
        """Computes with fresh compute-dtype copies of the matrix weights (``compute_copy``:
        their gradients reach the parameters' ``.grad``) until ``compute_weights`` is emptied,
        instead of autocast's cast of every weight at every call. A no-op when the parameters
        are in the compute dtype already. ``ParallelTransformer`` keeps its own copies between
        calls; this is for a layer run by itself."""
        self.compute_weights = {part: compute_copy(getattr(self, part).weight, self.compute_dtype)
                                for part in _MATRICES if getattr(self, part).weight.dtype != self.compute_dtype}

    def weight(self, part: str) -> torch.Tensor:
        """The weight of ``part`` to compute with: its copy during a call that made one (a
        matrix's in the compute dtype; under graph buckets every weight's), else the
        parameter."""
        copy = self.compute_weights.get(part)
        return copy if copy is not None else getattr(self, part).weight

    def main(self, part: str) -> Optional[torch.Tensor]:
        """The parameter of matrix ``part`` whose ``.grad`` its weight gradient accumulates into
        in the product's backward (``hotswitch.model.wgrad``), or None (``fuse_wgrad`` off, or
        compiling: autograd's product and accumulation)."""
        if torch.compiler.is_compiling() or not self.fuse_wgrad:
            return None
        return getattr(self, part).weight

    def forward(self, x: torch.Tensor, ctx: PackContext, region: _Region) -> torch.Tensor:
        """The layer's output ``x + attention block + MLP block`` (``forward_pair``, summed)."""
        x, delta = self.forward_pair(x, None, ctx, region)
        return x + delta

    def forward_pair(self, x: torch.Tensor, delta: Optional[torch.Tensor], ctx: PackContext,
                     region: _Region, kernels: Optional[str] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """The layer on the residual stream ``x + delta`` (``delta``: the previous layer's MLP
        output, not yet added, or None), returning its own pair ``(x', delta')`` whose sum is
        the layer's output. The residual sum is left to the next norm, which adds it in the
        same kernel (``add_norm``) and takes the sum's gradient in its own backward: no add,
        no gradient accumulation and no cast of the MLP output's gradient between layers.
        ``kernels``: the fused steps' path for this call (default the layer's ``kernels``)."""
        d, hq, hkv = self.head_dim, self.heads, self.kv_heads
        # The norms' outputs enter the matrix products (and the TP all-gather) in the compute dtype.
        kernels, dtype = kernels or self.kernels, self.compute_dtype
        if delta is None:
            h = norm(x, self.weight("input_norm"), self.eps, dtype, kernels)
        else:
            x, h = add_norm(x, delta, self.weight("input_norm"), self.eps, dtype, kernels)
        qkv = region.linear(h, self.weight("qkv"), self.main("qkv"))
        # The fused kernel rounds the fp32 tables to qkv's dtype itself, as the PyTorch path's cast does.
        cos, sin = (ctx.cos, ctx.sin) if kernels == "triton" else ctx.rotary(qkv.dtype)
        q, k, v = rotary_qkv(qkv, cos, sin, hq, hkv, kernels)
        if self.recompute_attention and torch.is_grad_enabled():
            o = _recomputed(ctx.attention, q, k, v)
        else:
            o = ctx.attention(q, k, v)
        o = o.reshape(-1, hq * d)
        x, h = add_norm(x, region.scatter(wgrad.linear(o, self.weight("proj"), self.main("proj"))),
                        self.weight("post_norm"), self.eps, dtype, kernels)
        a = swiglu(region.linear(h, self.weight("gate_up"), self.main("gate_up")), kernels)
        return x, region.scatter(wgrad.linear(a, self.weight("down"), self.main("down")))


class ParallelTransformer(nn.Module):
    """This rank's part of a LLaMA-style decoder under ``layout``.

    The parameters are exactly this rank's local shards of ``config.tensor_set()`` under
    the layout's ``"sharded"`` placement (so ``hs.switch`` moves them), named as in the
    tensor set: ``embedding.weight`` (first stage, and the last one too when tied),
    ``layers.{i}.*`` of this stage's layers, ``final_norm.weight`` and ``head.weight`` (last
    stage). Without ``shards`` they are initialised from ``(seed, name, element index)``,
    the same logical weights under every layout; with ``shards`` (``name -> tensor`` of the
    local shard shapes, config dtype, on ``groups.device``) the tensors become the
    parameters without a copy.

    Under tp > 1 the norm regions run sequence-parallel: each TP rank holds
    ``Tp / tp`` rows of the residual stream of a pack padded to ``Tp`` tokens.

    With ``config.compute_dtype`` (bfloat16 or float16 over float32 parameters) the stage's
    forward runs under ``torch.autocast`` on the model's device: matrix products and attention
    in 16 bits; parameters, their gradients, the residual stream, the norms and the loss in
    fp32. A compute dtype this device's autocast lacks
    raises ``ValueError``.

    ``attention``: the attention kernel (``hotswitch.model.attention.KERNELS``); default the
    best that runs on this device and compute dtype (``select_kernel``, logged once).

    ``kernels``: the layers' fused norm, rotary and SwiGLU steps (``hotswitch.model.fused``):
    ``"torch"`` or ``"triton"``; default Triton on CUDA when installed, else PyTorch.

    ``compile_layers``: regional compilation, as torchtitan compiles each block: every layer's
    ``forward_pair`` runs through ``torch.compile(..., dynamic=True)``, one graph (per variant:
    the first layer, the others) serving every layer of the stage and every pack size, so
    inductor fuses the element-wise steps, casts and residual sums itself and a layer's
    forward and backward each run as one compiled call. The fused steps then take the PyTorch
    path (``kernels`` must be None or ``"torch"``). At tp > 1 the collectives are traced as
    functional collectives (``comm``), so the layer stays one graph; each is waited for where
    it is issued (the eager backward's overlap with its products is not kept). The first call
    compiles (tens of seconds); a new layout compiles its own shapes, and since every layout's
    layers share one compiled function, building a model that compiles raises Dynamo's
    recompile limit to at least ``RECOMPILE_LIMIT`` (8 by default: a few layouts times the
    variants of a layer would pass it, and the rest would run uncompiled).

    ``graph_buckets``: token counts at which the layers run from CUDA graphs (layouts of one
    stage without context parallelism: pp and cp 1; at tp > 1 each bucket a multiple of tp, so
    a padded pack cuts into equal sequence-parallel slices, and the layer's collectives, traced
    as functional collectives, are captured with it). A micro-batch given a bucket
    (``forward_backward``'s ``graph_tokens``; by default the smallest bucket that holds it) is
    padded to it, and its layers run through ``graphed_pair``: compiled, and on a CUDA device
    captured once per layer and shape and replayed, so a layer's forward and backward cost a
    graph launch instead of a launch per kernel, at the price of the padding's work. The planner weighs
    the two per micro-batch (``CostOptions.graph_buckets``). A pack whose attention would run
    ``grouped`` (the mask kernels over their bound, on the CPU) runs as it is. Every weight of
    a layer then computes through a kept copy (``_make_compute_copies``), refreshed in place and
    never freed, so the graphs read it at the address they captured and no gradient aliases a
    graph's output. Under ``recompute="full"`` every pack runs unpadded. The graphed layers'
    fused steps take the PyTorch path, which inductor fuses; the rest runs ``kernels``.

    ``fuse_wgrad`` (settable; default True): the weight gradients of the layers' four
    matrices and of the loss head (not a tied head on the embedding's stage) accumulate into
    their parameters' ``.grad`` in the products' backward (``hotswitch.model.wgrad``) instead
    of autograd's product and accumulation; eager calls only (compiled and graphed layers
    compute them as autograd does). Gradient hooks a caller registers on those parameters
    (``register_hook``, ``register_post_accumulate_grad_hook``) then do not fire for them.

    ``recompute`` (settable between steps): activation recomputation, Megatron-LM's
    ``--recompute-granularity``. ``"none"``; ``"selective"``: each layer's attention core
    (softmax(QK^T)V) reruns in the backward pass instead of keeping its activations;
    ``"full"``: only the input of every chunk of ``recompute_num_layers`` consecutive layers
    is kept and the chunk's forward reruns in the backward pass (``--recompute-method
    uniform``). Gradients are the same as without; only memory and time change.

    Raises ``ValueError`` (before any collective) when the config does not fit the layout,
    ``groups`` belong to another layout, ``shards`` do not match the placement, or the
    attention kernel does not run here.
    """

    def __init__(self, config: TransformerConfig, layout: "_C.Layout", groups: ParallelGroups,
                 seed: int = 0, shards: Optional[Dict[str, torch.Tensor]] = None,
                 attention: Optional[str] = None, recompute: str = "none", recompute_num_layers: int = 1,
                 kernels: Optional[str] = None, compile_layers: bool = False,
                 graph_buckets: Optional[Sequence[int]] = None):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config must be a hotswitch.TransformerConfig, got {type(config).__name__}")
        config.validate(layout)
        if recompute not in RECOMPUTE_GRANULARITIES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_GRANULARITIES)}, got {recompute!r}")
        if isinstance(recompute_num_layers, bool) or not isinstance(recompute_num_layers, int) or \
                recompute_num_layers < 1:
            raise ValueError(f"recompute_num_layers must be an int >= 1, got {recompute_num_layers!r}")
        if not isinstance(groups, ParallelGroups):
            raise ValueError(f"groups must be hotswitch.ParallelGroups, got {type(groups).__name__}")
        if groups.layout != layout:
            raise ValueError(f"groups are of layout {groups.layout}, not {layout}")
        self.config = config
        self.layout = layout
        self.groups = groups
        self.tensor_set = config.tensor_set()
        self.device = groups.device
        self.dtype = getattr(torch, config.dtype)
        self.compute_dtype = getattr(torch, config.compute_dtype or config.dtype)
        if self.compute_dtype != self.dtype and not autocast_runs(self.device.type, self.compute_dtype):
            raise ValueError(f"compute_dtype {config.compute_dtype!r}: torch {torch.__version__} has no "
                             f"{config.compute_dtype} autocast on {self.device.type}; use bfloat16 or another device")
        self.attention_kernel = select_kernel(self.device, self.compute_dtype, config.head_dim, attention)
        if not isinstance(compile_layers, bool):
            raise ValueError(f"compile_layers must be a bool, got {compile_layers!r}")
        if compile_layers and kernels not in (None, "torch"):
            raise ValueError(f"compile_layers=True compiles the layers' element-wise steps itself; kernels must be "
                             f"None or 'torch', got {kernels!r}")
        self.graph_buckets = self._check_buckets(graph_buckets, config, layout)
        self.compile_layers = compile_layers
        if compile_layers or self.graph_buckets:
            _allow_recompiles()
        self._fuse_wgrad = True
        self.kernels = "torch" if compile_layers else select_fused(self.device, kernels)
        placement = _C.Placement(self.tensor_set, layout, "sharded")
        specs = self.tensor_set.specs
        self._expected = {specs[t].name: tuple(shape) for t, shape, _ in placement.buffers(groups.rank)}
        if shards is None:
            shards = init_shards(config, layout, groups.rank, seed, self.device)
        else:
            self._check_shards(shards)
        per_stage = config.num_layers // layout.pp
        first_layer = groups.pp_rank * per_stage
        self.layer_ids = list(range(first_layer, first_layer + per_stage))
        if "embedding.weight" in self._expected:
            self.embedding = Shard(shards["embedding.weight"])
        self.layers = nn.ModuleDict({str(i): TransformerLayer(config, layout.tp, shards, f"layers.{i}.")
                                     for i in self.layer_ids})
        for layer in self.layers.values():
            layer.kernels = self.kernels
            if compile_layers:
                layer.compile_pair()
        if groups.is_last_stage:
            self.final_norm = Shard(shards["final_norm.weight"])
            if not config.tied_embedding:
                self.head = Shard(shards["head.weight"])
        self.vocab_start = groups.tp_rank * (config.vocab_size // layout.tp)
        self._region = _Region(groups)
        self._context = _Region(groups, "cp")
        names = list(self._expected)
        params = dict(self.named_parameters())
        if sorted(params) != sorted(names):
            raise RuntimeError(f"model parameters {sorted(params)} differ from the placement's {sorted(names)}")
        # Norm weights see only this rank's token slice under sequence parallelism: their
        # gradients are partial over the TP group until finish_gradients sums them.
        self._tp_partial = [n for n in names if n.endswith("norm.weight")] if layout.tp > 1 else []
        self._finished: Dict[str, torch.Tensor] = {}
        self._pending = False
        # Compute-dtype copies of the matrix weights (_make_compute_copies).
        self._copy_weights = True
        self._head_copy: Optional[torch.Tensor] = None
        # name -> (the data cast from, its version, the copy), kept between calls.
        self._copies: Dict[str, Tuple[torch.Tensor, int, torch.Tensor]] = {}
        self._warned_grouped = False
        self.recompute_num_layers = recompute_num_layers
        self.recompute = recompute

    @staticmethod
    def _check_buckets(buckets, config, layout) -> Tuple[int, ...]:
        if buckets is None:
            return ()
        check_token_counts("graph_buckets", buckets, config.max_position_embeddings, "max_position_embeddings")
        if layout.pp != 1 or layout.cp != 1:
            raise ValueError(f"graph_buckets: layers run from CUDA graphs only on one stage without context "
                             f"parallelism (pp and cp 1), got layout {layout}")
        odd = [b for b in buckets if b % layout.tp]
        if odd:
            raise ValueError(f"graph_buckets must be multiples of tp ({layout.tp}) under layout {layout}, so that "
                             f"a padded pack cuts into equal sequence-parallel slices; got {odd[0]!r} in "
                             f"{list(buckets)!r}")
        return tuple(sorted(buckets))

    def graph_tokens(self, micro_batches: Sequence[MicroBatch]) -> List[int]:
        """Per micro-batch, the graph bucket it runs padded to by default: the smallest that
        holds its tokens, or 0 (no bucket holds it, or no graph buckets: it runs as it is)."""
        return [next((b for b in self.graph_buckets if b >= mb.num_tokens), 0) for mb in micro_batches]

    def runs_graphed(self, tokens: int, recompute: Optional[str] = None) -> bool:
        """Whether a micro-batch given the graph bucket ``tokens`` runs from the graphs: a
        bucket of this model, not under full recomputation (``recompute``, default the model's),
        and its attention static at that size (``PackAttention.runs_static``); else it runs as
        it is."""
        heads = self.config.num_attention_heads // self.layout.tp
        return (tokens in self.graph_buckets and (recompute or self._recompute) != "full" and
                PackAttention.runs_static(self.attention_kernel, heads, tokens, self.device))

    @property
    def fuse_wgrad(self) -> bool:
        """Whether weight gradients accumulate in the products' backward (see the class)."""
        return self._fuse_wgrad

    @fuse_wgrad.setter
    def fuse_wgrad(self, value: bool) -> None:
        check_bool("fuse_wgrad", value)
        self._fuse_wgrad = value
        for layer in self.layers.values():
            layer.fuse_wgrad = value

    @property
    def recompute(self) -> str:
        """``"none"``, ``"selective"`` or ``"full"`` (see the class)."""
        return self._recompute

    @recompute.setter
    def recompute(self, value: str) -> None:
        if value not in RECOMPUTE_GRANULARITIES:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE_GRANULARITIES)}, got {value!r}")
        self._recompute = value
        for layer in self.layers.values():
            layer.recompute_attention = value == "selective"

    # ------------------------------------------------------------------ shards
    def _check_shards(self, shards) -> None:
        if not isinstance(shards, dict):
            raise ValueError(f"shards must be a dict of name -> tensor, got {type(shards).__name__}")
        missing = [n for n in self._expected if n not in shards]
        extra = sorted(set(shards) - set(self._expected))
        if missing or extra:
            raise ValueError(f"rank {self.groups.rank}: shards under {self.layout} are {list(self._expected)}; "
                             f"missing {missing}, unexpected {extra}")
        for name, shape in self._expected.items():
            t = shards[name]
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"shard {name!r} is a {type(t).__name__}, expected a tensor")
            if tuple(t.shape) != shape or t.dtype != self.dtype or t.device != self.device:
                raise ValueError(f"rank {self.groups.rank}: shard {name!r} is {tuple(t.shape)} {t.dtype} on "
                                 f"{t.device}, expected the local shard shape {shape} {self.dtype} on "
                                 f"{self.device}")

    def named_shards(self) -> Dict[str, nn.Parameter]:
        """``name -> local shard`` (the parameters themselves), in the tensor set's order:
        the input of ``hs.switch``."""
        params = dict(self.named_parameters())
        return {name: params[name] for name in self._expected}

    def load_shards(self, shards: Dict[str, torch.Tensor]) -> None:
        """Makes ``shards`` (``name -> tensor`` with this layout's local shard shapes, e.g. the
        result of a switch) the parameters' data, without a copy. Checks every shard first,
        so a ``ValueError`` changes nothing. Gradients are left as they are."""
        self._check_shards(shards)
        self._forget_copy_sources()
        params = self.named_shards()
        with torch.no_grad():
            for name, p in params.items():
                p.data = shards[name].detach()

    def grad_shards(self) -> Dict[str, torch.Tensor]:
        """``name -> accumulated gradient`` (local shard shapes; zeros where nothing
        accumulated). Finishes pending tensor-parallel sums first (collective over the TP
        group, see ``finish_gradients``), so the result is a ``"partial"`` placement over
        the data replicas (and the stages holding a tied embedding)."""
        self.finish_gradients()
        return {name: p.grad if p.grad is not None else torch.zeros_like(p)
                for name, p in self.named_shards().items()}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops all accumulated gradients (always set to ``None``; the argument exists for
        ``nn.Module`` compatibility)."""
        super().zero_grad(set_to_none=True)
        self._finished.clear()
        self._pending = False

    # ------------------------------------------------------------------ execution
    def _stage_forward(self, ctx: PackContext, x: Optional[torch.Tensor]) -> torch.Tensor:
        """The stage's activation ``[Tp / tp, hidden]``, or on the last stage the summed loss
        of the pack's target tokens (a float32 scalar)."""
        if self.compute_dtype != self.dtype:
            with torch.autocast(self.device.type, dtype=self.compute_dtype):
                return self._stage_forward_in_dtype(ctx, x)
        return self._stage_forward_in_dtype(ctx, x)

    def _stage_forward_in_dtype(self, ctx: PackContext, x: Optional[torch.Tensor]) -> torch.Tensor:
        g, cfg = self.groups, self.config
        if g.is_first_stage:
            x = self._region.scatter(vocab_parallel_embedding(ctx.tokens, self.embedding.weight, self.vocab_start))
        delta = None  # the last layer's MLP output, added by the next norm
        if self._recompute == "full" and torch.is_grad_enabled():
            for start in range(0, len(self.layer_ids), self.recompute_num_layers):
                chunk = [self.layers[str(i)] for i in self.layer_ids[start:start + self.recompute_num_layers]]
                if delta is None:
                    x, delta = _recomputed(lambda y, chunk=chunk: self._run_layers(chunk, y, None, ctx), x)
                else:
                    x, delta = _recomputed(lambda y, e, chunk=chunk: self._run_layers(chunk, y, e, ctx), x, delta)
        else:
            x, delta = self._run_layers([self.layers[str(i)] for i in self.layer_ids], x, None, ctx)
        if not g.is_last_stage:
            return x if delta is None else x + delta  # what the next stage receives
        if delta is None:
            h = norm(x, self.final_norm.weight, cfg.norm_eps, x.dtype, self.kernels)
        else:
            h = add_norm(x, delta, self.final_norm.weight, cfg.norm_eps, x.dtype, self.kernels)[1]
        main = self.embedding.weight if cfg.tied_embedding else self.head.weight
        head = self._head_copy if self._head_copy is not None else main
        # Its weight gradient accumulates into the parameter's .grad in the product's backward
        # (hotswitch.model.wgrad), as the layers' matrices do; but a tied head on the
        # embedding's own stage leaves it to autograd, which sums it with the lookup's before
        # accumulating (the same sums, bit for bit, as without fusion).
        fuse = self.fuse_wgrad and not (cfg.tied_embedding and g.is_first_stage)
        losses = cross_entropy(self._region.linear(h, head, main if fuse else None), ctx.targets,
                               self.vocab_start, g.tp_group, self.kernels)
        return (losses * ctx.weights).sum()

    def _make_compute_copies(self) -> None:
        """The matrix weights of this stage (the layers' and the head's) in the compute dtype
        for the call, instead of autocast's cast at every micro-batch. Each copy is a leaf whose
        gradient, once accumulated for a micro-batch, is added into its fp32 parameter's
        ``.grad`` and dropped: the same sums, bit for bit, as autocast's cast and its backward,
        without the two casts per weight and micro-batch.

        The copies are kept between calls and cast again, in place, only for a parameter that
        changed since: an in-place update (the optimizer's step, ``copy_``) moves its version
        counter, and new data (``load_shards``) is new. So a step of several calls casts once,
        after the update. A kept copy holds on to the data it was cast from, so no new tensor
        can take that address while it is kept. A no-op when the compute dtype is the
        parameters', except under graph buckets: then every weight of every layer computes
        through a copy (the norms' in their own dtype), whose address never changes."""
        graphs = bool(self.graph_buckets)
        if not graphs and (self.compute_dtype == self.dtype or not self._copy_weights):
            return

        def copy(key: str, p: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
            kept = self._copies.get(key)
            if kept is not None:
                source, version, w = kept
                w.grad = None  # nothing of a call that failed half-way
                if source is not None and source.data_ptr() == p.data_ptr() and version == p._version:
                    return w
                if w.shape == p.shape:
                    with torch.no_grad():
                        w.copy_(p)
                    self._copies[key] = (p.detach(), p._version, w)
                    return w
            w = compute_copy(p, dtype)
            if graphs and w.is_cuda:
                # Not a guard (one compiled graph serves every layer): the captured graphs read it in place.
                torch._dynamo.mark_static_address(w, guard=False)
            self._copies[key] = (p.detach(), p._version, w)
            return w

        for i, layer in self.layers.items():
            weights = {}
            for part in _LAYER_WEIGHTS if graphs else _MATRICES:
                p = getattr(layer, part).weight
                weights[part] = copy(f"{i}.{part}", p, self.compute_dtype if part in _MATRICES else p.dtype)
            layer.compute_weights = weights
        # A tied head on the embedding's own stage stays with autocast: there its gradient must
        # join the lookup's before accumulating, as autograd sums them, to stay bitwise alike.
        if self.compute_dtype != self.dtype and self._copy_weights and self.groups.is_last_stage and \
                not (self.config.tied_embedding and self.groups.is_first_stage):
            head = self.embedding.weight if self.config.tied_embedding else self.head.weight
            self._head_copy = copy("head", head, self.compute_dtype)

    def _end_compute_copies(self, failed: bool) -> None:
        """After a call: the layers compute with the parameters again (autocast) until the next
        call; the copies are kept for it, to be cast again if the call failed."""
        for layer in self.layers.values():
            layer.compute_weights = {}
        self._head_copy = None
        if failed:
            self._forget_copy_sources()

    def _forget_copy_sources(self) -> None:
        """The kept copies stay, but each is cast again, in place, at its next use; the data
        they were cast from is no longer held."""
        self._copies = {k: (None, -1, w) for k, (_, _, w) in self._copies.items()}

    def drop_compute_copies(self) -> None:
        """Frees the kept compute-dtype copies of the matrix weights (and the reference they
        hold to the data they were cast from); the next call casts afresh. Under graph buckets
        the copies stay, since the captured graphs read them at their addresses: only the
        reference to their source is dropped."""
        self._end_compute_copies(failed=True)
        if not self.graph_buckets:
            self._copies.clear()

    def _run_layers(self, layers, x: torch.Tensor, delta: Optional[torch.Tensor], ctx: PackContext):
        """``layers`` on the residual stream ``x + delta``; returns the last one's pair."""
        for layer in layers:
            run = layer.run_graphed if ctx.graphed else layer.run_pair
            x, delta = run(x, delta, ctx, self._region)
        return x, delta

    def _contexts(self, micro_batches, kernel: str, graph_tokens: Optional[Sequence[int]] = None):
        g = self.groups
        pads = graph_tokens if graph_tokens is not None else [0] * len(micro_batches)
        # A pack whose attention runs grouped (one call per distinct length: no static shapes)
        # runs as it is.
        heads = self.config.num_attention_heads // self.layout.tp
        static = [not pad or PackAttention.runs_static(kernel, heads, pad, self.device) for pad in pads]
        if not all(static) and not self._warned_grouped:
            self._warned_grouped = True
            _log.warning("%s attention runs packs of %d tokens grouped by length (over the mask kernels' bound), "
                         "which has no static shapes: such packs run as they are, not from the graphs their plan "
                         "gave them", kernel, min(p for p, ok in zip(pads, static) if not ok))
        pads = [pad if ok else 0 for pad, ok in zip(pads, static)]
        contexts = [PackContext(mb, self.config, self.layout.tp, self.device, kernel, cp=self.layout.cp,
                                cp_rank=g.cp_rank, cp_gather=self._context.gather, pad_to=pad or None)
                    for mb, pad in zip(micro_batches, pads)]
        for ctx in contexts:
            # What the attention caches at its first call is built here, before any layer runs, so
            # that no call has a side effect: a recomputed call must save what the first one
            # saved, and a compiled layer must not build it in one graph and not in the next.
            ctx.attention.prepare(self.compute_dtype)
            if ctx.graphed or self.compile_layers:
                ctx.rotary(self.compute_dtype)
        return contexts

    def _check_graph_tokens(self, micro_batches, graph_tokens) -> List[int]:
        """``forward_backward``'s ``graph_tokens``, checked; the default where None; all 0
        under full recomputation."""
        if graph_tokens is None:
            tokens = self.graph_tokens(micro_batches)
        else:
            if not isinstance(graph_tokens, (list, tuple)) or len(graph_tokens) != len(micro_batches):
                raise ValueError(f"graph_tokens must be a list of one int per micro-batch ({len(micro_batches)}), "
                                 f"got {graph_tokens!r}")
            for i, (mb, b) in enumerate(zip(micro_batches, graph_tokens)):
                if isinstance(b, bool) or not isinstance(b, int) or (
                        b != 0 and (b not in self.graph_buckets or b < mb.num_tokens)):
                    raise ValueError(f"graph_tokens[{i}] must be 0 or one of the graph buckets "
                                     f"{list(self.graph_buckets)} holding the micro-batch's {mb.num_tokens} "
                                     f"tokens, got {b!r}")
            tokens = [int(b) for b in graph_tokens]
        return [0] * len(tokens) if self._recompute == "full" else tokens

    def _replica_loss(self, loss_sum: torch.Tensor) -> torch.Tensor:
        """The last stage's loss of this cp rank's tokens -> the replica's loss, on every
        stage and cp rank: broadcast from the last stage, summed over the cp group."""
        g = self.groups
        loss_sum = loss_sum.reshape(1)
        if g.pp_group is not None:
            dist.broadcast(loss_sum, src=g.pp_ranks[-1], group=g.pp_group)
        return all_reduce(loss_sum, g.cp_group)

    def _check_batches(self, micro_batches, loss_scale) -> None:
        if not isinstance(micro_batches, (list, tuple)):
            raise ValueError(f"micro_batches must be a list of hotswitch.MicroBatch, got "
                             f"{type(micro_batches).__name__}")
        for i, mb in enumerate(micro_batches):
            if not isinstance(mb, MicroBatch):
                raise ValueError(f"micro_batches[{i}] is a {type(mb).__name__}, expected a hotswitch.MicroBatch")
            try:
                mb.check(self.config.vocab_size, self.config.max_position_embeddings)
            except ValueError as e:
                raise ValueError(f"micro_batches[{i}]: {e}") from None
        if isinstance(loss_scale, bool) or not isinstance(loss_scale, (int, float)) or \
                not math.isfinite(loss_scale):
            raise ValueError(f"loss_scale must be a finite number, got {loss_scale!r}")

    def forward_backward(self, micro_batches: Sequence[MicroBatch], loss_scale: float = 1.0,
                         before_forward: Optional[Callable[[], None]] = None,
                         graph_tokens: Optional[Sequence[int]] = None) -> Tuple[float, int]:
        """Forward and backward of this data replica's micro-batches on this rank's stage.

        Every pipeline stage and TP rank of the replica passes the same list (any number,
        lengths may differ; none is allowed). The loss of a micro-batch is the sum of the
        cross entropy of its target tokens; gradients of ``loss * loss_scale`` accumulate into
        ``.grad`` (pass 1 / the global batch's target count to get the global mean). Runs the
        1F1B schedule when pp > 1. No data-parallel reduction happens here. ``before_forward``,
        when given, is called before each micro-batch's forward on this stage (the runtime's
        ``"forward"`` hook point). ``graph_tokens``: per micro-batch, the graph bucket it is
        padded to and run from the layers' graphs, or 0 (see the class; default
        ``graph_tokens(micro_batches)``); ``ValueError`` for a bucket that is not one or does not
        hold the micro-batch.

        Returns ``(loss_sum, num_targets)`` of the replica's micro-batches, unscaled (float,
        int), on every rank of the replica. Collective over the replica's TP, CP and PP groups;
        under cp > 1 each cp rank runs its part of every sequence (``hotswitch.model.context``)
        and its gradients are the summand of its tokens.
        """
        self._check_batches(micro_batches, loss_scale)
        graph_tokens = self._check_graph_tokens(micro_batches, graph_tokens)
        g = self.groups
        if self._tp_partial and not self._pending:
            # Gradients already summed over TP stay aside, so the next sum adds only new partials.
            params = self.named_shards()
            for name in self._tp_partial:
                p = params[name]
                if p.grad is not None:
                    self._finished[name] = self._finished[name] + p.grad if name in self._finished else p.grad
                    p.grad = None
        self._pending = True
        contexts = self._contexts(micro_batches, self.attention_kernel, graph_tokens)
        self._make_compute_copies()
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        captures = self.device.type == "cuda" and any(graph_tokens)

        def forward(i: int, x: Optional[torch.Tensor]) -> torch.Tensor:
            nonlocal loss_sum
            if before_forward is not None:
                before_forward()
            if captures:
                # Each micro-batch (forward, then its backward: pp 1) is a new iteration of the
                # captured graphs: the previous one's outputs and gradients are consumed.
                torch.compiler.cudagraph_mark_step_begin()
            y = self._stage_forward(contexts[i], x)
            if g.is_last_stage:
                loss_sum = loss_sum + y.detach().double()
                return y * loss_scale
            return y

        fns = StageFunctions(forward, lambda i: (contexts[i].rows, self.config.hidden_size),
                             self.dtype, self.device)
        failed = True
        try:
            run_1f1b(fns, len(contexts), g.pp_rank, self.layout.pp, g.pp_ranks, g.pp_group, g.timeout)
            failed = False
        finally:
            self._end_compute_copies(failed)
        loss_sum = self._replica_loss(loss_sum)
        return float(loss_sum.sum()), sum(c.num_targets for c in contexts)

    def forward_loss(self, micro_batches: Sequence[MicroBatch]) -> Tuple[float, int]:
        """The summed cross entropy of this data replica's micro-batches, forward only (no
        graph, no gradients): validation. Pipeline stages run the micro-batches in order, each
        stage receiving from the previous one and sending to the next. Returns
        ``(loss_sum, num_targets)`` on every rank of the replica; collective over its TP, CP and
        PP groups, like ``forward_backward``."""
        self._check_batches(micro_batches, 1.0)
        g = self.groups
        contexts = self._contexts(micro_batches, "grouped")
        loss_sum = torch.zeros(1, dtype=torch.float64, device=self.device)
        stage = g.pp_rank
        self._make_compute_copies()
        failed = True
        try:
            self._forward_loss(contexts, loss_sum)
            failed = False
        finally:
            self._end_compute_copies(failed)
        loss_sum = self._replica_loss(loss_sum)
        return float(loss_sum), sum(c.num_targets for c in contexts)

    def _forward_loss(self, contexts, loss_sum: torch.Tensor) -> None:
        g, stage = self.groups, self.groups.pp_rank
        with torch.no_grad():
            for ctx in contexts:
                x = None
                if not g.is_first_stage:
                    x = torch.empty((ctx.rows, self.config.hidden_size), dtype=self.dtype, device=self.device)
                    exchange([], [(x, g.pp_ranks[stage - 1])], g.pp_group, g.timeout)
                y = self._stage_forward(ctx, x)
                if g.is_last_stage:
                    loss_sum += y.double()
                else:
                    exchange([(y.contiguous(), g.pp_ranks[stage + 1])], [], g.pp_group, g.timeout)

    def finish_gradients(self) -> None:
        """Sums the TP-partial gradients (norm weights under sequence parallelism) over the TP
        group. Afterwards every gradient is complete for this replica's micro-batches: the
        ``"partial"`` placement over the data replicas that ``hs.switch(...,
        src_kind="partial")`` sums. Collective over the TP group; a no-op when nothing is
        pending. Later ``forward_backward`` calls keep accumulating correctly."""
        if not self._pending:
            return
        self._pending = False
        if not self._tp_partial:
            return
        params = self.named_shards()
        grads = [params[n].grad if params[n].grad is not None else torch.zeros_like(params[n])
                 for n in self._tp_partial]
        flat = torch.cat([x.reshape(-1) for x in grads])
        all_reduce(flat, self.groups.tp_group)
        for name, part in zip(self._tp_partial, flat.split([x.numel() for x in grads])):
            grad = part.view_as(params[name])
            if name in self._finished:
                grad = self._finished.pop(name) + grad
            params[name].grad = grad

    def _flat_data_chunks(self, flat: torch.Tensor) -> torch.Tensor:
        """``flat`` padded and cut into the data group's chunks, ``[dp * cp, chunk]``, the row of
        each member of the data group in its group-rank order (row j holds chunk
        ``data_order[j]``), as the collectives over the data group index them."""
        size = self.groups.data_size
        chunk = -(-flat.numel() // size)
        padded = torch.zeros(chunk * size, dtype=flat.dtype, device=flat.device)
        padded[:flat.numel()] = flat
        order = torch.tensor(self.groups.data_order, dtype=torch.int64, device=flat.device)
        return padded.view(size, chunk).index_select(0, order)

    def _data_group_rank(self) -> int:
        return self.groups.data_order.index(self.groups.data_rank)

    def reduce_gradients(self, zero: bool = False) -> Union[Dict[str, torch.Tensor], torch.Tensor]:
        """The data-parallel reduction of a static layout: ``finish_gradients``, then the sum
        over the data group (the dp x cp ranks holding the same shards: under context
        parallelism each cp rank's gradients are the summand of its tokens) and over the
        first and last stage for a tied embedding.

        ``zero=False``: all-reduce; ``.grad`` holds the full sums; returns ``grad_shards()``.
        ``zero=True`` (optimizer state ZeRO-sharded over the data group): reduce-scatter;
        returns this rank's flat chunk of the ``"zero"`` placement (1-D, ``ceil(total / (dp *
        cp))`` elements of the local shards concatenated in tensor-set order, zero-padded;
        chunk ``data_rank``), and ``.grad`` is left unreduced. Collective over the TP, data
        and tied groups.
        """
        self.finish_gradients()
        g = self.groups
        shards = self.named_shards()
        grads = {n: p.grad if p.grad is not None else torch.zeros_like(p) for n, p in shards.items()}
        if self.config.tied_embedding and g.tied_group is not None:
            grads["embedding.weight"] = all_reduce(grads["embedding.weight"].clone(), g.tied_group)
        flat = torch.cat([x.reshape(-1) for x in grads.values()])
        if zero:
            rows = self._flat_data_chunks(flat)
            if g.data_group is None:
                return rows.reshape(-1)
            return reduce_scatter_rows(rows, g.data_group, g.data_size, self._data_group_rank()).view(-1)
        all_reduce(flat, g.data_group)
        for (name, p), part in zip(shards.items(), flat.split([x.numel() for x in grads.values()])):
            p.grad = part.view_as(p)
        return self.grad_shards()

    def zero_chunk(self) -> torch.Tensor:
        """This rank's flat chunk of the ``"zero"`` placement of the parameters (a copy)."""
        flat = torch.cat([p.detach().reshape(-1) for p in self.named_shards().values()])
        return self._flat_data_chunks(flat)[self._data_group_rank()].clone()

    def load_zero_chunks(self, chunk: torch.Tensor) -> None:
        """All-gathers every data-group member's ``"zero"`` chunk (1-D, as from ``zero_chunk``)
        and copies the result into the parameters. Collective over the data group."""
        g = self.groups
        shards = self.named_shards()
        total = sum(p.numel() for p in shards.values())
        size = g.data_size
        expected = -(-total // size)
        if chunk.dim() != 1 or chunk.numel() != expected:
            raise ValueError(f"zero chunk has shape {tuple(chunk.shape)}, expected ({expected},)")
        rows = all_gather_rows(chunk.detach().reshape(1, -1), g.data_group, size)
        ordered = torch.empty_like(rows)
        ordered[torch.tensor(g.data_order, dtype=torch.int64, device=rows.device)] = rows
        flat = ordered.reshape(-1)[:total]
        with torch.no_grad():
            for p, part in zip(shards.values(), flat.split([p.numel() for p in shards.values()])):
                p.copy_(part.view_as(p))
