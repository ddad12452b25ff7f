"""Scripted, repeatable faults for testing jobs that use a ``hotswitch.Runtime``.

``inject(runtime, Fault(...))`` arms one fault on this rank: at the ``nth`` occurrence of a
stage the rank dies abruptly (``os._exit``, as a killed process: no cleanup, its sockets
closed by the kernel) or stalls for ``stall_s`` seconds. Stages:

- ``"switch"``: a parameter or gradient switch, before its exchange;
- ``"phase"``: the forward of a micro-batch inside a phase (after earlier micro-batches
  have run, so the peers are in the middle of the phase's collectives);
- ``"save"``: a box of a checkpoint being written (after earlier boxes were written).

Only the rank that calls ``inject`` is affected; its peers see a dead or stalled peer.
"""

import dataclasses
import os
import time

__all__ = ["Fault", "STAGES", "inject"]

STAGES = ("switch", "phase", "save")
ACTIONS = ("kill", "stall")
KILL_EXIT_CODE = 86


@dataclasses.dataclass
class Fault:
    """Die (``action="kill"``) or sleep ``stall_s`` seconds (``"stall"``) at the ``nth``
    (1-based) occurrence of ``stage`` on this rank."""

    stage: str
    action: str = "kill"
    nth: int = 1
    stall_s: float = 0.0

    def __post_init__(self):
        if self.stage not in STAGES:
            raise ValueError(f"fault stage {self.stage!r} is not one of {', '.join(STAGES)}")
        if self.action not in ACTIONS:
            raise ValueError(f"fault action {self.action!r} is not one of {', '.join(ACTIONS)}")
        if isinstance(self.nth, bool) or not isinstance(self.nth, int) or self.nth < 1:
            raise ValueError(f"nth must be an int >= 1, got {self.nth!r}")
        if self.action == "stall" and not self.stall_s > 0:
            raise ValueError(f"a stall needs stall_s > 0, got {self.stall_s!r}")


class _Trigger:
    def __init__(self, fault: Fault):
        self.fault = fault
        self.count = 0

    def tick(self) -> None:
        self.count += 1
        if self.count != self.fault.nth:
            return
        if self.fault.action == "kill":
            os._exit(KILL_EXIT_CODE)
        time.sleep(self.fault.stall_s)


def inject(runtime, fault: Fault) -> None:
    """Arms ``fault`` on this rank's ``runtime`` through its hook points (see the module
    docstring and ``hotswitch.hooks``)."""
    if not isinstance(fault, Fault):
        raise ValueError(f"fault must be a hotswitch.testing.faults.Fault, got {type(fault).__name__}")
    point = {"switch": "switch", "phase": "forward", "save": "save"}[fault.stage]
    runtime.hooks.add(point, _Trigger(fault).tick)
