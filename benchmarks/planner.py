"""The per-step planner: planning time, distance to the MILP optimum, simulated speedup.

LLaMA-7B on A800 nodes of 8 GPUs (``--hardware``: a preset or a profile JSON, e.g. from
``python -m hotswitch.calibration``), every (dp, tp, pp) layout the model divides as a
candidate, max context 32K (longer documents truncated), switch costs from redistribution
plans (up to 64 GPUs) or receive volumes (``hotswitch.planner.switch_costs``). Lengths: every
``*.lengths`` file of ``--data-dir`` (default ``../shared/data`` beside the repository), or,
when there is none, the Python standard library's files (``python -m hotswitch.cli.lengths``).

- Planning time: median wall time of ``Planner.plan`` for steps of 1024 sequences on 32 GPUs
  and of 4096 sequences on 256 GPUs, drawn from each distribution (pooled, and per
  distribution).
- Gap to the optimum: random small steps (12-24 sequences from the distributions, 5 layouts
  of 8 GPUs with a 48 GiB budget so long sequences need tensor or pipeline parallelism,
  switch costs from plans, every home) solved by the MILP over arbitrary assignments
  (``hotswitch.analysis.milp``, CBC). Lengths are drawn from the documents one candidate can
  hold in a micro-batch (``milp_max_length``; the share left out is reported). Over the steps
  where CBC proves optimality, ``ours / optimum - 1`` of the planner's objective J and CBC's
  time; the steps it does not prove within the time limit are counted (``milp_unproven``)
  and their gap bounded by CBC's best bound, ``ours / bound - 1``.
- Simulation (``hotswitch.analysis.simulate``): per distribution and 8, 32, 256 GPUs, steps of
  16 sequences per GPU; predicted tokens/s of hot switching over the best static layout of
  each step (a per-step choice, run as its own home: stronger than any layout fixed for the
  run), over the home layout fixed for the run (the best static layout for a batch that must
  hold the max context, as ``python -m hotswitch.cli.plan`` picks it), and the share of the step spent
  switching; ``sim_speedup_vs_static_min``: the smallest speedup over the per-step best
  static layout among these cases.
- Rank order: the same simulated steps (first distribution, 8/32/256 GPUs, the home a
  Megatron-LM user fixes) with every candidate in Megatron's rank order and with the order
  ``hotswitch.planner.choose_model_orders`` picks: ``switch_seconds_saved_by_order`` (seconds
  per step), ``switch_share_saved_by_order``, the step's predicted speedup, and the most one
  use of a reordered candidate saves (``order_saving_per_use_max_s``).
- Named baselines: ``sim_speedup_vs_padded_static`` (the best static layout with every
  sequence padded to the max context); with ``--fixed-plan FILE`` (``--fixed-plan-gpus``),
  ``sim_speedup_vs_fixed`` over that hand-written plan on the same steps. The simulation's
  home is chosen over a window of batches and moves when it pays
  (``hotswitch.planner.choose_home``; ``sim_homes``, ``sim_home_moves``).
- Context parallelism: LLaMA-7B at a 128K context (longer documents truncated), every layout
  with cp up to 8 (a node) and every recompute mode among the candidates, against the same
  without cp layouts (``sim_speedup_cp_vs_no_cp``), and against the home layout fixed for the
  run (``sim_speedup_vs_home_cp``), over ``wlbllm.lengths`` and the long tail of
  ``wikipedia.lengths`` (documents of 8K tokens or more), 4 sequences per GPU, on 32 and 256
  GPUs (32 only with ``--quick``); switch costs from receive volumes. Planning time with cp
  layouts among the candidates: ``plan_ms_p50_1024seq_32gpu_cp`` (32K context, as the first).
- CUDA graph buckets (1K-16K tokens), graphed layers assumed to keep a tenth of the fixed
  cost per layer, 8 and 32 GPUs (8 with ``--quick``): the planner whose program weighs the
  buckets over the same planner whose program does not (``sim_speedup_graph_estimate``; both
  pack phases exactly with graphs); graphs captured only by the home and the layouts plans
  use on probe batches (``graph_layouts``) over every layout capturing them
  (``sim_speedup_graph_layouts``: each layout's weight copies take memory from all), over no
  graph buckets (``sim_speedup_graphs_vs_none``), over the best static layout per step and
  over the best layout fixed for the run under the same graphs
  (``sim_speedup_vs_static_graphs``, ``sim_speedup_vs_static_run_graphs``); these with the
  home fixed (the max-context rule). As the runtime runs under ``graph_layouts="auto"`` with
  its home moving: ``sim_speedup_vs_static_run_graphs_moving_home``.

    .venv/bin/python -m benchmarks.planner [--quick] [--data-dir DIR] [--hardware a800]
"""

import argparse
import json
import os
import random
import sys
import tempfile
import time

