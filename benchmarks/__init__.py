"""Benchmarks: `/usr/bin/python3 -m benchmarks.NAME [--quick]` from the repository root; each
prints `RESULT {json}` as its last line."""


import math


def rounded(v):
    """Figures for a RESULT line: floats to 4 significant digits (None where not finite, which
    JSON cannot hold), through dicts."""
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    return v
