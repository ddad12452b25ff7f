"""The decoder layer's element-wise and row-wise steps, each one kernel per direction.

Four steps around the layer's matrix products, and the loss:

- ``norm``: RMSNorm of ``x`` ``[T, h]`` over the last dim, in fp32, written in the compute
  dtype (the input of the next matrix product);
- ``add_norm``: the residual sum ``x + delta`` (fp32 ``[T, h]``, ``delta`` in any float dtype)
  and its RMSNorm, both written;
- ``rotary_qkv``: the fused QKV product's output ``[T, (hq + 2 hkv) d]`` -> rotated ``q``
  ``[T, hq, d]`` and ``k`` ``[T, hkv, d]``, and ``v`` ``[T, hkv, d]``;
- ``swiglu``: ``silu(gate) * up`` of the fused gate/up product ``[T, 2F]`` -> ``[T, F]``;
- ``cross_entropy``: the loss head's vocabulary-parallel cross entropy: one kernel forward
  (each row's max, sum of exponentials and target logit, which the TP reductions combine) and
  one backward that recomputes the softmax instead of keeping it.

Two implementations share one contract, chosen per model (``KERNELS``):

- ``"torch"``: PyTorch operators (about ten per step and direction). The reference, and the
  CPU's path: bitwise what the layer computed before the fused kernels existed.
- ``"triton"``: one Triton kernel per step forward and one backward (two for a norm's
  backward: the rows, then the sum of the weight gradient's per-program parts). CUDA's
  default when ``triton`` imports; on the CPU it runs only under Triton's interpreter
  (``TRITON_INTERPRET=1`` set before the first launch), which the tests and the kernel
  count use.

The two agree to the rounding of their last result: in fp32 within 1e-5, in bf16 within its
resolution (``tests/python/model/test_fused.py``). ``LAUNCHES`` counts the Triton launches
by kernel name, for ``hotswitch.calibration.overhead.count_layer_ops``.
"""

import collections
import importlib.util
import os
from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from hotswitch.model.comm import all_reduce
from hotswitch.model.layers import apply_rotary, rms_norm, vocab_parallel_cross_entropy

__all__ = ["KERNELS", "LAUNCHES", "select_fused", "norm", "add_norm", "rotary_qkv", "swiglu", "cross_entropy"]

KERNELS = ("torch", "triton")

# Triton launches by kernel name since the process started (each is one GPU kernel).
LAUNCHES: "collections.Counter[str]" = collections.Counter()

_kernels = None


def _triton():
    global _kernels
    if _kernels is None:
        from hotswitch.model import _triton_kernels
        _kernels = _triton_kernels
    return _kernels


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def select_fused(device: torch.device, requested: Optional[str] = None) -> str:
    """The implementation of the fused steps for a model on ``device``: ``requested``
    (``"torch"`` or ``"triton"``) when it runs there, else the default (``"triton"`` on CUDA
    when ``triton`` is installed, ``"torch"`` otherwise). ``"triton"`` on the CPU needs
    ``TRITON_INTERPRET=1``. Raises ``ValueError`` for an unknown name or one that cannot run."""
    has_triton = importlib.util.find_spec("triton") is not None
    if requested is None:
        return "triton" if device.type == "cuda" and has_triton else "torch"
    if requested not in KERNELS:
        raise ValueError(f"fused kernels must be one of {', '.join(KERNELS)}, got {requested!r}")
    if requested == "triton":
        if not has_triton:
            raise ValueError("fused kernels 'triton' need the triton package, which is not installed")
        if device.type != "cuda" and not _interpreted():
            raise ValueError(f"fused kernels 'triton' run on CUDA, or on the CPU under TRITON_INTERPRET=1; "
                             f"the model is on {device.type}")
    return requested


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``[rows, last]`` with a contiguous last dim (a view when possible)."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    return x.reshape(-1, x.shape[-1])


def _block(n: int) -> int:
    """The power of two at least ``n``: a kernel's block covering a row of ``n``."""
    return 1 << max(0, (n - 1).bit_length())


def _launch(name: str, grid, *args, **meta) -> None:
    LAUNCHES[name] += 1
    kernel = getattr(_triton(), name)[grid]
    if not _interpreted():
        kernel(*args, **meta)
        return
    # The interpreter copies through PyTorch operators on the host; they stand in for the one
    # GPU kernel, so an operator count (a dispatch mode) must not see them.
    from torch.utils._python_dispatch import _disable_current_modes
    with _disable_current_modes():
        kernel(*args, **meta)


_NORM_PROGRAMS = 256


