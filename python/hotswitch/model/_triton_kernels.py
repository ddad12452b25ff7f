"""Triton kernels of ``hotswitch.model.fused``: one launch per step of the layer and direction.

Every kernel reads and writes rows whose last dimension is contiguous; the other strides are
arguments. Arithmetic is in fp32 whatever the storage dtype; where the PyTorch reference
rounds an intermediate to the compute dtype (the rotary tables, silu's output, a product in
16 bits) the kernel rounds it the same way, so the two paths differ only by the rounding of
their final result. Imported only when the Triton path is chosen (it needs ``triton``).
"""

import triton
import triton.language as tl


@triton.jit
def norm_fwd(X, D, XN, W, Y, RSTD, stride_x, stride_d, stride_xn, stride_y, n_cols, eps,
             HAS_DELTA: tl.constexpr, BLOCK: tl.constexpr):
    """One row: ``x (+ delta)`` -> its RMSNorm times ``W`` in Y's dtype; the sum to XN and
    ``1 / rms`` to RSTD."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_DELTA:
        x = x + tl.load(D + row * stride_d + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(XN + row * stride_xn + cols, x.to(XN.dtype.element_ty), mask=mask)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(Y + row * stride_y + cols, (x * rstd * w).to(Y.dtype.element_ty), mask=mask)
    tl.store(RSTD + row, rstd)


@triton.jit
def norm_bwd(X, W, RSTD, G, GXN, DX, DD, DWP, stride_x, stride_g, stride_gxn, stride_dx, stride_dd,
             n_rows, n_cols, rows_per_program, HAS_GXN: tl.constexpr, HAS_DD: tl.constexpr,
             BLOCK: tl.constexpr):
    """Rows ``[pid * rows_per_program, ...)``: the input gradient ``rstd * (g w - xhat *
    mean(g w xhat))`` plus GXN (the sum's own gradient) to DX, and to DD in the delta's
    dtype; the program's part of the weight gradient, ``sum g * xhat``, to row ``pid`` of DWP."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros([BLOCK], dtype=tl.float32)
    start = pid * rows_per_program
    end = tl.minimum(start + rows_per_program, n_rows)
    for r in range(start, end):
        row = tl.cast(r, tl.int64)
        x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(RSTD + row)
        xhat = x * rstd
        dw += g * xhat
        gw = g * w
        dx = rstd * (gw - xhat * (tl.sum(gw * xhat, axis=0) / n_cols))
        if HAS_GXN:
            dx += tl.load(GXN + row * stride_gxn + cols, mask=mask, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=mask)
        if HAS_DD:
            tl.store(DD + row * stride_dd + cols, dx.to(DD.dtype.element_ty), mask=mask)
    tl.store(DWP + pid * n_cols + cols, dw, mask=mask)


@triton.jit
def rotary_fwd(QKV, COS, SIN, Q, K, V, stride_t, stride_cos, stride_sin, hq, hkv,
               HALF: tl.constexpr, BLOCK: tl.constexpr):
    """Token ``t``, head ``h`` of the fused QKV output ``[T, (hq + 2 hkv) * 2 HALF]``: q and
    k heads rotated (element ``j`` pairs with ``j + HALF``), v heads copied, each into its own
    contiguous ``[T, heads, 2 HALF]`` output."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    mask = j < HALF
    src = QKV + t * stride_t + h * (2 * HALF)
    x1 = tl.load(src + j, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + j, mask=mask, other=0.0).to(tl.float32)
    if h < hq + hkv:
        c = tl.load(COS + t * stride_cos + j, mask=mask, other=0.0).to(Q.dtype.element_ty).to(tl.float32)
        s = tl.load(SIN + t * stride_sin + j, mask=mask, other=0.0).to(Q.dtype.element_ty).to(tl.float32)
        o1 = x1 * c - x2 * s
        o2 = x2 * c + x1 * s
    else:
        o1 = x1
        o2 = x2
    if h < hq:
        dst = Q + (t * hq + h) * (2 * HALF)
    elif h < hq + hkv:
        dst = K + (t * hkv + (h - hq)) * (2 * HALF)
    else:
        dst = V + (t * hkv + (h - hq - hkv)) * (2 * HALF)
    tl.store(dst + j, o1.to(Q.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + j, o2.to(Q.dtype.element_ty), mask=mask)


@triton.jit
def rotary_bwd(GQ, GK, GV, COS, SIN, DQKV, sq_t, sq_h, sk_t, sk_h, sv_t, sv_h, stride_d, stride_cos,
               stride_sin, hq, hkv, HALF: tl.constexpr, BLOCK: tl.constexpr):
    """The inverse rotation of q's and k's gradients, v's copied, into the gradient of the
    fused QKV output (one row ``t`` and head ``h`` per program)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    j = tl.arange(0, BLOCK)
    mask = j < HALF
    if h < hq:
        src = GQ + t * sq_t + h * sq_h
    elif h < hq + hkv:
        src = GK + t * sk_t + (h - hq) * sk_h
    else:
        src = GV + t * sv_t + (h - hq - hkv) * sv_h
    g1 = tl.load(src + j, mask=mask, other=0.0).to(tl.float32)
    g2 = tl.load(src + HALF + j, mask=mask, other=0.0).to(tl.float32)
    if h < hq + hkv:
        c = tl.load(COS + t * stride_cos + j, mask=mask, other=0.0).to(DQKV.dtype.element_ty).to(tl.float32)
        s = tl.load(SIN + t * stride_sin + j, mask=mask, other=0.0).to(DQKV.dtype.element_ty).to(tl.float32)
        d1 = g1 * c + g2 * s
        d2 = g2 * c - g1 * s
    else:
        d1 = g1
        d2 = g2
    dst = DQKV + t * stride_d + h * (2 * HALF)
    tl.store(dst + j, d1.to(DQKV.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + j, d2.to(DQKV.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_fwd(GU, OUT, n_cols, stride_gu, stride_out, BLOCK: tl.constexpr):
    """Row ``r``, column block ``b`` of ``[T, 2F]`` -> ``silu(gate) * up`` ``[T, F]``."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    g = tl.load(GU + r * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(GU + r * stride_gu + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (g * tl.sigmoid(g)).to(OUT.dtype.element_ty).to(tl.float32)
    tl.store(OUT + r * stride_out + cols, (silu * u).to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def swiglu_bwd(GU, G, DGU, n_cols, stride_gu, stride_g, stride_dgu, BLOCK: tl.constexpr):
    """The gradient of ``silu(gate) * up`` -> ``[d gate, d up]`` ``[T, 2F]``."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    gate = tl.load(GU + r * stride_gu + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(GU + r * stride_gu + n_cols + cols, mask=mask, other=0.0).to(tl.float32)
    d = tl.load(G + r * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(gate)
    silu = (gate * sig).to(DGU.dtype.element_ty).to(tl.float32)
    dsilu = (d * up).to(DGU.dtype.element_ty).to(tl.float32)
    dgate = dsilu * sig * (1.0 + gate * (1.0 - sig))
    tl.store(DGU + r * stride_dgu + cols, dgate.to(DGU.dtype.element_ty), mask=mask)
    tl.store(DGU + r * stride_dgu + n_cols + cols, (d * silu).to(DGU.dtype.element_ty), mask=mask)


@triton.jit
def cross_entropy_fwd(L, TGT, TOP, TOTAL, PICKED, stride_l, n_cols, vocab_start, BLOCK: tl.constexpr):
    """Row ``r`` of this rank's logits ``[T, V / tp]`` -> its max, the sum of ``exp(logit -
    max)`` and the target's logit (0 when the target lies in another rank's slice), in two
    passes over the row."""
    r = tl.program_id(0).to(tl.int64)
    row = L + r * stride_l
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(row + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        top = tl.maximum(top, x)
    m = tl.max(top, 0)
    target = tl.load(TGT + r) - vocab_start
    total = tl.zeros([BLOCK], tl.float32)
    picked = tl.zeros([BLOCK], tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < n_cols
        x = tl.load(row + cols, mask=mask, other=0.0).to(tl.float32)
        total += tl.where(mask, tl.exp(x - m), 0.0)
        picked += tl.where(cols == target, x, 0.0)
    tl.store(TOP + r, m)
    tl.store(TOTAL + r, tl.sum(total, 0))
    tl.store(PICKED + r, tl.sum(picked, 0))


@triton.jit
def cross_entropy_bwd(L, TGT, LSE, G, DL, stride_l, stride_dl, n_cols, vocab_start, BLOCK: tl.constexpr):
    """Row ``r``, column block ``b``: ``(softmax - onehot(target)) * g`` from the logits and
    the row's log-sum-exp over the whole vocabulary, in the logits' dtype."""
    r = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(L + r * stride_l + cols, mask=mask, other=0.0).to(tl.float32)
    lse = tl.load(LSE + r)
    g = tl.load(G + r)
    target = tl.load(TGT + r) - vocab_start
    d = (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)) * g
    tl.store(DL + r * stride_dl + cols, d.to(DL.dtype.element_ty), mask=mask)
