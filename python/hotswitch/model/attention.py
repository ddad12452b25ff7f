"""Causal attention over packed variable-length sequences: one kernel call per layer.

A pack holds sequences end to end (``cu_seqlens``, flash-attention's convention); each
sequence attends to itself only, causally. ``select_kernel`` chooses the kernel once per
process for a device type, compute dtype and head dimension, and logs its choice;
``PackAttention`` prepares what that kernel needs of one pack (once per micro-batch: every
layer reuses it) and runs it. The kernels, in the order they are preferred:

``flash_attn``
    ``flash_attn.flash_attn_varlen_func`` (flash-attn >= 2.1, whose causal mask is aligned
    to the bottom right when a sequence has fewer queries than keys) over ``cu_seqlens``:
    CUDA, fp16/bf16, head dimension a multiple of 8 up to 256. Work and memory of the
    per-sequence causal blocks; grouped-query attention natively.
``varlen``
    PyTorch's own flash attention over ``cu_seqlens``
    (``torch.nn.attention.varlen.varlen_attn``, PyTorch 2.10 and later, no other package):
    the same contract and the same costs as ``flash_attn``, on CUDA devices of compute
    capability 8.0 or later. No padding, no compilation, and ``[T, h, d]`` in and out (no
    transposes).
``flex``
    FlexAttention (``torch.nn.attention.flex_attention``, CUDA), compiled
    once for dynamic lengths, with a document-causal ``BlockMask``: the blocks outside every sequence are skipped;
    ``enable_gqa``. The pack is padded to a multiple of the block size (128).
``sdpa``
    ``F.scaled_dot_product_attention`` over the whole pack with a block-diagonal causal
    boolean mask ``[T, T]``, ``enable_gqa``.
``masked``
    The same as one batched matrix product and a masked softmax: the
    query heads that share a K/V head are folded into rows (``[hkv, rep * T, d]`` against
    ``[hkv, T, d]``), so K/V are never repeated.
``grouped``
    The sequences grouped by length, one ``[B, h, n, d]`` causal call per distinct length:
    the work and memory of the per-sequence blocks, but about one call per sequence on
    long-tailed packs.

The two mask kernels (``sdpa``, ``masked``) cost O(T^2) work and memory for a pack of ``T``
tokens whatever its sequences: ``heads * T^2`` scores (``masked`` keeps them for backward)
and a ``T^2`` mask, against the ``sum(n_i^2)`` of the per-sequence blocks. They take a pack
only while ``heads * T^2 <= MASKED_MAX_SCORES[device type]`` and run larger packs
``grouped``, where the calls are few relative to the work:

- CUDA: 2^24 scores (64 MiB in fp32; 32 heads up to 724 tokens), where a call (about ten
  kernel launches forward and backward) costs more than the extra scores;
- CPU: 2^15 scores (8 heads up to 64 tokens, 4 heads up to 90). On one thread with a
  generic BLAS, 8 heads of 16 dims, forward and backward, ``masked`` took 0.6-0.8 ms
  against 1.0-10 ms grouped at 32 tokens, but 1.3-3x grouped's time from 64 to 190 tokens
  and up to 7x at 380: a score costs about 0.2 us there, a call about 0.3 ms.
"""

import functools
import inspect
import math
import re
from typing import Dict, List, Optional

import torch
import torch.nn.functional as F

from hotswitch.logging import get_logger
from hotswitch.model.batch import to_device

__all__ = ["CONTEXT_KERNEL_FUNCTIONS", "FLASH_KERNELS", "KERNELS", "KERNEL_FUNCTIONS", "MASKED_MAX_SCORES",
           "LengthGroups", "PackAttention", "available_kernels", "cuda_kernel", "document_mask", "flex_document_mask",
           "select_kernel", "sequence_capacity", "static_within", "varlen_attention"]

_log = get_logger("model")

