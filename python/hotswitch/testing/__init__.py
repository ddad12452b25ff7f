"""Test support, for hotswitch's tests and benchmarks and for users' own: a multi-process
harness over a temp-file store (``harness.run_world``), scripted faults through the
runtime's hook points (``faults``), the static single-layout trainer that serves as the
single-process reference (``reference``), a small CPU world and the fault scenarios run on
it (``scenarios``), layout parity under mixed precision on that world (``precision``), and
tables of bad inputs for every public entry point (``bad_inputs``).
"""
