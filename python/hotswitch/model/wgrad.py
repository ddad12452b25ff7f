"""Weight gradients accumulated straight into the parameters' ``.grad``.

A matrix that computes through a narrower copy (bf16 compute, fp32 masters: the model's
``compute_copy``) would otherwise get its weight gradient in two kernels per micro-batch:
the product, written in bf16 into the copy's ``.grad``, then its addition into the fp32
``.grad`` of the parameter. Here the product accumulates into the parameter's gradient
itself, as Megatron-LM's ``--gradient-accumulation-fusion`` does: on CUDA one widening
product ``grad += g.T @ x`` in the gradient's dtype (``torch.addmm(..., out_dtype=)``, fp32
accumulation of bf16 operands, no bf16 rounding of the micro-batch's gradient); where the
device has no such product (the CPU), the product in the operands' dtype, then its addition.
In one dtype (fp32 compute) it is ``addmm_`` into the gradient from the second micro-batch on,
in place of autograd's product and addition.

Eager only: a compiled or graphed layer computes its weight gradient as autograd does.
"""

import functools

import torch
import torch.nn.functional as F

__all__ = ["accumulate_weight_grad", "fusing", "linear", "widening_products"]


@functools.lru_cache(maxsize=None)
def widening_products(device: torch.device, dtype: torch.dtype = torch.bfloat16,
                      out_dtype: torch.dtype = torch.float32) -> bool:
    """Whether ``torch.mm`` and ``torch.addmm`` take ``out_dtype`` on ``device`` for
    ``dtype`` operands, accumulating into an ``out_dtype`` tensor in place: tried once per
    device and dtypes on 2 x 2 operands (CUDA only)."""
    if device.type != "cuda":
        return False
    try:
        a = torch.ones(2, 2, dtype=dtype, device=device)
        c = torch.mm(a, a, out_dtype=out_dtype)
        torch.addmm(c, a, a, out_dtype=out_dtype, out=c)
        return c.dtype == out_dtype and bool((c == 4).all())
    except (RuntimeError, TypeError, NotImplementedError):
        return False


def accumulate_weight_grad(main: torch.Tensor, grad: torch.Tensor, inputs: torch.Tensor) -> None:
    """``main.grad += grad.T @ inputs`` (``grad`` ``[..., out]``, ``inputs`` ``[..., in]``,
    ``main`` ``[out, in]``), in ``main``'s dtype; ``main.grad`` becomes the product when None."""
    g = grad.reshape(-1, grad.shape[-1]).t()
    x = inputs.reshape(-1, inputs.shape[-1])
    if g.dtype == main.dtype:
        if main.grad is None:
            main.grad = g.mm(x)
        else:
            main.grad.addmm_(g, x)
    elif widening_products(main.device, g.dtype, main.dtype):
        if main.grad is None:
            main.grad = torch.mm(g, x, out_dtype=main.dtype)
        else:
            torch.addmm(main.grad, g, x, out_dtype=main.dtype, out=main.grad)
    else:
        product = g.mm(x)
        if main.grad is None:
            main.grad = product.to(main.dtype)
        else:
            main.grad.add_(product)


class _Linear(torch.autograd.Function):
    """``F.linear(x, weight)`` whose backward adds the weight gradient into ``main.grad``
    (``accumulate_weight_grad``) and returns none for ``weight``."""

    @staticmethod
    def forward(ctx, x, weight, holder):
        ctx.save_for_backward(x, weight)
        ctx.main = holder[0]
        return F.linear(x, weight)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        dx = grad.matmul(weight) if ctx.needs_input_grad[0] else None
        accumulate_weight_grad(ctx.main, grad, x)
        return dx, None, None


def linear(x: torch.Tensor, weight: torch.Tensor, main=None) -> torch.Tensor:
    """``F.linear(x, weight)``; with ``main`` (the parameter ``weight`` is, or is a copy of,
    which needs a gradient) its weight gradient accumulates into ``main.grad``, outside a
    compiled region and while gradients are recorded."""
    if main is None or not fusing(main):
        return F.linear(x, weight)
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
    return _Linear.apply(x, weight, (main,))


def fusing(main: torch.Tensor) -> bool:
    """Whether a product with ``main``'s weight accumulates its gradient here: eager, with
    gradients recorded, for a parameter that needs one."""
    return not torch.compiler.is_compiling() and torch.is_grad_enabled() and main.requires_grad