KERNELS = ("flash_attn", "varlen", "flex", "sdpa", "masked", "grouped")
# The kernels with flash-attention's variable-length contract (``_flash_kernel``).
FLASH_KERNELS = ("flash_attn", "varlen")
# The module-level function each kernel calls, once per layer (``grouped``: once per
# distinct length), looked up at call time: wrapping it counts the kernel's calls.
KERNEL_FUNCTIONS = {"flash_attn": "_flash_kernel", "varlen": "_flash_kernel", "flex": "_flex_kernel",
                    "sdpa": "_sdpa_kernel", "masked": "_masked_kernel", "grouped": "_causal_blocks"}
# The same under context parallelism (``hotswitch.model.context.ContextAttention``): ``grouped``
# there is one call per distinct (length, pieces) shape of a rank's sequences.
CONTEXT_KERNEL_FUNCTIONS = dict(KERNEL_FUNCTIONS, grouped="_context_blocks")
# Largest ``heads * T^2`` a mask kernel takes in one call, by device type (see above).
MASKED_MAX_SCORES = {"cpu": 1 << 15, "cuda": 1 << 24}
FLEX_BLOCK = 128


@functools.lru_cache(maxsize=None)
def _import_flash():
    try:
        import flash_attn
        from flash_attn import flash_attn_varlen_func
    except Exception:  # ImportError, or a wheel whose CUDA library does not load here
        return None
    # Before 2.1 a causal mask with fewer queries than keys was aligned to the top left:
    # context parallelism's chunks (queries of a piece against its sequence's prefix) need
    # the bottom-right alignment.
    version = str(getattr(flash_attn, "__version__", ""))
    parsed = re.match(r"(\d+)\.(\d+)", version)
    if parsed is None or (int(parsed[1]), int(parsed[2])) < (2, 1):
        _log.info("flash_attn %r is not 2.1 or later: not used", version)
        return None
    return flash_attn_varlen_func


@functools.lru_cache(maxsize=None)
def _import_varlen():
    """PyTorch's ``varlen_attn`` with ``flash_attn_varlen_func``'s signature (``causal`` the
    only keyword), or None where this torch has none. Its keywords changed between
    releases: 2.10 takes ``is_causal``; later ones ``window_size`` ((-1, 0) is causal, aligned
    to the bottom right as flash-attn >= 2.1 does) and ``enable_gqa`` for fewer K/V heads."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" in params:
        causal_mask = {"window_size": (-1, 0)}
    elif "is_causal" in params:
        causal_mask = {"is_causal": True}
    else:
        _log.info("torch.nn.attention.varlen.varlen_attn takes neither window_size nor is_causal: not used")
        return None
    gqa = "enable_gqa" in params

    def varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal):
        if causal is not True:
            raise ValueError(f"the varlen kernel runs causal attention only, got causal={causal!r}")
        extra = {"enable_gqa": True} if gqa and q.shape[1] != k.shape[1] else {}
        return varlen_attn(q, k, v, cu_q, cu_k, max_q, max_k, **causal_mask, **extra)

    return varlen


@functools.lru_cache(maxsize=None)
def _varlen_runs(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether ``varlen`` runs on ``device`` for ``dtype`` and ``head_dim``: once per process
    and combination, two sequences (3 and 5 tokens, 2 query heads over 1 K/V head; all their
    queries, then their last few) forward and backward against ``sdpa`` with the same mask in
    fp32, within 2% of the largest value (bf16's rounding). Its keywords changed between
    releases, so a failure here leaves it out (logged) instead of failing every layer."""
    try:
        with torch.inference_mode(False), torch.enable_grad(), torch.autocast(device.type, enabled=False):
            error = _varlen_error(device, dtype, head_dim)
    except Exception as e:  # an API this code does not speak, or a kernel missing for this device
        _log.warning("attention kernel varlen (torch.nn.attention.varlen) does not run on %s with %s, head dim %d: "
                     "%s: %s; not used", device, dtype, head_dim, type(e).__name__, e)
        return False
    if not error < 2e-2:
        _log.warning("attention kernel varlen differs from sdpa by %.3g (relative) on %s with %s, head dim %d; "
                     "not used", error, device, dtype, head_dim)
        return False
    return True


