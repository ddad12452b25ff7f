"""Calibration of the cost model, offline and online.

- ``offline``: ``calibrate(config, world)`` times the model and the layouts' collectives on
  real processes and fits a ``HardwareProfile`` (command line: ``python -m hotswitch.calibration``).
- ``online``: ``OnlineCalibration`` refits the profile from the phase and switch times that
  ``Runtime`` measures while it trains.
- ``runs``: reads measured training runs (``data/megatron_runs``), predicts them, fits a
  profile to them and checks one against them (command line: ``python -m hotswitch.costmodel``).
"""

from hotswitch.calibration.offline import calibrate
from hotswitch.calibration.online import OnlineCalibration

__all__ = ["OnlineCalibration", "calibrate"]