import hotswitch as hs
from hotswitch import _C
from benchmarks import default_data_dir, rounded
from hotswitch.analysis import milp
from hotswitch import planner as planning
from hotswitch.analysis.simulate import simulate, simulate_moving_home
from hotswitch.data import load_lengths
from hotswitch.hardware import load_hardware

DEFAULT_DATA_DIR = default_data_dir()
MODEL = "llama-7b"
GPUS_PER_NODE = 8
MAX_CONTEXT = 32768
SIM_GPUS = (8, 32, 256)
SEQUENCES_PER_GPU = 16
HOME_SHORTLIST = 0.15  # homes weighed: one phase within this share of the best
HOME_WINDOW = 4        # batches over which the home is chosen
MILP_LAYOUTS = ["dp8", "dp4tp2", "dp2tp4", "tp8", "dp4pp2"]
MILP_MEMORY_GIB = 48
OPTIONS = dict(max_context=MAX_CONTEXT, long_sequences="truncate")
# Every candidate weighed with and without activation recomputation (the plan CLI's default).
RECOMPUTE_ALL = ("none", "selective", "full")
# Context parallelism: cp up to a node, 128K context, steps of a few long documents per GPU
# over wlbllm.lengths and the long tail of wikipedia.lengths (documents of 8K tokens or more).
CP_MAX = 8
CP_MAX_CONTEXT = 131072
# CUDA graph buckets: graphed layers keep this share of the fixed cost per layer (assumed).
GRAPH_BUCKETS = (1024, 2048, 4096, 8192, 16384)
GRAPH_OVERHEAD_SHARE = 0.1
GRAPH_GPUS, GRAPH_GPUS_QUICK = (8, 32), (8,)
CP_GPUS, CP_GPUS_QUICK = (32, 256), (32,)  # switch costs among 110 candidates of 256 GPUs take ~1 min
CP_SEQUENCES_PER_GPU = 4
CP_TAIL_FROM = 8192
CP_STEPS, CP_STEPS_QUICK = 6, 2


def load_distributions(data_dir: str) -> dict:
    """{name: lengths} of every ``*.lengths`` file in ``data_dir``; the standard library's
    files (written by ``python -m hotswitch.cli.lengths``) when there is none."""
    files = sorted(f for f in os.listdir(data_dir) if f.endswith(".lengths")) if os.path.isdir(data_dir) else []
    if files:
        return {f[: -len(".lengths")]: load_lengths(os.path.join(data_dir, f)) for f in files}
    print(f"no *.lengths files in {data_dir}; using the Python standard library's files", file=sys.stderr)
    from hotswitch.cli import lengths as lengths_cli
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stdlib.lengths")
        lengths_cli.main(["-o", path])
        return {"stdlib": load_lengths(path)}