def _varlen_error(device: torch.device, dtype: torch.dtype, head_dim: int) -> float:
    """``_varlen_runs``' check: the largest relative error of the outputs and the gradients,
    for whole sequences and for fewer queries than keys (context parallelism's pieces, causal
    from the bottom right)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    q, k, v = (torch.randn(8, heads, head_dim, generator=gen, device="cpu").to(device) for heads in (2, 1, 1))
    ids = torch.tensor([0, 0, 0, 1, 1, 1, 1, 1], device=device)
    pos = torch.tensor([0, 1, 2, 0, 1, 2, 3, 4], device=device)
    cu_k = torch.tensor([0, 3, 8], dtype=torch.int32, device=device)
    errors = []
    # Every query; then the last 2 of sequence 0 and the last 3 of sequence 1.
    for rows, cu_q, max_q in ((slice(None), cu_k, 5), ([1, 2, 5, 6, 7], torch.tensor([0, 2, 5], dtype=torch.int32,
                                                                                     device=device), 3)):
        leaves = [x.to(dtype).requires_grad_() for x in (q[rows], k, v)]
        out = _flash_kernel(*leaves, cu_q, cu_k, max_q, 5, "varlen")
        out.float().square().sum().backward()
        exact = [x.clone().requires_grad_() for x in (q[rows], k, v)]
        want = _sdpa_kernel(*exact, document_mask(ids[rows], pos[rows], ids, pos))
        want.square().sum().backward()
        errors += [float((a.float() - b).abs().max() / b.abs().max().clamp_min(1e-6)) for a, b in
                   [(out, want)] + [(x.grad, y.grad) for x, y in zip(leaves, exact)]]
    return max(errors)


@functools.lru_cache(maxsize=None)
def _import_flex():
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:
        return None
    return create_block_mask, flex_attention


def _flash_shape(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the flash kernels take ``dtype`` and ``head_dim``: half precision, head dims
    that are multiples of 8 up to 256."""
    return dtype in (torch.float16, torch.bfloat16) and head_dim % 8 == 0 and head_dim <= 256


def _flex_shape(head_dim: int) -> bool:
    """Whether FlexAttention's Triton kernels take ``head_dim``: powers of two from 16."""
    return head_dim >= 16 and head_dim & (head_dim - 1) == 0


def available_kernels(device: torch.device, dtype: torch.dtype, head_dim: int) -> List[str]:
    """The kernels that run here for ``device`` (its type), compute ``dtype`` and
    ``head_dim``, most preferred first (always ends with ``masked``, ``grouped``)."""
    out = []
    if device.type == "cuda":
        flash_shape = _flash_shape(dtype, head_dim)
        if flash_shape and _import_flash() is not None:
            out.append("flash_attn")
        if flash_shape and torch.cuda.get_device_capability(device)[0] >= 8 and _import_varlen() is not None and \
                _varlen_runs(torch.device(device), dtype, head_dim):
            out.append("varlen")
        if _flex_shape(head_dim) and _import_flex() is not None:
            out.append("flex")
    return out + ["sdpa", "masked", "grouped"]


def cuda_kernel(dtype: torch.dtype, head_dim: int) -> str:
    """The attention kernel a CUDA device selects for compute ``dtype`` and ``head_dim``
    (``select_kernel``). Without a CUDA device here (a dry run planning GPUs from a host without
    one), judged from what imports: ``flash_attn`` or ``flex`` where they take the shape, else
    ``sdpa``; ``varlen`` is left out, since only a device can check it."""
    device = torch.device("cuda")
    if torch.cuda.is_available():
        return select_kernel(device, dtype, head_dim)
    if _flash_shape(dtype, head_dim) and _import_flash() is not None:
        return "flash_attn"
    if _flex_shape(head_dim) and _import_flex() is not None:
        return "flex"
    return "sdpa"


