"""The planner's objective as a mixed-integer program (PuLP + CBC): the optimality reference.

The program minimises exactly the objective J the planner's dynamic program minimises
(csrc/planner/Planner.h), over *arbitrary* assignments of pieces to candidate layouts, not
only contiguous length buckets:

    J = sum over used layouts l of (E_l(S_l) + g_l) + C(used layouts other than home)
    E_l(S) = max(W / dp, U) + o * max(1, M / dp) + (pp - 1) * (max(V, min(W / dp, tau)) + o + 2 lat)

with W = sum u(s), U = max u(s), V = max v(s), M = sum m(s) over the set (terms from
``Planner.candidate_model``) and C the cheapest switch cycle home -> used layouts -> home.
Variables: x[i, l] (piece i under l, only where l holds it), y[l] (l used), the epigraph
variables of each max, one binary per pipelined layout for min(W / dp, tau), and a tour
through the used layouts (arcs e[p, q], Miller-Tucker-Zemlin order). ``solve`` returns the
assignment, its value, and whether CBC proved it optimal; ``Planner.objective`` evaluates
the same assignment independently, which the tests compare.
"""

import decimal
import os
import re
import tempfile
import time
from typing import List, Optional, Sequence

import pulp

from hotswitch import _C

__all__ = ["CBC_PATH", "piece_terms", "solve"]

CBC_PATH = pulp.PULP_CBC_CMD().path  # the CBC binary that PuLP ships


def piece_terms(model: "_C.CandidateModel", s: int):
    """(u, v, m) of a piece of ``s`` tokens under a candidate (``Planner.candidate_model``): its
    seconds on a stage, those plus its stage transfers, and its share of a micro-batch."""
    t = model.terms
    u = t.alpha * s + t.beta * s * s + t.gamma
    v = u + 2.0 * t.p2p_per_token * s
    if model.pp == 1:
        m = s / model.budget
    else:
        m = min(1.0, u / model.target) if model.target > 0 else 1.0
    return u, v, m


def _log_bound(log: str, constant: float) -> Optional[float]:
    """CBC's best bound from its log: the "Lower bound" of its result, else the last "best
    possible" of its progress lines; less half a unit of its last printed digit (the log
    rounds it, and a bound must not rise), plus the objective's constant, which CBC never
    sees."""
    found = re.findall(r"^Lower bound:\s*(\S+)", log, flags=re.M)
    if not found:
        found = re.findall(r"best possible (-?[0-9.eE+-]+)", log)
    if not found:
        return None
    try:
        printed = decimal.Decimal(found[-1])
    except decimal.InvalidOperation:
        return None
    if not printed.is_finite():
        return None
    return float(printed) - 0.5 * 10.0 ** printed.as_tuple().exponent + constant


