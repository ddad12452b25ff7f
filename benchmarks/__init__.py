"""Benchmarks: `/usr/bin/python3 -m benchmarks.NAME [--quick]` from the repository root; each
prints `RESULT {json}` as its last line."""

import os
import sys

_PYTHON = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "python")
if _PYTHON not in sys.path:
    sys.path.insert(0, _PYTHON)
