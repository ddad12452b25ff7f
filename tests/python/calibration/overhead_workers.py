"""Spawned workers of test_overhead.py."""

import time

from hotswitch.calibration import overhead
from hotswitch.model.transformer import TransformerLayer


def timings_with_a_fixed_cost(rank, world, spec, seconds):
    """``overhead._time_rank``'s timings with every layer's forward ``seconds`` slower, a
    fixed cost per layer and micro-batch whatever its tokens (none when ``seconds`` is 0)."""
    if seconds > 0:
        forward_pair = TransformerLayer.forward_pair

        def slowed(self, *args, **kwargs):
            time.sleep(seconds)
            return forward_pair(self, *args, **kwargs)

        TransformerLayer.forward_pair = slowed
    return overhead._time_rank(rank, world, spec)["seconds"]