_chosen: Dict[tuple, str] = {}


def _max_scores(device: torch.device) -> int:
    return MASKED_MAX_SCORES.get(device.type, MASKED_MAX_SCORES["cpu"])


def static_within(heads: int, tokens: int, max_scores: Optional[int]) -> bool:
    """Whether a pack of ``tokens`` tokens with ``heads`` heads (per rank) is within an
    attention's bound on a static pack, ``heads * tokens^2 <= max_scores`` (None: no bound).
    The rule of ``PackAttention.runs_static``, of the online calibration's graph buckets and of
    the cost model's ``LayoutTerms.graph_max_tokens``."""
    return max_scores is None or heads * tokens * tokens <= max_scores


def select_kernel(device: torch.device, dtype: torch.dtype, head_dim: int, prefer: Optional[str] = None) -> str:
    """The attention kernel for ``device``/``dtype``/``head_dim``: ``prefer`` when given
    (``ValueError`` when it is not one of ``available_kernels``), else the first available.
    Chosen once per process and combination; the first choice is logged (``model``, info)."""
    device = torch.device(device)
    kernels = available_kernels(device, dtype, head_dim)
    if prefer is not None:
        if prefer not in kernels:
            raise ValueError(f"attention kernel {prefer!r} does not run on {device.type} with {dtype} and head "
                             f"dim {head_dim}; available: {', '.join(kernels)}")
        return prefer
    key = (device.type, dtype, head_dim)
    if key not in _chosen:
        _chosen[key] = kernels[0]
        bound = ""
        if kernels[0] in ("sdpa", "masked"):
            bound = (f" (one call per layer while heads * tokens^2 <= {_max_scores(device)}, grouped by length "
                     f"beyond)")
        _log.info("attention kernel on %s %s, head dim %d: %s%s; available: %s", device.type,
                  str(dtype).replace("torch.", ""), head_dim, kernels[0], bound, ", ".join(kernels))
    return _chosen[key]


# ----------------------------------------------------------------------------- kernels
# The per-layer kernels (_flash_kernel, _flex_kernel, _sdpa_kernel, _masked_kernel) take
# q [Tq, hq, d], k/v [Tk, hkv, d] (hq a multiple of hkv) and return [Tq, hq, d]; a pack
# without context parallelism has Tq = Tk. The grouped ones (_causal_blocks,
# _context_blocks) take batches of sequences of one shape, [B, ...].


def _flash_kernel(q, k, v, cu_q, cu_k, max_q, max_k, kernel="flash_attn"):
    """Sequence ``i``'s queries ``q[cu_q[i]:cu_q[i+1]]`` against its keys
    ``k[cu_k[i]:cu_k[i+1]]``, causal from the bottom right (the last query sees every key),
    by ``kernel`` (one of ``FLASH_KERNELS``)."""
    varlen = _import_flash() if kernel == "flash_attn" else _import_varlen()
    return varlen(q, k, v, cu_q, cu_k, max_q, max_k, causal=True)


_compiled: Dict[str, object] = {}


def _compiled_flex():
    # Compiled for symbolic sequence lengths: one graph serves every pack size, so a process
    # compiles FlexAttention once (per dtype and head shape), not once per padded length, and
    # every later process of the machine finds that graph in inductor's on-disk cache.
    if "flex" not in _compiled:
        create_block_mask, flex_attention = _import_flex()
        _compiled["flex"] = torch.compile(flex_attention, dynamic=True)
        _compiled["mask"] = torch.compile(create_block_mask, dynamic=True)
    return _compiled["mask"], _compiled["flex"]


def _flex_kernel(q, k, v, block_mask, padded_q, padded_k):
    def heads_first(x, padded):
        return F.pad(x, (0, 0, 0, 0, 0, padded - x.shape[0])).transpose(0, 1).unsqueeze(0)  # [1, h, Tpad, d]

    gqa = True if q.shape[1] != k.shape[1] else False  # a bool, also where torch.compile sees symbolic heads
    out = _compiled_flex()[1](heads_first(q, padded_q), heads_first(k, padded_k), heads_first(v, padded_k),
                              block_mask=block_mask, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)[:q.shape[0]]


