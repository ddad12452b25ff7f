"""Argument checks shared by the library's entry points: each raises ``ValueError`` naming
the argument, the value and what was expected."""

import json
import math
from typing import Iterable, Iterator, Optional, Tuple, Type

__all__ = ["check_bool", "check_choice", "check_int", "check_positive", "check_token_counts", "json_lines",
           "read_json_object"]


def check_int(name: str, value, low: int, high: Optional[int] = None) -> int:
    """``value`` as an int in ``[low, high]`` (bools are not ints here)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an int {bound}, got {value!r}")
    return value


def check_token_counts(name: str, values, high: Optional[int] = None, high_name: str = "") -> list:
    """``values`` as a non-empty list of distinct int token counts, each >= 1 (and <= ``high``,
    named ``high_name`` in the message, when given)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)) or not values or any(
            isinstance(v, bool) or not isinstance(v, int) or v < 1 or (high is not None and v > high)
            for v in values) or len(set(values)) != len(values):
        bound = f"in [1, {high_name}({high})]" if high is not None else ">= 1"
        raise ValueError(f"{name} must be a non-empty list of distinct token counts {bound}, got {values!r}")
    return list(values)


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


def read_json_object(path: str, what: str, error: Type[ValueError] = ValueError) -> dict:
    """The JSON object in the file ``path``; ``error`` (a ValueError) naming ``what`` and the
    path when it cannot be read, is not valid JSON, or holds something else than an object."""
    try:
        with open(path) as f:
            value = json.load(f)
    except OSError as e:
        raise error(f"cannot read {what} {path!r}: {e.strerror}") from None
    except json.JSONDecodeError as e:
        raise error(f"{what} {path!r} is not valid JSON: {e}") from None
    if not isinstance(value, dict):
        raise error(f"{what} {path!r} must hold a JSON object, got {type(value).__name__}")
    return value


def json_lines(lines: Iterable[str], path: str) -> Iterator[Tuple[int, dict]]:
    """``(line number, object)`` for every non-blank line of a JSON-lines file ``path``;
    ValueError naming the file and line of one that is not a JSON object."""
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not valid JSON ({e})") from None
        if not isinstance(record, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object, got {type(record).__name__}")
        yield number, record
