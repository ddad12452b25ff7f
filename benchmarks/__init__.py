"""Benchmarks: `/usr/bin/python3 -m benchmarks.NAME [--quick]` from the repository root; each
prints `RESULT {json}` as its last line."""


def rounded(v):
    """Figures for a RESULT line: floats to 4 significant digits, through dicts."""
    if isinstance(v, float):
        return float(f"{v:.4g}")
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    return v