def _sdpa_kernel(q, k, v, mask):
    """``mask``: bool ``[Tq, Tk]`` (true where a query sees a key), or the same as an additive
    bias in ``q``'s dtype (0 where it sees, -inf elsewhere), which SDPA would otherwise build
    from the bool mask at every call."""
    q, k, v = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))  # [1, h, T, d]
    gqa = True if q.shape[1] != k.shape[1] else False  # a bool, also where torch.compile sees symbolic heads
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return out.squeeze(0).transpose(0, 1)


def _masked_heads(q, k, v, blocked):
    """``q`` ``[B, m, hq, d]`` against ``k``/``v`` ``[B, n, hkv, d]`` where ``blocked`` ``[m, n]``
    is false: one batched matrix product and a masked softmax. Query head ``i`` reads K/V head
    ``i // (hq / hkv)``: each group's query heads are folded into rows, so K/V are never
    repeated."""
    b, m, hq, d = q.shape
    n, hkv = k.shape[1], k.shape[2]
    rep = hq // hkv
    qg = q.reshape(b, m, hkv, rep, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, rep * m, d)
    kg, vg = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # [B, hkv, n, d]
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * (1.0 / math.sqrt(d))  # [B, hkv, rep * m, n]
    scores.view(b, hkv, rep, m, n).masked_fill_(blocked, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vg.dtype)
    out = torch.matmul(probs, vg)  # [B, hkv, rep * m, d]
    return out.view(b, hkv, rep, m, d).permute(0, 3, 1, 2, 4).reshape(b, m, hq, d)


def _masked_kernel(q, k, v, blocked):
    return _masked_heads(q[None], k[None], v[None], blocked)[0]


def _context_blocks(q, k, v, blocked):
    """``B`` sequences of one shape under context parallelism (``_masked_heads``)."""
    return _masked_heads(q, k, v, blocked)


def document_mask(q_ids: torch.Tensor, q_pos: torch.Tensor, k_ids: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Bool ``[Tq, Tk]``: query ``i`` may see key ``j`` when both belong to the same sequence
    (``ids``) and the key's position in it is not after the query's (``pos``)."""
    return (q_ids[:, None] == k_ids[None, :]) & (k_pos[None, :] <= q_pos[:, None])


def flex_document_mask(q_ids: torch.Tensor, q_pos: torch.Tensor, k_ids: torch.Tensor, k_pos: torch.Tensor,
                       device: torch.device):
    """FlexAttention's ``BlockMask`` of ``document_mask`` (ids and positions already padded to
    multiples of ``FLEX_BLOCK``): blocks of keys outside every query's sequence are skipped."""
    create_block_mask = _compiled_flex()[0]

    def document_causal(b, h, q_idx, kv_idx):
        return (q_ids[q_idx] == k_ids[kv_idx]) & (k_pos[kv_idx] <= q_pos[q_idx])

    return create_block_mask(document_causal, None, None, q_ids.numel(), k_ids.numel(), device=str(device))


