"""Argument checks shared by the library's entry points: each raises ``ValueError`` naming
the argument, the value and what was expected."""

import math
from typing import Optional

__all__ = ["check_bool", "check_choice", "check_int", "check_positive"]


def check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    """``value`` as an int in ``[low, high]`` (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value


def check_positive(name: str, value) -> float:
    """``value`` as a positive finite float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be a bool, got {value!r}")
    return value


def check_choice(name: str, value, choices) -> str:
    if value not in choices:
        raise ValueError(f"{name} {value!r} is not one of {', '.join(choices)}")
    return value
