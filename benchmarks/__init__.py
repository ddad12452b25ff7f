"""Benchmarks: `.venv/bin/python -m benchmarks.NAME [--quick]` from the repository root; each
prints `RESULT {json}` as its last line."""


import math
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def default_data_dir() -> str:
    """Where the benchmarks read length files and measured runs: ``$HOTSWITCH_DATA_DIR``, else
    ``third_party/data`` in the checkout when ``script/gpu-check --prepare`` filled it (it
    travels with the tree to a machine without ``../shared``), else ``../shared/data``."""
    if os.environ.get("HOTSWITCH_DATA_DIR"):
        return os.environ["HOTSWITCH_DATA_DIR"]
    local = os.path.join(ROOT, "third_party", "data")
    return local if os.path.isdir(local) else os.path.join(ROOT, "..", "shared", "data")


def rounded(v):
    """Figures for a RESULT line: floats to 4 significant digits (None where not finite, which
    JSON cannot hold), through dicts."""
    if isinstance(v, float):
        return float(f"{v:.4g}") if math.isfinite(v) else None
    if isinstance(v, dict):
        return {k: rounded(x) for k, x in v.items()}
    return v
