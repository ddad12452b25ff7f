"""World-1 switches between every pair of placement kinds, on the CPU over gloo and on CUDA
tensors over NCCL: the executor's local copies between a layout's shards, its flat ZeRO
buffer and its gradient summands (strided shards to flat buffers and back, summands added).
The tied test set in fp32 and bf16, and LLaMA-7B in bf16 (planned everywhere, switched on
the GPU). The CUDA tests skip without a device; script/gpu-check runs them (``-m gpu``)."""

import itertools
import math

import pytest
import torch

import hotswitch as hs
from hotswitch.testing.harness import run_world

from tests.python.switch import workers as w

KINDS = ("sharded", "zero", "partial")
# Every source kind to every destination kind (gradients are summed into a placement, so
# "partial" is a source only).
PAIRS = [("dp1", a, "dp1", b) for a, b in itertools.product(KINDS, ("sharded", "zero"))]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def test_every_world_one_pair_on_the_cpu():
    assert run_world(1, w.switch_on_device, PAIRS, timeout=300) == [[]]


@pytest.mark.parametrize("src_kind,dst_kind", [(p[1], p[3]) for p in PAIRS])
def test_every_world_one_pair_of_llama_7b_is_planned(src_kind, dst_kind):
    ts = hs.llama_tensor_set(dtype="bfloat16")
    dp1 = hs.Layout.parse("dp1")
    plan = hs.plan_switch(ts, dp1, dp1, src_kind=src_kind, dst_kind=dst_kind)
    total = sum(s.nbytes for s in ts.specs)
    assert plan.messages() == [] and plan.stats["bytes_moved"] == 0
    assert plan.stats["local_copy_bytes"] == total
    assert sum(math.prod(shape) * 2 for _, shape, dtype in plan.dst_buffers(0)) == total


@pytest.mark.gpu
@needs_cuda
def test_every_world_one_pair_on_cuda():
    assert run_world(1, w.switch_on_device, PAIRS, backend="nccl", timeout=300) == [[]]


@pytest.mark.gpu
@needs_cuda
def test_llama_7b_round_trips_on_cuda():
    assert run_world(1, w.llama_round_trip, backend="nccl", timeout=300) == [[]]
