"""Loss scaling for 16-bit compute, with Megatron-LM's semantics.

Under fp16 compute small gradients underflow: the loss is multiplied by a *loss scale*
before the backward pass, and the (fp32) gradients are divided by it again before the
optimizer steps. A scale too large overflows instead; then the step's gradients hold an
inf or NaN, the optimizer step is skipped and the scale shrinks. ``LossScaling`` holds the
settings (Megatron's ``--initial-loss-scale --min-loss-scale --loss-scale-window
--hysteresis``, or ``--loss-scale`` for a constant scale); ``GradScaler`` the state, which
checkpoints carry.
"""

import dataclasses
import math
from typing import Optional

__all__ = ["GradScaler", "LossScaling"]


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")


def _count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclasses.dataclass(frozen=True)
class LossScaling:
    """How the loss is scaled. ``constant`` set: that scale every step, never changed
    (Megatron's ``ConstantGradScaler``). Otherwise dynamic (``DynamicGradScaler``): start at
    ``initial``; each step whose gradients overflow lowers a hysteresis counter, and when it
    reaches zero the scale halves (never below ``min``); ``window`` overflow-free steps in a
    row double the scale and reset the counter to ``hysteresis``."""

    initial: float = 2.0 ** 32
    """The first scale (Megatron's ``--initial-loss-scale``)."""

    min: float = 1.0
    """The scale never halves below this (``--min-loss-scale``)."""

    window: int = 1000
    """Overflow-free steps before the scale doubles (``--loss-scale-window``)."""

    hysteresis: int = 2
    """Overflowing steps tolerated before the scale halves (``--hysteresis``)."""

    constant: Optional[float] = None
    """A fixed scale instead (``--loss-scale``)."""

    def __post_init__(self):
        _positive("initial", self.initial)
        _positive("min", self.min)
        _count("window", self.window)
        _count("hysteresis", self.hysteresis)
        if self.constant is not None:
            _positive("constant", self.constant)
        elif self.min > self.initial:
            raise ValueError(f"min({self.min}) must be <= initial({self.initial})")

    @property
    def dynamic(self) -> bool:
        return self.constant is None


class GradScaler:
    """The loss scale of a run and its counters. ``update(found_inf)`` after every step, with
    the verdict every rank agrees on (so the scale stays the same on every rank)."""

    def __init__(self, settings: LossScaling):
        if not isinstance(settings, LossScaling):
            raise ValueError(f"settings must be a hotswitch.precision.LossScaling, got {type(settings).__name__}")
        self.settings = settings
        self.scale = float(settings.initial if settings.dynamic else settings.constant)
        self.growth_tracker = 0                     # overflow-free steps since the last change
        self.hysteresis_tracker = settings.hysteresis  # overflows left before the scale halves

    def update(self, found_inf: bool) -> None:
        """Megatron's rule: an overflow resets the growth count and uses up one unit of
        hysteresis, halving the scale (down to ``min``) once none is left; ``window`` clean
        steps in a row double it and restore the hysteresis."""
        s = self.settings
        if not s.dynamic:
            return
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale = max(self.scale * 0.5, s.min)
        else:
            self.growth_tracker += 1
            if self.growth_tracker == s.window:
                self.growth_tracker = 0
                self.hysteresis_tracker = s.hysteresis
                self.scale = self.scale * 2.0

    def state_dict(self) -> dict:
        """``{"scale": float, "growth_tracker": int, "hysteresis_tracker": int}``."""
        return {"scale": self.scale, "growth_tracker": self.growth_tracker,
                "hysteresis_tracker": self.hysteresis_tracker}

    def load_state_dict(self, state: dict) -> None:
        """Takes a ``state_dict()``; ValueError, with nothing changed, for anything else."""
        if not isinstance(state, dict) or sorted(state) != ["growth_tracker", "hysteresis_tracker", "scale"]:
            raise ValueError(f"a grad scaler state must be a dict with keys growth_tracker, hysteresis_tracker, "
                             f"scale, got {sorted(state) if isinstance(state, dict) else type(state).__name__}")
        _positive("the grad scaler state's scale", state["scale"])
        for key in ("growth_tracker", "hysteresis_tracker"):
            value = state[key]
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"the grad scaler state's {key} must be an int, got {value!r}")
        if not self.settings.dynamic:
            return
        self.scale = float(state["scale"])
        self.growth_tracker = state["growth_tracker"]
        self.hysteresis_tracker = state["hysteresis_tracker"]
