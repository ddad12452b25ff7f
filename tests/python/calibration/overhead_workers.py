"""Spawned workers of test_overhead.py."""

import time

from hotswitch.calibration import overhead
from hotswitch.model.transformer import TransformerLayer


def timings_with_a_fixed_cost(rank, world, spec, seconds):
    """``overhead._time_rank``'s timings with every layer's forward ``seconds`` slower, a
    fixed cost per layer and micro-batch whatever its tokens (none when ``seconds`` is 0), and
    the mean seconds each such pause took (a sleep overshoots, by more on a loaded host)."""
    slept = []
    if seconds > 0:
        forward_pair = TransformerLayer.forward_pair

        def slowed(self, *args, **kwargs):
            t0 = time.perf_counter()
            time.sleep(seconds)
            slept.append(time.perf_counter() - t0)
            return forward_pair(self, *args, **kwargs)

        TransformerLayer.forward_pair = slowed
    timed = overhead._time_rank(rank, world, spec)["seconds"]
    return timed, sum(slept) / len(slept) if slept else 0.0