def solve(planner, piece_lengths: Sequence[int], time_limit: float = 60.0, start: Optional[List[int]] = None,
          threads: int = 1) -> dict:
    """Minimises the planner's objective over assignments of ``piece_lengths`` (tokens, ints
    >= 1) to ``planner.candidates``.

    ``start``: an assignment (candidate index per piece) CBC starts from, e.g. the planner's.
    Returns a dict: ``assignment`` (candidate per piece, or None when CBC found none),
    ``objective_s`` (the program's value of it, seconds), ``optimal`` (proved by CBC),
    ``bound_s`` (CBC's best bound on the optimum, seconds: its value when proved optimal, the
    "Lower bound" of its log when stopped early, None when the log states none),
    ``status`` (PuLP's), ``solve_s`` (wall seconds in CBC) and ``variables``. Raises
    ValueError for an empty or non-positive length, a piece no candidate holds, or a planner
    whose candidates run CUDA graph buckets.
    """
    lengths = [int(s) for s in piece_lengths]
    if not lengths:
        raise ValueError("the MILP needs at least one piece")
    L = len(planner.candidates)
    home = planner.home
    models = [planner.candidate_model(l) for l in range(L)]
    graphed = [m.layout.name for m in models if m.graph_buckets]
    if graphed:
        # E of a layout that runs CUDA graphs is a least over its graph buckets (Planner.h).
        raise ValueError(f"the MILP does not model CUDA graph buckets; candidates {', '.join(graphed)} run them "
                         f"(build the planner with graph_estimate=False)")
    for i, s in enumerate(lengths):
        if s < 1:
            raise ValueError(f"piece {i} has length {s}, expected >= 1")
        if all(m.budget < s for m in models):
            raise ValueError(f"piece {i} of length {s} fits no candidate; the longest that fits is "
                             f"{max(m.budget for m in models)} tokens")
    n = len(lengths)
    sw = planner.switch_seconds

    prob = pulp.LpProblem("hotswitch_step", pulp.LpMinimize)
    x, terms = {}, {}
    for l, m in enumerate(models):
        for i, s in enumerate(lengths):
            if s <= m.budget:
                x[i, l] = pulp.LpVariable(f"x_{i}_{l}", cat="Binary")
                terms[i, l] = piece_terms(m, s)
    y = [pulp.LpVariable(f"y_{l}", cat="Binary") for l in range(L)]
    objective = []
    for i in range(n):
        prob += pulp.lpSum(x[i, l] for l in range(L) if (i, l) in x) == 1, f"once_{i}"
    for l, m in enumerate(models):
        mine = [i for i in range(n) if (i, l) in x]
        for i in mine:
            prob += x[i, l] <= y[l], f"used_{i}_{l}"
        if not mine:
            prob += y[l] == 0, f"unused_{l}"
            continue
        dp, pp, o = m.dp, m.pp, m.terms.micro_batch_seconds
        per_replica = pulp.lpSum(terms[i, l][0] * x[i, l] for i in mine) * (1.0 / dp)
        work = pulp.LpVariable(f"R_{l}", lowBound=0)
        prob += work >= per_replica, f"work_avg_{l}"
        for i in mine:
            prob += work >= terms[i, l][0] * x[i, l], f"work_max_{i}_{l}"
        phase = [work, m.grad_seconds * y[l]]
        if o > 0:
            fixed = pulp.LpVariable(f"O_{l}", lowBound=0)
            prob += fixed >= o * y[l], f"mb_one_{l}"
            prob += fixed >= pulp.lpSum(terms[i, l][2] * x[i, l] for i in mine) * (o / dp), f"mb_count_{l}"
            phase.append(fixed)
        if pp > 1:
            bubble = pulp.LpVariable(f"B_{l}", lowBound=0)
            for i in mine:
                prob += bubble >= terms[i, l][1] * x[i, l], f"bubble_max_{i}_{l}"
            tau = m.target
            if tau > 0:
                # bubble >= min(W / dp, tau): z picks which side binds.
                z = pulp.LpVariable(f"z_{l}", cat="Binary")
                big = sum(terms[i, l][0] for i in mine) / dp
                prob += bubble >= tau * z, f"bubble_tau_{l}"
                prob += bubble >= per_replica - big * z, f"bubble_avg_{l}"
            phase.append((pp - 1) * bubble)
            phase.append((pp - 1) * (o + 2.0 * m.terms.p2p_latency) * y[l])
        objective.extend(phase)

    # The switch tour: home -> each used non-home layout once -> home.
    others = [l for l in range(L) if l != home]
    if others:
        e = {(p, q): pulp.LpVariable(f"e_{p}_{q}", cat="Binary") for p in range(L) for q in range(L) if p != q}
        stay = pulp.LpVariable("stay_home", cat="Binary")
        prob += pulp.lpSum(e[home, q] for q in others) + stay == 1, "leave_home"
        prob += pulp.lpSum(e[p, home] for p in others) + stay == 1, "return_home"
        for q in others:
            prob += pulp.lpSum(e[p, q] for p in range(L) if p != q) == y[q], f"in_{q}"
            prob += pulp.lpSum(e[q, r] for r in range(L) if r != q) == y[q], f"out_{q}"
        if len(others) > 1:
            order = {q: pulp.LpVariable(f"t_{q}", lowBound=1, upBound=len(others)) for q in others}
            for p in others:
                for q in others:
                    if p != q:
                        prob += order[q] - order[p] + len(others) * e[p, q] <= len(others) - 1, f"mtz_{p}_{q}"
        objective.append(pulp.lpSum(sw[p][q] * var for (p, q), var in e.items() if sw[p][q] > 0))
    prob += pulp.lpSum(objective)

    warm = start is not None
    if warm:
        if len(start) != n:
            raise ValueError(f"start has {len(start)} entries, expected one per piece ({n})")
        for (i, l), var in x.items():
            var.setInitialValue(1 if start[i] == l else 0)
        for l in range(L):
            y[l].setInitialValue(1 if l in start else 0)
    with tempfile.TemporaryDirectory(prefix="hotswitch-milp-") as tmp:
        log_path = os.path.join(tmp, "cbc.log")
        solver = pulp.COIN_CMD(path=CBC_PATH, msg=False, timeLimit=time_limit, gapRel=0, gapAbs=0,
                               warmStart=warm, threads=threads, logPath=log_path)
        t0 = time.perf_counter()
        prob.solve(solver)
        elapsed = time.perf_counter() - t0
        with open(log_path) as f:
            log = f.read()
    optimal = prob.sol_status == pulp.LpSolutionOptimal
    assignment = None
    if prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        assignment = []
        for i in range(n):
            chosen = [l for l in range(L) if (i, l) in x and (x[i, l].value() or 0) > 0.5]
            assignment.append(chosen[0])
    objective_s = pulp.value(prob.objective) if assignment is not None else None
    bound_s = objective_s if optimal else _log_bound(log, prob.objective.constant)
    return {
        "assignment": assignment,
        "objective_s": objective_s,
        "optimal": optimal,
        "bound_s": bound_s,
        "status": pulp.LpStatus[prob.status],
        "solve_s": elapsed,
        "variables": len(prob.variables()),
    }
