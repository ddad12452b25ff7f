"""Analysis on top of the library: planner simulations (``simulate``), pictures of step plans
(``plots``), the exact MILP reference of the planner (``milp``, PuLP with CBC) and the linear
program of a switch's send load that lets any owner send (``switch_lp``) and the summary of a
PyTorch profiler trace's steps (``trace``: device busy time, kernels by kind, host waits).
Nothing here runs during training.
"""
