"""Benchmarks: `/usr/bin/python3 -m benchmarks.NAME [--quick]` from the repository root; each
prints `RESULT {json}` as its last line."""