class _Norm(torch.autograd.Function):
    """``(x, delta or None, weight)`` -> ``(x + delta, y)`` (without delta: ``y`` alone)."""

    @staticmethod
    def forward(ctx, x, delta, weight, eps, dtype):
        x2 = _rows(x)
        rows, cols = x2.shape
        y = torch.empty((rows, cols), dtype=dtype, device=x.device)
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        if delta is not None:
            d2 = _rows(delta)
            xn = torch.empty((rows, cols), dtype=x.dtype, device=x.device)
        else:
            d2, xn = x2, x2
        if rows:
            _launch("norm_fwd", (rows,), x2, d2, xn, weight, y, rstd, x2.stride(0), d2.stride(0), xn.stride(0),
                    y.stride(0), cols, eps, HAS_DELTA=delta is not None, BLOCK=_block(cols))
        ctx.save_for_backward(xn, weight, rstd)
        ctx.has_delta = delta is not None
        ctx.delta_dtype = None if delta is None else delta.dtype
        ctx.shape = x.shape
        if delta is None:
            return y.view(*x.shape[:-1], cols)
        return xn.view(x.shape), y.view(*x.shape[:-1], cols)

    @staticmethod
    def backward(ctx, *grads):
        xn, weight, rstd = ctx.saved_tensors
        if ctx.has_delta:
            gxn, gy = grads
        else:
            gxn, gy = None, grads[0]
        rows, cols = xn.shape
        if gy is None:
            gy = torch.zeros((rows, cols), dtype=xn.dtype, device=xn.device)
        g2 = _rows(gy)
        gxn2 = _rows(gxn) if gxn is not None else g2
        dx = torch.empty((rows, cols), dtype=xn.dtype, device=xn.device)
        dd = torch.empty((rows, cols), dtype=ctx.delta_dtype, device=xn.device) if ctx.has_delta else dx
        # Each program sums the weight gradient of its rows; one reduction adds the programs'.
        per_program = max(1, -(-rows // _NORM_PROGRAMS))
        programs = max(1, -(-rows // per_program))
        parts = (torch.empty if rows else torch.zeros)((programs, cols), dtype=torch.float32, device=xn.device)
        if rows:
            _launch("norm_bwd", (programs,), xn, weight, rstd, g2, gxn2, dx, dd, parts, xn.stride(0), g2.stride(0),
                    gxn2.stride(0), dx.stride(0), dd.stride(0), rows, cols, per_program,
                    HAS_GXN=gxn is not None, HAS_DD=ctx.has_delta, BLOCK=_block(cols))
        dw = parts.sum(0).to(weight.dtype)
        dx = dx.view(ctx.shape)
        if ctx.has_delta:
            return dx, dd.view(ctx.shape), dw, None, None
        return dx, None, dw, None, None


class _RotaryQKV(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv, cos, sin, hq, hkv):
        qkv = _rows(qkv)
        t = qkv.shape[0]
        d = qkv.shape[1] // (hq + 2 * hkv)
        q = torch.empty((t, hq, d), dtype=qkv.dtype, device=qkv.device)
        k = torch.empty((t, hkv, d), dtype=qkv.dtype, device=qkv.device)
        v = torch.empty((t, hkv, d), dtype=qkv.dtype, device=qkv.device)
        cos, sin = _rows(cos), _rows(sin)
        if t:
            _launch("rotary_fwd", (t, hq + 2 * hkv), qkv, cos, sin, q, k, v, qkv.stride(0), cos.stride(0),
                    sin.stride(0), hq, hkv, HALF=d // 2, BLOCK=_block(d // 2))
        ctx.save_for_backward(cos, sin)
        ctx.dims = (t, hq, hkv, d, qkv.dtype)
        return q, k, v

    @staticmethod
    def backward(ctx, gq, gk, gv):
        cos, sin = ctx.saved_tensors
        t, hq, hkv, d, dtype = ctx.dims
        grads = []
        for g, heads in ((gq, hq), (gk, hkv), (gv, hkv)):
            if g is None:
                g = torch.zeros((t, heads, d), dtype=dtype, device=cos.device)
            if g.stride(-1) != 1 or g.dtype != dtype:
                g = g.contiguous().to(dtype)
            grads.append(g)
        gq, gk, gv = grads
        dqkv = torch.empty((t, (hq + 2 * hkv) * d), dtype=dtype, device=cos.device)
        if t:
            _launch("rotary_bwd", (t, hq + 2 * hkv), gq, gk, gv, cos, sin, dqkv, gq.stride(0), gq.stride(1),
                    gk.stride(0), gk.stride(1), gv.stride(0), gv.stride(1), dqkv.stride(0), cos.stride(0),
                    sin.stride(0), hq, hkv, HALF=d // 2, BLOCK=_block(d // 2))
        return dqkv, None, None, None, None


_SWIGLU_BLOCK = 1024


class _SwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gate_up):
        gu = _rows(gate_up)
        rows, width = gu.shape
        f = width // 2
        out = torch.empty((rows, f), dtype=gu.dtype, device=gu.device)
        block = min(_SWIGLU_BLOCK, _block(f))
        if rows and f:
            _launch("swiglu_fwd", (rows, -(-f // block)), gu, out, f, gu.stride(0), out.stride(0), BLOCK=block)
        ctx.save_for_backward(gu)
        ctx.shape = gate_up.shape
        return out.view(*gate_up.shape[:-1], f)

    @staticmethod
    def backward(ctx, g):
        (gu,) = ctx.saved_tensors
        rows, width = gu.shape
        f = width // 2
        g2 = _rows(g).to(gu.dtype)
        dgu = torch.empty((rows, width), dtype=gu.dtype, device=gu.device)
        block = min(_SWIGLU_BLOCK, _block(f))
        if rows and f:
            _launch("swiglu_bwd", (rows, -(-f // block)), gu, g2, dgu, f, gu.stride(0), g2.stride(0),
                    dgu.stride(0), BLOCK=block)
        return dgu.view(ctx.shape)


_CE_BLOCK = 1024


class _CrossEntropy(torch.autograd.Function):
    """``vocab_parallel_cross_entropy`` in one kernel forward (the rows' statistics; a few
    ``[T]``-sized operations combine them over the TP group) and one backward, which
    recomputes the softmax from the logits and their log-sum-exp: nothing of shape
    ``[T, V / tp]`` is kept in fp32 between the two."""

    @staticmethod
    def forward(ctx, logits, target, vocab_start, group):
        lg = _rows(logits)
        rows, n = lg.shape
        target = target.reshape(-1).to(torch.int64).contiguous()
        stats = torch.empty((3, rows), dtype=torch.float32, device=lg.device)
        block = min(_CE_BLOCK, _block(n))
        if rows and n:
            _launch("cross_entropy_fwd", (rows,), lg, target, stats[0], stats[1], stats[2], lg.stride(0), n,
                    vocab_start, BLOCK=block)
        top, total, picked = stats
        if group is not None:
            # Two reductions over the TP group: the max, then the rescaled sums and the target's
            # logit (0 on every rank but the one whose slice holds it) together.
            m = all_reduce(top.clone(), group, dist.ReduceOp.MAX)
            sums = all_reduce(torch.stack([total * torch.exp(top - m), picked]), group)
            top, total, picked = m, sums[0], sums[1]
        lse = top + total.log()
        ctx.save_for_backward(lg, target, lse)
        ctx.vocab_start, ctx.shape = vocab_start, logits.shape
        return lse - picked

    @staticmethod
    def backward(ctx, grad_loss):
        lg, target, lse = ctx.saved_tensors
        rows, n = lg.shape
        g = grad_loss.reshape(-1).float().contiguous()
        dl = torch.empty_like(lg)
        block = min(_CE_BLOCK, _block(n))
        if rows and n:
            _launch("cross_entropy_bwd", (rows, -(-n // block)), lg, target, lse, g, dl, lg.stride(0), dl.stride(0),
                    n, ctx.vocab_start, BLOCK=block)
        return dl.view(ctx.shape), None, None, None


def cross_entropy(logits: torch.Tensor, target: torch.Tensor, vocab_start: int, group,
                  kernels: str = "torch") -> torch.Tensor:
    """Per-token cross entropy ``[T]`` (float32) of this rank's logit slice ``[T, V / tp]``
    against ``target`` ``[T]``: ``hotswitch.model.layers.vocab_parallel_cross_entropy``'s
    contract, with ``"triton"`` one kernel forward and one backward."""
    if kernels == "triton":
        return _CrossEntropy.apply(logits, target, vocab_start, group)
    return vocab_parallel_cross_entropy(logits, target, vocab_start, group)


def norm(x: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype, kernels: str = "torch") -> torch.Tensor:
    """RMSNorm of ``x`` ``[..., h]`` times ``weight`` ``[h]``, computed in fp32, as ``dtype``."""
    if kernels == "triton":
        return _Norm.apply(x, None, weight, eps, dtype)
    return rms_norm(x, weight, eps).to(dtype)


def add_norm(x: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float, dtype: torch.dtype,
             kernels: str = "torch") -> Tuple[torch.Tensor, torch.Tensor]:
    """``(x + delta, norm(x + delta))``: the residual stream ``x`` (its dtype kept) plus a
    block's output ``delta`` of the same shape, and the sum's RMSNorm as ``dtype``."""
    if kernels == "triton":
        return _Norm.apply(x, delta, weight, eps, dtype)
    x = x + delta
    return x, rms_norm(x, weight, eps).to(dtype)


def rotary_qkv(qkv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, hq: int, hkv: int,
               kernels: str = "torch") -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused QKV output ``[T, (hq + 2 hkv) d]`` -> ``q`` ``[T, hq, d]`` and ``k`` ``[T,
    hkv, d]`` rotated by the tables ``cos``, ``sin`` ``[T, d / 2]`` (LLaMA's half-split
    pairing, in ``qkv``'s dtype), and ``v`` ``[T, hkv, d]``."""
    if kernels == "triton":
        return _RotaryQKV.apply(qkv, cos, sin, hq, hkv)
    d = qkv.shape[-1] // (hq + 2 * hkv)
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
    return apply_rotary(q.reshape(-1, hq, d), cos, sin), apply_rotary(k.reshape(-1, hkv, d), cos, sin), \
        v.reshape(-1, hkv, d)


def swiglu(gate_up: torch.Tensor, kernels: str = "torch") -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` ``[T, 2F]`` (gate the first half) -> ``[T, F]``."""
    if kernels == "triton":
        return _SwiGLU.apply(gate_up)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
