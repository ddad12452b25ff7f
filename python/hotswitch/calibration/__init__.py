"""Calibration of the cost model, offline and online.

- ``offline``: ``calibrate(config, world)`` times the model and the layouts' collectives on
  real processes and fits a ``HardwareProfile`` (command line: ``python -m hotswitch.calibration``).
- ``overhead``: ``measure_micro_batch(config, token_counts)`` times this runtime's
  micro-batches per layer and fits their fixed cost, ``layer_overhead_seconds``
  (``with_layer_overhead`` puts it into a profile; command line: ``python -m
  benchmarks.microbatch --write-profile``); ``agreed_layer_overhead`` measures it on rank 0 of a
  job and gives every rank the same profile (``python -m hotswitch.train`` does this by default
  when it plans with a preset).
- ``shards``: ``measure_shards(config, tps, token_counts)`` times the model's layer shards at
  the shapes of each tensor-parallel size on one device and ``fit_shards`` fits the profile's
  compute fields to them (command line: ``python -m hotswitch.calibration --device cuda``).
- ``online``: ``OnlineCalibration`` refits the profile from the phase and switch times that
  ``Runtime`` measures while it trains.
- ``runs``: reads measured training runs (``data/megatron_runs``), predicts them, fits a
  profile to them and checks one against them (command line: ``python -m hotswitch.costmodel``).
"""

from hotswitch.calibration.offline import calibrate
from hotswitch.calibration.online import OnlineCalibration
from hotswitch.calibration.overhead import (MicroBatchCosts, agreed_layer_overhead, measure_micro_batch,
                                            with_layer_overhead)

__all__ = ["MicroBatchCosts", "OnlineCalibration", "agreed_layer_overhead", "calibrate", "measure_micro_batch",
           "with_layer_overhead"]
