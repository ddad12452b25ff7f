"""The cost model against measured GPU runs, and the planner with the fitted presets.

- Cross-validation on ``data/megatron_runs/runs.csv`` (``--runs``): for each model of the file
  (family, hidden size) in turn, the hardware profile is fitted to the other models' runs
  (``hotswitch.calibration.runs.fit``, base ``h100-datasheet``) and predicts the model left
  out. Over all held-out predictions: ``cv_median_abs_rel_error``, ``cv_max_abs_rel_error``
  and ``cv_pairwise_order_agreement`` (pairs of runs of one model, GPU count, seq_length and
  packing measured 5% or more apart, ordered alike), and per held-out model the same.
  ``fit_median_abs_rel_error`` (and max, pairwise): the fit on every run (``--quick``: the
  ``h100`` preset, which is that fit), ``runs``: the runs predicted.
- Simulation (``hotswitch.analysis.simulate``, predictions of the cost model, not
  measurements): LLaMA-7B, max context 32K (longer documents truncated), global batch 512
  sequences drawn from each ``*.lengths`` file of ``--data-dir``, on 8 and 32 GPUs (8 a
  node) of the fitted ``h100`` and ``a800`` presets. Every step time includes the optimizer
  step after the last phase (``CostModel.step_seconds`` of the layout that holds the
  optimizer state). Baselines, each a single layout for the whole run:
  ``sim_speedup_vs_home``: hot switching over its home layout, the best static layout that
  holds the max context, running the same packed steps (the speedup of switching itself);
  ``sim_speedup_vs_padded_static``: over the best static layout that pads every sequence to
  the max context, one sequence a micro-batch (Megatron-LM without packing). Switch costs come
  from redistribution plans (``--quick``: from the ranks' receive volumes, ``SwitchEstimate``).
  ``sim_layouts``: per run, each layout the hot plans used with the median shortest and
  longest piece it ran and how many phases.
- ``plan_ms_p50_1024seq_32gpu``: median wall time of ``Planner.plan`` for 1024 sequences on
  32 GPUs (a800 preset, all distributions pooled); ``plan_cpu_ms_p50_1024seq_32gpu`` its CPU
  time (the same on an idle host; on a shared one the wall time also counts other processes).

    .venv/bin/python -m benchmarks.costmodel [--quick] [--runs FILE.csv] [--data-dir DIR]
"""

import argparse
import json
import math
import os
import random
import statistics
import sys
import time

import numpy as np

import hotswitch as hs
from benchmarks import default_data_dir, rounded
from hotswitch import planner as planning
from hotswitch.analysis.simulate import simulate
from hotswitch.calibration import runs as measured
from hotswitch.data import load_lengths

DEFAULT_DATA_DIR = default_data_dir()
DEFAULT_RUNS = os.path.join(DEFAULT_DATA_DIR, "megatron_runs", "runs.csv")
MODEL = "llama-7b"
MAX_CONTEXT = 32768
GLOBAL_BATCH = 512
GPUS_PER_NODE = 8
SIM_GPUS = (8, 32)
SIM_HARDWARE = ("h100", "a800")
OPTIONS = dict(max_context=MAX_CONTEXT, long_sequences="truncate")


def cross_validate(runs, base, steps: int, iterations: int) -> dict:
    """Leave one (family, hidden_size) model out: fit on the rest, predict it."""
    usable = [r for r in runs if r.predictable]
    models = sorted({(r.family, r.hidden_size) for r in usable})
    predicted = np.empty(len(usable))
    per_model = {}
    for family, hidden in models:
        train = [r for r in usable if (r.family, r.hidden_size) != (family, hidden)]
        held = [i for i, r in enumerate(usable) if (r.family, r.hidden_size) == (family, hidden)]
        t0 = time.perf_counter()
        profile, report = measured.fit(train, base, steps=steps, iterations=iterations, name=f"without-{family}")
        result = measured.check([usable[i] for i in held], profile, steps=steps)
        predicted[held] = result.predicted_s
        per_model[f"{family}-{hidden}"] = dict(result.result(), fit_s=round(time.perf_counter() - t0, 1))
        print(f"  held out {family} h{hidden}: {len(held)} runs, median |error| {result.median_abs_rel_error:.3f}, "
              f"max {result.max_abs_rel_error:.3f}, pairs ordered {result.pairwise_order_agreement}", file=sys.stderr)
    measured_s = np.array([r.measured_s for r in usable])
    errors = np.abs(predicted / measured_s - 1)
    order, pairs = measured.pairwise_order_agreement(usable, predicted)
    return {"cv_median_abs_rel_error": float(np.median(errors)), "cv_max_abs_rel_error": float(errors.max()),
            "cv_pairwise_order_agreement": order, "cv_pairs": pairs, "cv_by_model": per_model}


