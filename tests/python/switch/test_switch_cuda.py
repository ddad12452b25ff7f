"""The switch executor on CUDA tensors over NCCL. Skipped without a CUDA device; run by
script/gpu-check (``pytest -m gpu``)."""

import pytest
import torch

from hotswitch.testing.harness import run_world

from tests.python.switch import workers as w

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

# World 1: every layout is dp1, so these are the executor's local copies between placement
# kinds (strided shards to flat ZeRO buffers and back, partial summands added).
PAIRS = [("dp1", "sharded", "dp1", "zero"), ("dp1", "zero", "dp1", "sharded"),
         ("dp1", "partial", "dp1", "sharded"), ("dp1", "partial", "dp1", "zero")]


def test_switch_packs_and_unpacks_on_cuda():
    assert run_world(1, w.switch_on_device, PAIRS, backend="nccl", timeout=300) == [[]]