class Setups:
    """Planners per (GPUs, home), their switch costs built once per world and home; each
    phase may run with the ``recompute`` modes; the candidates are every layout the model
    divides with cp up to ``max_cp``; switch costs by ``method`` (``planning.switch_costs``)."""

    def __init__(self, hardware, recompute=("none",), max_cp=1, max_context=MAX_CONTEXT, method="auto"):
        self.model = hs.ModelConfig.preset(MODEL)
        self.hardware = hardware
        self.max_cp, self.max_context, self.method = max_cp, max_context, method
        self.options = dict(OPTIONS, max_context=max_context, recompute=list(recompute))
        self.planners = {}
        self.costs = {}
        self.graph_planners = {}
        self.caches = {}
        self.params_switch = {}

    def home(self, gpus: int, batch) -> int:
        """The layout a Megatron-LM user would fix: the best static one for a batch that
        must hold the max context (as ``python -m hotswitch.cli.plan`` picks it)."""
        topology = hs.Topology(gpus, GPUS_PER_NODE)
        candidates = planning.auto_candidates(self.model, gpus, self.max_cp)
        n = len(candidates)
        probe = hs.Planner(hs.CostModel(self.model, self.hardware, topology, zero=True), candidates, 0,
                           [[0.0] * n for _ in range(n)], [0.0] * n, **self.options)
        cap = self.max_context
        return probe.plan([min(s, cap) for s in batch] + [cap]).best_static_candidate

    def planner(self, gpus: int, home: int):
        key = (gpus, home)
        if key not in self.planners:
            topology = hs.Topology(gpus, GPUS_PER_NODE)
            candidates = planning.auto_candidates(self.model, gpus, self.max_cp)
            t0 = time.perf_counter()
            cache = self.caches.setdefault(gpus, _C.PlanCache())
            # The parameters' switches do not depend on the home: built once per world.
            params = self.params_switch.get(gpus)
            costs = planning.switch_costs(self.model, self.hardware, topology, candidates, home, method=self.method,
                                          cache=cache, params_switch=params)
            self.params_switch[gpus] = costs[0]
            self.costs[key] = costs
            self.planners[key] = planning.build_planner(self.model, self.hardware, topology, candidates, home,
                                                        costs=costs, **self.options)
            print(f"  {gpus} GPUs: {len(candidates)} candidates, home {candidates[home].name}, switch costs in "
                  f"{time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return self.planners[key]

    def graph_planner(self, gpus: int, home: int, graphs: dict):
        """``planner(gpus, home)`` with the cost model's CUDA graph options ``graphs``, cached by
        them."""
        key = (gpus, home, json.dumps(graphs, sort_keys=True))
        if key not in self.graph_planners:
            self.planner(gpus, home)  # its switch costs
            topology = hs.Topology(gpus, GPUS_PER_NODE)
            candidates = planning.auto_candidates(self.model, gpus, self.max_cp)
            self.graph_planners[key] = planning.build_planner(self.model, self.hardware, topology, candidates, home,
                                                              costs=self.costs[gpus, home], graphs=graphs,
                                                              **self.options)
        return self.graph_planners[key]

    def homes(self, gpus: int, batches, share: float = HOME_SHORTLIST) -> list:
        """The candidates worth weighing as home (a home holds the masters; it need not hold
        the longest sequence): those whose one phase over the pieces of the batches it holds,
        scaled to all their tokens, is predicted within ``share`` of the best (the cost
        model's estimate), and the home a Megatron-LM user would fix (``home``)."""
        fixed = self.home(gpus, batches[0])
        probe = self.planner(gpus, fixed)
        pieces = [[p.length for p in probe.pieces(b)] for b in batches]
        total = sum(sum(b) for b in pieces)
        times = {}
        for c in range(len(probe.candidates)):
            budget = probe.micro_batch_budget(c)
            held = [[s for s in b if s <= budget] for b in pieces]
            tokens = sum(sum(b) for b in held)
            if tokens < total / 2:
                continue
            times[c] = total / tokens * sum(probe.objective(b, [c] * len(b)).total_seconds for b in held if b)
        best = min(times.values())
        return sorted({c for c, t in times.items() if t <= best * (1 + share)} | {fixed})

    def move_seconds(self, gpus: int):
        """``home_move_seconds`` between candidates of this world, cached."""
        topology = hs.Topology(gpus, GPUS_PER_NODE)
        candidates = planning.auto_candidates(self.model, gpus, self.max_cp)
        cache = self.caches.setdefault(gpus, _C.PlanCache())
        memo = {}

        def seconds(a, b):
            if (a, b) not in memo:
                memo[a, b] = planning.home_move_seconds(self.model, self.hardware, topology, candidates, a, b,
                                                        method=self.method, cache=cache)
            return memo[a, b]
        return seconds


def rank_orders(setups, dists, steps, seed, gpu_counts=SIM_GPUS) -> dict:
    """Switch seconds of planned steps with every candidate in Megatron's rank order and with
    the order ``hotswitch.planner.choose_model_orders`` picks per candidate (the home's fixed),
    over the same steps of the first distribution: seconds saved per step and the share."""
    name, lengths = next(iter(dists.items()))
    out = {"switch_seconds_saved_by_order": {}, "switch_share_saved_by_order": {},
           "sim_speedup_order_vs_megatron_order": {}, "orders_changed": {}, "order_saving_per_use_max_s": {},
           "order_distribution": name}
    for gpus in gpu_counts:
        batch = SEQUENCES_PER_GPU * gpus
        rng = random.Random(seed)
        home = setups.home(gpus, [rng.choice(lengths) for _ in range(batch)])
        megatron = setups.planner(gpus, home)
        topology = hs.Topology(gpus, GPUS_PER_NODE)
        cache = setups.caches.setdefault(gpus, _C.PlanCache())
        candidates, saved = planning.choose_model_orders(setups.model, setups.hardware, topology,
                                                         list(megatron.candidates), home, method=setups.method,
                                                         cache=cache)
        ordered = planning.build_planner(setups.model, setups.hardware, topology, candidates, home,
                                         method=setups.method, **setups.options)
        a = simulate(megatron, lengths, steps, batch, seed=seed + 1)
        b = simulate(ordered, lengths, steps, batch, seed=seed + 1)
        key = str(gpus)
        out["switch_seconds_saved_by_order"][key] = (a["switch_s"] - b["switch_s"]) / steps
        out["switch_share_saved_by_order"][key] = (a["switch_s"] - b["switch_s"]) / a["switch_s"] if a["switch_s"] else 0.0
        out["sim_speedup_order_vs_megatron_order"][key] = a["hot_s"] / b["hot_s"]
        out["orders_changed"][key] = sum(1 for s in saved if s > 0)
        # What one use of a reordered candidate saves (switch in, back, gradients home), whether
        # or not the steps above use it.
        out["order_saving_per_use_max_s"][key] = max(saved)
        print(f"rank order, {name}, {gpus} GPUs (home {megatron.candidates[home].name}): {sum(1 for s in saved if s > 0)} "
              f"of {len(candidates)} candidates change order; switching {a['switch_s'] / steps:.4f} -> "
              f"{b['switch_s'] / steps:.4f} s per step; step speedup over Megatron's orders "
              f"{a['hot_s'] / b['hot_s']:.4f}x (predictions)")
    return out


def p50(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if xs else float("nan")


def plan_times(setups, dists, gpus, sequences, steps, seed):
    """Median ms of Planner.plan per distribution and pooled."""
    per, pooled = {}, []
    for name, lengths in dists.items():
        rng = random.Random(seed)
        batches = [[rng.choice(lengths) for _ in range(sequences)] for _ in range(steps + 1)]
        planner = setups.planner(gpus, setups.home(gpus, batches[0]))
        planner.plan(batches[0])  # warm-up
        times = []
        for batch in batches[1:]:
            t0 = time.perf_counter()
            planner.plan(batch)
            times.append((time.perf_counter() - t0) * 1e3)
        per[name] = p50(times)
        pooled += times
    return p50(pooled), per


def milp_gaps(dists, hardware, cases, time_limit, seed):
    """Gap of the planner's objective to the MILP on ``cases`` small random steps.

    Lengths are drawn from the documents the candidates can hold in one micro-batch (longer
    ones are left out of the draw, not clipped). Returns one row per step: the planner's
    objective, CBC's value and best bound, and whether CBC proved optimality within
    ``time_limit``; the longest length a candidate holds (tokens); and, per distribution, the
    share of documents left out of the draw."""
    model = hs.ModelConfig.preset(MODEL)
    hw = hs.HardwareProfile.from_dict(dict(hardware.to_dict(), memory_bytes=MILP_MEMORY_GIB << 30))
    topology = hs.Topology(8, GPUS_PER_NODE)
    layouts = [hs.Layout.parse(n) for n in MILP_LAYOUTS]
    costs = {}
    rng = random.Random(seed)
    names = sorted(dists)
    rows, left_out, longest = [], {}, None
    for case in range(cases):
        home = case % len(layouts)
        if home not in costs:
            costs[home] = planning.switch_costs(model, hw, topology, layouts, home, method="plans")
        planner = planning.build_planner(model, hw, topology, layouts, home, costs=costs[home], exact_fallback=False)
        holds = max(planner.micro_batch_budget(i) for i in range(len(layouts)))
        name = names[case % len(names)]
        fits = [s for s in dists[name] if s <= holds]
        longest = holds if longest is None else min(longest, holds)
        left_out[name] = 1 - len(fits) / len(dists[name])
        if not fits:
            raise SystemExit(f"benchmarks.planner: no document of {name} fits {holds} tokens")
        step = [rng.choice(fits) for _ in range(rng.randint(12, 24))]
        plan = planner.plan(step)
        assignment = [None] * len(plan.pieces)
        for ph in plan.phases:
            for i in ph.sequences:
                assignment[i] = ph.candidate
        pieces = [p.length for p in plan.pieces]
        ours = planner.objective(pieces, assignment).total_seconds
        result = milp.solve(planner, pieces, time_limit=time_limit, start=assignment)
        best = (planner.objective(pieces, result["assignment"]).total_seconds if result["assignment"] is not None
                else None)
        rows.append({"ours_s": ours, "milp_s": best, "bound_s": result["bound_s"], "proven": result["optimal"],
                     "solve_s": result["solve_s"]})
    return rows, longest, left_out


def context_parallel(dists, hardware, steps, seed, gpu_counts=CP_GPUS) -> dict:
    """Hot switching with cp layouts among the candidates against without, at the 128K
    context (module docstring): per distribution and GPUs, predicted seconds of the same
    steps; each planner's home is its own best static layout for a batch holding the max
    context."""
    out = {"sim_speedup_cp_vs_no_cp": {}, "sim_speedup_vs_home_cp": {}, "sim_speedup_vs_static_cp": {},
           "sim_layouts_cp": {}, "cp_max": CP_MAX, "cp_max_context": CP_MAX_CONTEXT, "cp_steps": steps}
    with_cp = Setups(hardware, RECOMPUTE_ALL, max_cp=CP_MAX, max_context=CP_MAX_CONTEXT, method="estimate")
    without = Setups(hardware, RECOMPUTE_ALL, max_cp=1, max_context=CP_MAX_CONTEXT, method="estimate")
    print(f"context parallelism: {MODEL}, max context {CP_MAX_CONTEXT}, cp up to {CP_MAX}, "
          f"{CP_SEQUENCES_PER_GPU} sequences per GPU, every recompute mode (predictions):")
    print(f"{'distribution':<22}{'GPUs':>6}{'cp vs no cp':>13}{'vs home':>9}{'vs static':>11}  layouts used (phases)")
    tails = {"wlbllm": dists.get("wlbllm")}
    if "wikipedia" in dists:
        tails[f"wikipedia>={CP_TAIL_FROM}"] = [s for s in dists["wikipedia"] if s >= CP_TAIL_FROM]
    if not any(v for v in tails.values()):  # other data: the tail of each distribution
        tails = {f"{n}>={CP_TAIL_FROM}": [s for s in l if s >= CP_TAIL_FROM] for n, l in dists.items()}
    for name, lengths in tails.items():
        if not lengths:
            continue
        for key in out:
            if isinstance(out[key], dict):
                out[key][name] = {}
        for gpus in gpu_counts:
            batch = CP_SEQUENCES_PER_GPU * gpus
            rng = random.Random(seed)
            probe = [rng.choice(lengths) for _ in range(batch)]
            sims = {}
            for label, setups in (("cp", with_cp), ("no_cp", without)):
                home = setups.home(gpus, probe)
                planner = setups.planner(gpus, home)
                sims[label] = simulate(planner, lengths, steps, batch, seed=seed + 1)
                if label == "cp":
                    fixed = hs.Planner(planner.cost, [planner.candidates[home]], 0, [[0.0]], [0.0],
                                       **setups.options)
                    sims["home"] = simulate(fixed, lengths, steps, batch, seed=seed + 1)
            cp = sims["cp"]
            out["sim_speedup_cp_vs_no_cp"][name][str(gpus)] = sims["no_cp"]["hot_s"] / cp["hot_s"]
            out["sim_speedup_vs_home_cp"][name][str(gpus)] = sims["home"]["hot_s"] / cp["hot_s"]
            out["sim_speedup_vs_static_cp"][name][str(gpus)] = cp["static_s"] / cp["hot_s"]
            used = sorted(cp["layouts"].items(), key=lambda kv: -kv[1])
            out["sim_layouts_cp"][name][str(gpus)] = dict(used)
            print(f"{name:<22}{gpus:>6}{out['sim_speedup_cp_vs_no_cp'][name][str(gpus)]:>12.3f}x"
                  f"{out['sim_speedup_vs_home_cp'][name][str(gpus)]:>8.3f}x"
                  f"{out['sim_speedup_vs_static_cp'][name][str(gpus)]:>10.3f}x  "
                  + " ".join(f"{l}:{c}" for l, c in used[:6]))
    return out


def graph_estimates(dists, hardware, steps, seed, gpu_counts=GRAPH_GPUS, setups=None) -> dict:
    """Hot switching under CUDA graph buckets whose graphs cut the fixed cost per layer to
    ``GRAPH_OVERHEAD_SHARE`` of the profile's (an assumption: the fixed cost a graphed layer keeps
    is unmeasured on a GPU). Per distribution and GPU count, on the same steps:

    - ``sim_speedup_graph_estimate``: the program's estimate weighing the buckets over the same
      planner whose estimate does not (``graph_estimate=False``; both pack every phase exactly,
      graphs weighed), every layout that can capturing graphs;
    - ``sim_speedup_graph_layouts``: graphs captured only by the home and the layouts the
      planner without graphs uses on probe batches (``graph_layouts``) over every layout
      capturing them, whose weight copies all take memory;
    - ``sim_speedup_graphs_vs_none``: that planner over the planner without graph buckets;
    - ``sim_speedup_vs_static_graphs``: it over the best static layout of each step, and
      ``sim_speedup_vs_static_run_graphs`` over the best layout fixed for the run, which
      alone captures graphs and holds its copies (``static_run_seconds``).

    With ``setups`` (the main simulation's ``Setups``, of the same hardware), the run as the
    runtime makes it under ``graph_layouts="auto"`` with a moving home (``home_window``): the
    home chosen over the probe batches and moved as in the main simulation
    (``simulate_moving_home``), the graph layouts chosen at its first step (the start home
    and the layouts the planner without graphs gives that batch, ``auto_graph_layouts``) and
    kept: ``sim_speedup_vs_static_run_graphs_moving_home`` over the same best layout fixed for
    the run, ``graph_layouts_auto`` and ``graph_homes``."""
    model = hs.ModelConfig.preset(MODEL)
    graphs = dict(graph_buckets=list(GRAPH_BUCKETS), graph_copy_param_bytes=2,
                  graph_layer_overhead_seconds=GRAPH_OVERHEAD_SHARE * hardware.layer_overhead_seconds)
    out = {k: {} for k in ("sim_speedup_graph_estimate", "sim_speedup_graph_layouts", "sim_speedup_graphs_vs_none",
                           "sim_speedup_vs_static_graphs", "sim_speedup_vs_static_run_graphs", "graph_layouts")}
    if setups is not None:
        out.update({k: {} for k in ("sim_speedup_vs_static_run_graphs_moving_home", "graph_layouts_auto",
                                    "graph_homes")})
    for name, lengths in dists.items():
        for gpus in gpu_counts:
            topology = hs.Topology(gpus, GPUS_PER_NODE)
            candidates = planning.auto_candidates(model, gpus, 1)
            n = len(candidates)
            probe = hs.Planner(hs.CostModel(model, hardware, topology, zero=True), candidates, 0,
                               [[0.0] * n for _ in range(n)], [0.0] * n, **OPTIONS)
            home = probe.plan([MAX_CONTEXT] * SEQUENCES_PER_GPU).best_static_candidate
            costs = planning.switch_costs(model, hardware, topology, candidates, home)
            plain = planning.build_planner(model, hardware, topology, candidates, home, costs=costs, **OPTIONS)
            rng = random.Random(seed + 2)  # probe batches: not the simulated ones
            named = planning.auto_graph_layouts(plain, [[rng.choice(lengths) for _ in range(SEQUENCES_PER_GPU * gpus)]
                                                        for _ in range(HOME_WINDOW)])
            runs = {}
            for key, options in (("blind", dict(graphs=graphs, graph_estimate=False)), ("every", dict(graphs=graphs)),
                                 ("named", dict(graphs=dict(graphs, graph_layouts=named))), ("none", {})):
                planner = planning.build_planner(model, hardware, topology, candidates, home, costs=costs,
                                                 **options, **OPTIONS)
                runs[key] = simulate(planner, lengths, steps, SEQUENCES_PER_GPU * gpus, seed=seed + 1,
                                     static_run=dict(OPTIONS) if key == "every" else None)
            key = str(gpus)
            hot = {k: r["hot_s"] for k, r in runs.items()}
            out["sim_speedup_graph_estimate"].setdefault(name, {})[key] = hot["blind"] / hot["every"]
            out["sim_speedup_graph_layouts"].setdefault(name, {})[key] = hot["every"] / hot["named"]
            out["sim_speedup_graphs_vs_none"].setdefault(name, {})[key] = hot["none"] / hot["named"]
            out["sim_speedup_vs_static_graphs"].setdefault(name, {})[key] = runs["named"]["static_s"] / hot["named"]
            # Each layout alone captures its own graphs and holds its copies only.
            out["sim_speedup_vs_static_run_graphs"].setdefault(name, {})[key] = \
                runs["every"]["static_run_s"] / hot["named"]
            out["graph_layouts"].setdefault(name, {})[key] = named
            if setups is not None:
                batch = SEQUENCES_PER_GPU * gpus
                rng = random.Random(seed)  # the main simulation's probe batches
                window = [[rng.choice(lengths) for _ in range(batch)] for _ in range(HOME_WINDOW)]
                homes = setups.homes(gpus, window)
                start, _ = planning.choose_home(lambda h: setups.planner(gpus, h), homes, window)
                first = random.Random(seed + 1)  # the first simulated step, as simulate draws it
                auto = planning.auto_graph_layouts(setups.planner(gpus, start),
                                                   [[first.choice(lengths) for _ in range(batch)]])
                options = dict(graphs, graph_layouts=auto)
                moving = simulate_moving_home(lambda h: setups.graph_planner(gpus, h, options), homes, lengths, steps,
                                              batch, seed=seed + 1, window=HOME_WINDOW,
                                              move_seconds=setups.move_seconds(gpus), start=window)
                out["sim_speedup_vs_static_run_graphs_moving_home"].setdefault(name, {})[key] = \
                    runs["every"]["static_run_s"] / moving["hot_s"]
                out["graph_layouts_auto"].setdefault(name, {})[key] = auto
                out["graph_homes"].setdefault(name, {})[key] = sorted(set(moving["homes"]))
                print(f"graphs, {name}, {gpus} GPUs, graph_layouts auto {','.join(auto)} with the home moving "
                      f"({','.join(sorted(set(moving['homes'])))}): "
                      f"{out['sim_speedup_vs_static_run_graphs_moving_home'][name][key]:.4f}x over "
                      f"{runs['every']['static_run']} fixed for the run")
            print(f"graphs ({GRAPH_OVERHEAD_SHARE:.0%} of the fixed cost per layer), {name}, {gpus} GPUs, home "
                  f"{candidates[home].name}: estimate weighing the buckets "
                  f"{out['sim_speedup_graph_estimate'][name][key]:.4f}x over not; graphs only in "
                  f"{','.join(named)} {out['sim_speedup_graph_layouts'][name][key]:.4f}x over in every layout, "
                  f"{out['sim_speedup_graphs_vs_none'][name][key]:.4f}x over no graphs, "
                  f"{out['sim_speedup_vs_static_graphs'][name][key]:.4f}x over the best static layout per step, "
                  f"{out['sim_speedup_vs_static_run_graphs'][name][key]:.4f}x over "
                  f"{runs['every']['static_run']} fixed for the run")
    out["graph_overhead_share"] = GRAPH_OVERHEAD_SHARE
    out["graph_buckets"] = list(GRAPH_BUCKETS)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.planner", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer steps and MILP cases (under two minutes)")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="directory of *.lengths files")
    parser.add_argument("--hardware", default="a800", help="a preset name or a profile FILE.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixed-plan", default=None, metavar="FILE.json",
                        help="a hand-written plan ([upper_bound, layout, recompute] entries) to simulate beside ours: "
                             "sim_speedup_vs_fixed")
    parser.add_argument("--fixed-plan-gpus", type=int, default=8, choices=SIM_GPUS,
                        help="the GPU count whose cases the fixed plan is for (default 8)")
    args = parser.parse_args(argv)
    try:
        hardware = load_hardware(args.hardware)
    except ValueError as e:
        parser.error(str(e))
    start = time.perf_counter()
    timing_steps, sim_steps = (5, 3) if args.quick else (20, 10)
    cases, time_limit = (8, 30.0) if args.quick else (24, 120.0)

    dists = load_distributions(args.data_dir)
    print(f"distributions: {', '.join(f'{n} ({len(l)} documents)' for n, l in dists.items())}; "
          f"{MODEL} on {hardware.name}, max context {MAX_CONTEXT}")
    setups = Setups(hardware)
    out = {"model": MODEL, "hardware": hardware.name, "distributions": sorted(dists)}

    ms32, per32 = plan_times(setups, dists, 32, 1024, timing_steps, args.seed)
    ms256, per256 = plan_times(setups, dists, 256, 4096, timing_steps, args.seed)
    out["plan_ms_p50_1024seq_32gpu"] = ms32
    ms32r, _ = plan_times(Setups(hardware, RECOMPUTE_ALL), dists, 32, 1024, timing_steps, args.seed)
    out["plan_ms_p50_1024seq_32gpu_recompute"] = ms32r
    out["plan_ms_p50_4096seq_256gpu"] = ms256
    # cp layouts among the candidates (cp up to a node): the same steps, switch costs from
    # receive volumes (plans for 52 candidates take minutes; the planner's time does not
    # depend on the costs' values).
    ms32cp, _ = plan_times(Setups(hardware, max_cp=CP_MAX, method="estimate"), dists, 32, 1024, timing_steps,
                           args.seed)
    out["plan_ms_p50_1024seq_32gpu_cp"] = ms32cp
    out["plan_ms_p50_by_distribution"] = {"1024seq_32gpu": per32, "4096seq_256gpu": per256}
    print(f"planning: 1024 sequences on 32 GPUs {ms32:.1f} ms ({ms32r:.1f} ms weighing recomputation, "
          f"{ms32cp:.1f} ms with cp layouts up to cp{CP_MAX}), 4096 on "
          f"256 GPUs {ms256:.1f} ms (median of {timing_steps} steps per distribution)")

    rows, longest, left_out = milp_gaps(dists, hardware, cases, time_limit, args.seed)
    proven = [r for r in rows if r["proven"]]
    unproven = [r for r in rows if not r["proven"]]
    gaps = sorted(r["ours_s"] / r["milp_s"] - 1 for r in proven)
    # Unproven steps: the optimum lies between CBC's bound and its best value, so the gap is
    # at most ours / bound - 1 (and at least ours / best value - 1).
    bounded = [r["ours_s"] / r["bound_s"] - 1 for r in unproven if r["bound_s"] and r["bound_s"] > 0]
    out["milp_cases"] = len(rows)
    out["milp_proven"] = len(proven)
    out["milp_unproven"] = len(unproven)
    out["milp_unproven_without_bound"] = len(unproven) - len(bounded)
    out["gap_vs_milp_median"] = p50(gaps)
    out["gap_vs_milp_max"] = max(gaps) if gaps else float("nan")
    out["gap_vs_milp_unproven_upper_max"] = max(bounded) if bounded else float("nan")
    out["gap_vs_milp_unproven_lower_max"] = max(
        (r["ours_s"] / r["milp_s"] - 1 for r in unproven if r["milp_s"]), default=float("nan"))
    out["gap_vs_milp_upper_max_all"] = (max(gaps + bounded) if len(gaps) + len(bounded) == len(rows)
                                        else float("nan"))
    out["milp_ms_median"] = p50([r["solve_s"] * 1e3 for r in proven])
    out["milp_max_length"] = longest
    out["milp_lengths_left_out_share"] = left_out
    unproven_note = (f"over unproven steps at most {out['gap_vs_milp_unproven_upper_max']:.2%} (CBC's bound"
                     + (f"; {out['milp_unproven_without_bound']} without one)" if len(bounded) < len(unproven) else ")")
                     if unproven else "none unproven")
    print(f"MILP: {len(rows)} steps, {len(proven)} proven optimal, {len(unproven)} not within {time_limit:.0f} s; "
          f"gap of the planner over proven steps median {out['gap_vs_milp_median']:.2%}, "
          f"max {out['gap_vs_milp_max']:.2%}; {unproven_note}; CBC median {out['milp_ms_median']:.0f} ms")
    print(f"MILP lengths drawn from the documents of at most {longest} tokens (what one candidate holds); left out: "
          + ", ".join(f"{n} {share:.1%}" for n, share in left_out.items()))

    fixed = None
    if args.fixed_plan:
        try:
            fixed = planning.load_fixed_plan(args.fixed_plan, args.fixed_plan_gpus, setups.model, MAX_CONTEXT)
        except ValueError as e:
            parser.error(str(e))
    speedup, share, layouts, vs_home, vs_padded, vs_fixed, moves, homes_used = {}, {}, {}, {}, {}, {}, {}, {}
    print("simulated (cost model predictions, nothing run); speedups over the best static layout packed per "
          "sequence (per step), the home layout fixed for the run, and padded static:")
    print(f"{'distribution':<14}{'GPUs':>6}{'batch':>7}{'hot tok/s':>13}{'static tok/s':>14}{'speedup':>9}"
          f"{'vs home':>9}{'vs padded':>10}{'switching':>11}{'moves':>7}  homes; layouts used (phases)")
    for name, lengths in dists.items():
        speedup[name], share[name], layouts[name] = {}, {}, {}
        for gpus in SIM_GPUS:
            batch = SEQUENCES_PER_GPU * gpus
            rng = random.Random(args.seed)
            # Batches seen before the run: the window the first home is chosen over.
            probe = [[rng.choice(lengths) for _ in range(batch)] for _ in range(HOME_WINDOW)]
            home = setups.home(gpus, probe[0])
            homes = setups.homes(gpus, probe)
            entries = None
            if fixed is not None and gpus == args.fixed_plan_gpus:
                entries = planning.fixed_plan_entries(fixed, setups.planner(gpus, home).candidates)
            sim = simulate_moving_home(lambda h: setups.planner(gpus, h), homes, lengths, sim_steps, batch,
                                       seed=args.seed + 1, window=HOME_WINDOW, move_seconds=setups.move_seconds(gpus),
                                       start=probe, fixed=entries)
            # The same steps under the Megatron user's home layout alone: a layout fixed for the run.
            planner = setups.planner(gpus, home)
            alone = hs.Planner(planner.cost, [planner.candidates[home]], 0, [[0.0]], [0.0], **OPTIONS)
            fixed_s = simulate(alone, lengths, sim_steps, batch, seed=args.seed + 1)["hot_s"]
            vs_home.setdefault(name, {})[str(gpus)] = fixed_s / sim["hot_s"]
            vs_padded.setdefault(name, {})[str(gpus)] = sim["padded_s"] / sim["hot_s"]
            if entries is not None:
                vs_fixed.setdefault(name, {})[str(gpus)] = sim["fixed_s"] / sim["hot_s"]
            moves.setdefault(name, {})[str(gpus)] = sim["moves"]
            homes_used.setdefault(name, {})[str(gpus)] = sorted(set(sim["homes"]))
            speedup[name][str(gpus)] = sim["static_s"] / sim["hot_s"]
            share[name][str(gpus)] = sim["switch_s"] / sim["hot_s"]
            used = sorted(sim["layouts"].items(), key=lambda kv: -kv[1])
            layouts[name][str(gpus)] = dict(used)
            print(f"{name:<14}{gpus:>6}{batch:>7}{sim['tokens'] / sim['hot_s']:>13,.0f}"
                  f"{sim['tokens'] / sim['static_s']:>14,.0f}{speedup[name][str(gpus)]:>8.3f}x"
                  f"{vs_home[name][str(gpus)]:>8.3f}x{vs_padded[name][str(gpus)]:>9.1f}x"
                  f"{share[name][str(gpus)]:>11.1%}{sim['moves']:>7}  {','.join(sorted(set(sim['homes'])))}; "
                  + " ".join(f"{l}:{c}" for l, c in used[:6]))
    out["sim_steps"] = sim_steps
    out["sim_speedup_vs_static"] = speedup
    out["sim_speedup_vs_static_min"] = min(v for per_gpus in speedup.values() for v in per_gpus.values())
    out["sim_switch_share"] = share
    out["sim_speedup_vs_home"] = vs_home
    out["sim_speedup_vs_padded_static"] = vs_padded
    out["sim_home_moves"] = moves
    out["sim_homes"] = homes_used
    if fixed is not None:
        out["fixed_plan"] = args.fixed_plan
        out["sim_speedup_vs_fixed"] = vs_fixed
    out.update(rank_orders(setups, dists, sim_steps, args.seed))
    out.update(context_parallel(dists, hardware, CP_STEPS_QUICK if args.quick else CP_STEPS, args.seed,
                                CP_GPUS_QUICK if args.quick else CP_GPUS))
    out.update(graph_estimates(dists, hardware, sim_steps, args.seed, GRAPH_GPUS_QUICK if args.quick else GRAPH_GPUS,
                               setups=setups))
    out["seconds"] = time.perf_counter() - start

    print("RESULT " + json.dumps(rounded(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