def load_distributions(data_dir: str) -> dict:
    files = sorted(f for f in os.listdir(data_dir) if f.endswith(".lengths")) if os.path.isdir(data_dir) else []
    if not files:
        raise SystemExit(f"no *.lengths files in {data_dir}")
    return {f[: -len(".lengths")]: load_lengths(os.path.join(data_dir, f)) for f in files}


class Setup:
    """The planners of one hardware preset and GPU count, their home the best static layout
    that holds the max context."""

    def __init__(self, model, hardware, gpus: int, switch_method: str = "auto"):
        self.switch_method = switch_method
        self.topology = hs.Topology(gpus, GPUS_PER_NODE)
        self.cost = hs.CostModel(model, hardware, self.topology, zero=True)
        self.candidates = planning.auto_candidates(model, gpus)
        n = len(self.candidates)
        probe = hs.Planner(self.cost, self.candidates, 0, [[0.0] * n for _ in range(n)], [0.0] * n, **OPTIONS)
        self.holds = [probe.micro_batch_budget(i) >= MAX_CONTEXT for i in range(n)]
        self.probe = probe
        self.model, self.hardware, self.gpus = model, hardware, gpus
        self.planners = {}

    def home(self, batch) -> int:
        return self.probe.plan([min(s, MAX_CONTEXT) for s in batch] + [MAX_CONTEXT]).best_static_candidate

    def planner(self, home: int):
        """The hot-switching planner with this home (switch costs from redistribution plans)."""
        if home not in self.planners:
            self.planners[home] = planning.build_planner(self.model, self.hardware, self.topology, self.candidates,
                                                         home, method=self.switch_method, **OPTIONS)
        return self.planners[home]

    def padded_static(self) -> tuple:
        """(seconds, layout name) of the best layout padding every sequence to the max context."""
        best = (math.inf, None)
        for i, layout in enumerate(self.candidates):
            if not self.holds[i] or GLOBAL_BATCH % layout.dp:
                continue
            batches = [[[MAX_CONTEXT]] * (GLOBAL_BATCH // layout.dp) for _ in range(layout.dp)]
            seconds = self.cost.phase(layout, batches).total_seconds + self.cost.step_seconds(layout)
            best = min(best, (seconds, layout.name))
        return best


def layout_ranges(planner, lengths, steps: int, seed: int) -> dict:
    """Per layout the hot plans used: median shortest and longest piece, and phases."""
    rng = random.Random(seed)
    spans = {}
    for _ in range(steps):
        plan = planner.plan([rng.choice(lengths) for _ in range(GLOBAL_BATCH)])
        for ph in plan.phases:
            ls = [plan.pieces[i].length for i in ph.sequences]
            spans.setdefault(ph.layout.name, []).append((min(ls), max(ls)))
    ordered = sorted(spans.items(), key=lambda kv: min(a for a, _ in kv[1]))
    return {name: {"shortest": int(statistics.median(a for a, _ in s)),
                   "longest": int(statistics.median(b for _, b in s)), "phases": len(s)} for name, s in ordered}


def simulations(dists: dict, steps: int, seed: int, setups: dict, switch_method: str) -> dict:
    """Hot switching against its baselines per hardware, GPU count and distribution;
    ``setups`` caches a Setup per (hardware, GPUs)."""
    model = hs.ModelConfig.preset(MODEL)
    vs_home, vs_padded, layouts, homes = {}, {}, {}, {}
    print(f"{'hardware':<9}{'GPUs':>5} {'distribution':<12}{'home':>12}{'padded':>12}{'hot s':>9}{'home s':>9}"
          f"{'padded s':>10}{'vs home':>9}{'vs padded':>10}  layouts (shortest-longest)")
    for hw_name in SIM_HARDWARE:
        hardware = hs.HardwareProfile.preset(hw_name)
        for gpus in SIM_GPUS:
            if (hw_name, gpus) not in setups:
                setups[(hw_name, gpus)] = Setup(model, hardware, gpus, switch_method)
            setup = setups[(hw_name, gpus)]
            padded_s, padded_layout = setup.padded_static()
            for name, lengths in dists.items():
                key = f"{hw_name}/{gpus}/{name}"
                rng = random.Random(seed)
                home = setup.home([rng.choice(lengths) for _ in range(GLOBAL_BATCH)])
                planner = setup.planner(home)
                home_layout = setup.candidates[home]
                step_s = setup.cost.step_seconds(home_layout)
                hot = simulate(planner, lengths, steps, GLOBAL_BATCH, seed=seed + 1)
                fixed = hs.Planner(planner.cost, [home_layout], 0, [[0.0]], [0.0], **OPTIONS)
                home_s = simulate(fixed, lengths, steps, GLOBAL_BATCH, seed=seed + 1)["hot_s"] + steps * step_s
                hot_s = hot["hot_s"] + steps * step_s
                vs_home[key] = home_s / hot_s
                vs_padded[key] = steps * padded_s / hot_s
                homes[key] = {"home": home_layout.name, "padded_static": padded_layout}
                layouts[key] = layout_ranges(planner, lengths, steps, seed + 1)
                picks = " ".join(f"{l}({v['shortest']}-{v['longest']})" for l, v in layouts[key].items())
                print(f"{hw_name:<9}{gpus:>5} {name:<12}{home_layout.name:>12}{padded_layout:>12}{hot_s / steps:>9.2f}"
                      f"{home_s / steps:>9.2f}{padded_s:>10.2f}{vs_home[key]:>8.2f}x{vs_padded[key]:>9.2f}x  {picks}")
    return {"sim_speedup_vs_home": vs_home, "sim_speedup_vs_padded_static": vs_padded, "sim_layouts": layouts,
            "sim_baselines": homes, "sim_steps": steps}


def plan_time(dists: dict, steps: int, seed: int, setups: dict) -> tuple:
    """Median (wall, CPU) ms of Planner.plan: 1024 sequences on 32 A800s."""
    if ("a800", 32) not in setups:
        setups[("a800", 32)] = Setup(hs.ModelConfig.preset(MODEL), hs.HardwareProfile.preset("a800"), 32, "estimate")
    setup = setups[("a800", 32)]
    pooled = [s for lengths in dists.values() for s in lengths]
    rng = random.Random(seed)
    batches = [[rng.choice(pooled) for _ in range(1024)] for _ in range(steps + 1)]
    planner = setup.planner(setup.home(batches[0]))
    planner.plan(batches[0])  # warm-up
    wall, cpu = [], []
    for batch in batches[1:]:
        t0, c0 = time.perf_counter(), time.process_time()
        planner.plan(batch)
        wall.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - c0) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.costmodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer drawn steps and fit iterations (under two minutes)")
    parser.add_argument("--runs", default=DEFAULT_RUNS, help="CSV of measured runs")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR, help="directory of *.lengths files")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    fit_steps, iterations, sim_steps, timing_steps = (2, 12, 2, 5) if args.quick else (8, 60, 8, 20)
    # Switch costs from redistribution plans, or (quick) from the ranks' receive volumes.
    switch_method = "estimate" if args.quick else "plans"
    try:
        runs = measured.read_runs(args.runs)
    except ValueError as e:
        parser.error(str(e))
    base = hs.HardwareProfile.preset("h100-datasheet")
    out = {}
    print(f"cross-validation over {len(runs)} runs ({fit_steps} drawn steps a packed run, {iterations} iterations)")
    out.update(cross_validate(runs, base, fit_steps, iterations))
    if args.quick:
        fitted, source = hs.HardwareProfile.preset("h100"), "h100 preset"
    else:
        fitted, _ = measured.fit(runs, base, steps=fit_steps, iterations=iterations, name="h100")
        source = "fit on every run"
    result = measured.check(runs, fitted, steps=fit_steps)
    out["runs"] = len(result.runs)
    out["fit_source"] = source
    out["fit_median_abs_rel_error"] = result.median_abs_rel_error
    out["fit_max_abs_rel_error"] = result.max_abs_rel_error
    out["fit_pairwise_order_agreement"] = result.pairwise_order_agreement
    print(f"cross-validated: median |error| {out['cv_median_abs_rel_error']:.3f}, "
          f"max {out['cv_max_abs_rel_error']:.3f}, "
          f"pairs ordered {out['cv_pairwise_order_agreement']:.3f} of {out['cv_pairs']}; {source}: median "
          f"{out['fit_median_abs_rel_error']:.3f}, max {out['fit_max_abs_rel_error']:.3f}, pairs "
          f"{out['fit_pairwise_order_agreement']:.3f} over {out['runs']} runs")

    dists = load_distributions(args.data_dir)
    setups = {}
    out.update(simulations(dists, sim_steps, args.seed, setups, switch_method))
    out["plan_ms_p50_1024seq_32gpu"], out["plan_cpu_ms_p50_1024seq_32gpu"] = plan_time(dists, timing_steps, args.seed,
                                                                                      setups)
    print(f"planning: 1024 sequences on 32 GPUs {out['plan_ms_p50_1024seq_32gpu']:.2f} ms wall, "
          f"{out['plan_cpu_ms_p50_1024seq_32gpu']:.2f} ms CPU (median of {timing_steps})")
    out["seconds"] = time.perf_counter() - start

    print("RESULT " + json.dumps(rounded(out)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
