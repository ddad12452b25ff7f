"""Analysis on top of the library: planner simulations (``simulate``), pictures of step plans
(``plots``) and the exact MILP reference of the planner (``milp``, PuLP with CBC). Nothing
here runs during training.
"""
