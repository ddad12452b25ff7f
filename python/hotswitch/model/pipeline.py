"""The 1F1B pipeline schedule over point-to-point sends (Megatron's schedule without
interleaving).

Stage ``s`` of ``P`` runs ``min(P - s - 1, M)`` warm-up forwards, then alternates one
forward and one backward, then drains the remaining backwards; at most ``P - s``
micro-batches' activations are alive at once. Every stage knows every micro-batch's shape
(all stages receive the same micro-batch list), so no shapes travel; micro-batches may
differ in length and may number fewer than the stages.
"""

from collections import deque
from typing import Callable, Optional, Sequence, Tuple

import torch

from hotswitch.model.comm import exchange

__all__ = ["StageFunctions", "run_1f1b"]


class StageFunctions:
    """What the schedule needs of one stage.

    ``forward(i, x)``: the stage's forward of micro-batch ``i`` (``x`` is the received
    activation, ``None`` on the first stage); returns the activation to send, or on the last
    stage the scalar to differentiate (the scaled loss). ``shape(i)``: the activation shape
    of micro-batch ``i`` between stages.
    """

    def __init__(self, forward: Callable[[int, Optional[torch.Tensor]], torch.Tensor],
                 shape: Callable[[int], Tuple[int, ...]], dtype: torch.dtype, device: torch.device):
        self.forward = forward
        self.shape = shape
        self.dtype = dtype
        self.device = device


def run_1f1b(fns: StageFunctions, num_micro: int, stage: int, stages: int, ranks: Sequence[int],
             group, timeout: float) -> None:
    """Runs the forward and backward of ``num_micro`` micro-batches on pipeline stage
    ``stage`` of ``stages``; ``ranks`` are the global ranks of the stages of this pipeline.
    Gradients accumulate into the parameters' ``.grad``. Blocking; collective over the
    pipeline (each stage's sends meet the neighbour's receives in the same order); a send
    or receive that does not complete within ``timeout`` seconds raises ``RuntimeError``."""
    first, last = stage == 0, stage == stages - 1
    prev_rank = None if first else ranks[stage - 1]
    next_rank = None if last else ranks[stage + 1]

    def buffer(i: int) -> torch.Tensor:
        return torch.empty(fns.shape(i), dtype=fns.dtype, device=fns.device)

    def recv_forward(i: int) -> Optional[torch.Tensor]:
        if first:
            return None
        x = buffer(i)
        exchange([], [(x, prev_rank)], group, timeout)
        return x.requires_grad_()

    def send_forward(y: torch.Tensor) -> None:
        if not last:
            exchange([(y.detach().contiguous(), next_rank)], [], group, timeout)

    def recv_backward(i: int) -> Optional[torch.Tensor]:
        if last:
            return None
        g = buffer(i)
        exchange([], [(g, next_rank)], group, timeout)
        return g

    def send_backward(gx: Optional[torch.Tensor]) -> None:
        if not first:
            exchange([(gx.contiguous(), prev_rank)], [], group, timeout)

    def send_forward_recv_backward(y: torch.Tensor, i: int) -> Optional[torch.Tensor]:
        if last:
            return None
        g = buffer(i)
        exchange([(y.detach().contiguous(), next_rank)], [(g, next_rank)], group, timeout)
        return g

    def send_backward_recv_forward(gx: Optional[torch.Tensor], i: int) -> Optional[torch.Tensor]:
        if first:
            return None
        x = buffer(i)
        exchange([(gx.contiguous(), prev_rank)], [(x, prev_rank)], group, timeout)
        return x.requires_grad_()

    def backward(x: Optional[torch.Tensor], y: torch.Tensor, gy: Optional[torch.Tensor]):
        if last:
            y.backward()
        else:
            torch.autograd.backward(y, gy)
        if x is None:
            return None
        return x.grad if x.grad is not None else torch.zeros_like(x)

    warmup = min(stages - stage - 1, num_micro)
    remaining = num_micro - warmup
    inputs: deque = deque()
    outputs: deque = deque()
    for i in range(warmup):
        x = recv_forward(i)
        y = fns.forward(i, x)
        send_forward(y)
        inputs.append(x)
        outputs.append(y)
    x = recv_forward(warmup) if remaining > 0 else None
    for i in range(remaining):
        f = warmup + i
        y = fns.forward(f, x)
        gy = send_forward_recv_backward(y, i)
        inputs.append(x)
        outputs.append(y)
        gx = backward(inputs.popleft(), outputs.popleft(), gy)
        if i == remaining - 1:
            x = None
            send_backward(gx)
        else:
            x = send_backward_recv_forward(gx, f + 1)
    for i in range(warmup):
        b = remaining + i
        gy = recv_backward(b)
        gx = backward(inputs.popleft(), outputs.popleft(), gy)
        send_backward(gx)