def _causal_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal attention of ``[B, h, n, d]`` query blocks over ``[B, g, n, d]`` key and value
    blocks (``h`` a multiple of ``g``: grouped-query attention, K/V never repeated)."""
    gqa = True if q.shape[1] != k.shape[1] else False  # a bool, also where torch.compile sees symbolic heads
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)


# ----------------------------------------------------------------------------- packs


class LengthGroups:
    """The sequences of a pack grouped by length, as token indices.

    ``groups``: for each distinct length ``n`` (ascending), an int64 ``[B, n]`` tensor of
    the token positions of its ``B`` sequences. ``inverse``: int64 ``[T]`` that puts the
    tokens of the concatenated groups back in pack order. Built from ``lengths`` (int64
    ``[n]``) without a Python loop over the sequences.
    """

    def __init__(self, lengths: torch.Tensor, device: torch.device):
        lengths = torch.as_tensor(lengths, dtype=torch.int64).cpu()
        starts = torch.cumsum(lengths, 0) - lengths
        self.num_tokens = int(lengths.sum())
        by_length, order = torch.sort(lengths, stable=True)
        distinct, counts = torch.unique_consecutive(by_length, return_counts=True)
        firsts = starts[order].split(counts.tolist())
        self.groups: List[torch.Tensor] = [
            to_device(first[:, None] + torch.arange(n, dtype=torch.int64), device)
            for n, first in zip(distinct.tolist(), firsts)]
        flat = torch.cat([g.reshape(-1) for g in self.groups])
        self.inverse = torch.empty_like(flat)
        self.inverse[flat] = torch.arange(flat.numel(), dtype=torch.int64, device=flat.device)


def sequence_capacity(sequences: int) -> int:
    """The sequence count a static pack's bounds are padded to (``PackAttention(static=True)``):
    the power of two at or above ``sequences``, at least 8, so that packs of one token count
    take a few shapes, not one per sequence count."""
    return max(8, 1 << (int(sequences) - 1).bit_length())


class PackAttention:
    """Causal attention within each sequence of one pack, for ``kernel``.

    ``cu_seqlens``: int64 ``[n + 1]`` (``0 < ... < T``, the pack's sequence bounds);
    ``heads``: query heads per call (this rank's); ``device``: where q, k, v will live.
    ``kernel`` is the kernel chosen by ``select_kernel``; ``self.kernel`` is the one this
    pack runs (``grouped`` for a pack over the mask kernels' bound). Everything the kernel
    needs of the pack is built here, once, so every layer's call is one kernel call.

    ``static``: what a call takes has the same shapes and ints for every pack of ``T``
    tokens, so that a captured CUDA graph replays for any of them: the flash kernels' bounds
    end in empty sequences up to ``sequence_capacity(n)`` and their longest sequence is
    taken as ``T``. The mask and flex kernels' tensors depend on ``T`` alone already;
    ``grouped`` has one call per distinct length and is never static.
    """

    def __init__(self, cu_seqlens: torch.Tensor, kernel: str, heads: int, device: torch.device,
                 static: bool = False):
        if kernel not in KERNELS:
            raise ValueError(f"attention kernel {kernel!r} is not one of {', '.join(KERNELS)}")
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).cpu()
        lengths = cu[1:] - cu[:-1]
        t = int(cu[-1])
        self.num_tokens = t
        self.num_sequences = int(lengths.numel())
        if kernel in ("sdpa", "masked") and heads * t * t > _max_scores(torch.device(device)):
            kernel = "grouped"
        self.kernel = kernel
        if kernel in FLASH_KERNELS:
            if static:
                # The shapes and ints a call takes depend on the token count alone, up to the
                # sequence capacity: a CUDA graph captured for one pack replays for the next.
                capacity = sequence_capacity(self.num_sequences)
                cu = torch.cat([cu, cu[-1:].expand(capacity - self.num_sequences)])
            self.cu_seqlens = to_device(cu, device, torch.int32)
            self.max_length = t if static else int(lengths.max())
        elif kernel == "grouped":
            self.groups = LengthGroups(lengths, device)
        else:
            padded = -(-t // FLEX_BLOCK) * FLEX_BLOCK if kernel == "flex" else t
            # The padding of a flex pack is one more sequence, dropped from the output.
            ids = to_device(torch.repeat_interleave(torch.arange(self.num_sequences + 1, dtype=torch.int64),
                                                    torch.cat([lengths, torch.tensor([padded - t])])), device)
            index = torch.arange(padded, device=device)
            if kernel == "flex":
                self.padded = padded
                self.block_mask = flex_document_mask(ids, index, ids, index, device)
            else:
                allowed = document_mask(ids, index, ids, index)
                if kernel == "sdpa":
                    self.allowed = allowed
                    self._bias: Dict[torch.dtype, torch.Tensor] = {}
                else:
                    self.blocked = ~allowed

    @staticmethod
    def max_static_scores(kernel: str, device: torch.device) -> Optional[int]:
        """The most scores (heads * tokens^2) of a pack that ``kernel`` runs static on
        ``device``: the mask kernels' bound, over which they fall back to ``grouped``; 0 for
        ``grouped``, which runs no pack static; None for the rest, which run every pack static
        (the cost model's ``graph_max_scores``)."""
        if kernel in ("sdpa", "masked"):
            return _max_scores(torch.device(device))
        return 0 if kernel == "grouped" else None

    @staticmethod
    def runs_static(kernel: str, heads: int, tokens: int, device: torch.device) -> bool:
        """Whether a pack of ``tokens`` tokens for ``kernel`` with ``heads`` heads can be static
        (``max_static_scores``)."""
        return static_within(heads, tokens, PackAttention.max_static_scores(kernel, device))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` ``[T, hq, d]``, ``k``/``v`` ``[T, hkv, d]`` with ``hq`` a multiple of ``hkv``
        (query head ``i`` reads key/value head ``i // (hq / hkv)``); returns ``[T, hq, d]``."""
        if q.shape[0] != self.num_tokens or k.shape != v.shape or k.shape[0] != self.num_tokens or \
                q.shape[1] % k.shape[1] or q.shape[2] != k.shape[2]:
            raise ValueError(f"attention of a pack of {self.num_tokens} tokens expects q [T, hq, d] and k, v "
                             f"[T, hkv, d] with hkv dividing hq, got {tuple(q.shape)}, {tuple(k.shape)}, "
                             f"{tuple(v.shape)}")
        if self.kernel in FLASH_KERNELS:
            return _flash_kernel(q, k, v, self.cu_seqlens, self.cu_seqlens, self.max_length, self.max_length,
                                 self.kernel)
        if self.kernel == "flex":
            return _flex_kernel(q, k, v, self.block_mask, self.padded, self.padded)
        if self.kernel == "sdpa":
            return _sdpa_kernel(q, k, v, self.bias(q.dtype))
        if self.kernel == "masked":
            return _masked_kernel(q, k, v, self.blocked)
        return _grouped(q, k, v, self.groups)

    def prepare(self, dtype: torch.dtype) -> None:
        """Builds what a call in ``dtype`` caches (the ``sdpa`` bias), so that no later call has
        a side effect (``ParallelTransformer`` prepares every pack before its layers run)."""
        if self.kernel == "sdpa":
            self.bias(dtype)

    def bias(self, dtype: torch.dtype) -> torch.Tensor:
        """The ``sdpa`` mask as an additive bias in ``dtype``: 0 where a query sees a key,
        -inf elsewhere (the values SDPA converts a bool mask to), built at the first layer's
        call and shared by the others. Every row sees at least its own token."""
        bias = self._bias.get(dtype)
        if bias is None:
            bias = torch.full(self.allowed.shape, float("-inf"), dtype=dtype, device=self.allowed.device)
            bias.masked_fill_(self.allowed, 0.0)
            self._bias[dtype] = bias
        return bias


def _grouped(q, k, v, groups: LengthGroups):
    outs = []
    for index in groups.groups:
        qb, kb, vb = (x[index].transpose(1, 2) for x in (q, k, v))  # [B, heads, n, d]
        ob = _causal_blocks(qb, kb, vb)
        outs.append(ob.transpose(1, 2).reshape(-1, q.shape[1], q.shape[2]))
    return torch.cat(outs).index_select(0, groups.inverse)


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pack: PackAttention) -> torch.Tensor:
    """Causal attention within each sequence of ``pack``: ``pack(q, k, v)`` (shapes there)."""
    return pack(q, k, v)
