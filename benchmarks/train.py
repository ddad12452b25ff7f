"""Hot switching against the best static layout, end to end, on real processes.

Gloo ranks (2 by default, one thread each: more ranks than cores would time the scheduler)
train a small LLaMA-style model on blocks of the Python standard library's
source (byte tokens, long-tailed lengths up to --seq-length) under a per-rank memory
budget that only layouts splitting the model over several ranks meet for the longest
sequences. Every run goes through the launcher and ``hotswitch.train`` with the same seed,
so every run sees the same batches:

- static: every layout that holds a --seq-length sequence within the budget, one layout for
  the whole run, packed per sequence as hot switching is; the best measured is the baseline
  (``best_static``, ``speedup_vs_best_static``);
- hot switching: every step planned over all layouts of the world, with online
  re-calibration of the cost model from the measured times, after a start-up probe
  (``--probe``) has timed every layout and refit the model and chosen the home from it (the
  starting profile, ``examples/cpu_profile.json``, ranks the layouts of this machine wrong).

Runs are repeated (``--repeats``, default 3) and interleaved, each repetition in another
order; every figure is the median over repetitions. The first --warmup steps of every run
(cold caches, the first re-calibration) are left out of the figures.

    .venv/bin/python -m benchmarks.train [--quick]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A CPU rank's starting profile (the runtime refits it from measured times as it trains).
PROFILE = os.path.join(ROOT, "examples", "cpu_profile.json")


def _model_args(a) -> list:
    return ["--num-layers", str(a.num_layers), "--hidden-size", str(a.hidden_size), "--num-attention-heads", "4",
            "--seq-length", str(a.seq_length), "--global-batch-size", str(a.global_batch_size),
            "--global-batch-documents",
            "--train-iters", str(a.steps), "--lr", "1e-3", "--seed", "1234", "--no-progress",
            "--memory-budget-gb", repr(a.budget_mb / 1024), "--hardware", a.profile, "--log-interval", "1"]


def _run(a, extra, out_json, nproc) -> dict:
    cmd = [sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", str(nproc), "-m", "hotswitch.train",
           *_model_args(a), *extra, "--summary-json", out_json]
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-5000:])
        raise SystemExit(f"benchmarks.train: {' '.join(extra)} failed with exit code {proc.returncode}")
    with open(out_json) as f:
        summary = json.load(f)
    summary["wall_s"] = time.monotonic() - start
    return summary


def _figures(s: dict, warmup: int) -> dict:
    seconds = s["step_seconds"][warmup:]
    tokens = s["step_tokens"][warmup:]
    switch = s["step_switch_seconds"][warmup:]
    errors = s["prediction_errors"][warmup:]
    return {"tokens_per_s": sum(tokens) / sum(seconds), "switch_share": sum(switch) / sum(seconds),
            "pred_error_median": statistics.median(errors) if errors else None,
            "seconds": sum(seconds), "tokens": sum(tokens)}


def _static_candidates(a, world: int):
    """Layouts that hold a --seq-length sequence within the budget, and the one the planner
    predicts fastest for a batch of such sequences."""
    import hotswitch as hs
    from hotswitch import _C
    from hotswitch.planner import auto_candidates

    with open(PROFILE) as f:
        fields = dict(json.load(f), memory_bytes=int(a.budget_mb * 2**20))
    hw = _C.HardwareProfile.from_dict(fields)
    from hotswitch.cli.train import default_ffn_hidden_size

    ffn = default_ffn_hidden_size(a.hidden_size)
    cfg = hs.TransformerConfig(num_layers=a.num_layers, hidden_size=a.hidden_size, num_attention_heads=4,
                               num_query_groups=4, ffn_hidden_size=ffn, vocab_size=384,
                               max_position_embeddings=a.seq_length)
    layouts = auto_candidates(cfg.cost_config(), world)
    n = len(layouts)
    cost = hs.CostModel(cfg.cost_config(), hw, hs.Topology(world, world))
    planner = hs.Planner(cost, layouts, 0, [[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n)
    fits = [l for i, l in enumerate(layouts) if planner.micro_batch_budget(i) >= a.seq_length]
    if not fits:
        raise SystemExit(f"benchmarks.train: no layout holds {a.seq_length} tokens in {a.budget_mb} MiB")
    best = layouts[planner.plan([a.seq_length] * 4).best_static_candidate]
    return fits, best, {l.name: planner.micro_batch_budget(i) for i, l in enumerate(layouts)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="one repetition of 5 steps of 16 sequences (under two minutes)")
    p.add_argument("--steps", type=int, default=None, help="training steps per run (default 8)")
    p.add_argument("--warmup", type=int, default=None, help="steps left out of the figures (default 2)")
    p.add_argument("--repeats", type=int, default=None,
                   help="repetitions of every run, interleaved; figures are their medians (default 3; quick 2)")
    p.add_argument("--nproc", type=int, default=2, help="ranks (one thread each: keep it <= the cores)")
    p.add_argument("--num-layers", type=int, default=4)
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--seq-length", type=int, default=1024)
    p.add_argument("--global-batch-size", type=int, default=None, help="sequences per step (default 32; quick 16)")
    p.add_argument("--budget-mb", type=float, default=48.0,
                   help="per-rank memory budget the plans respect (48: on 2 ranks tp2 and pp2 hold --seq-length, "
                        "dp2 only shorter sequences)")
    a = p.parse_args(argv)
    a.steps = a.steps or 8
    a.warmup = a.warmup if a.warmup is not None else 2
    a.repeats = a.repeats or (2 if a.quick else 3)
    a.global_batch_size = a.global_batch_size or (16 if a.quick else 32)
    if a.steps <= a.warmup:
        p.error(f"--steps({a.steps}) must exceed --warmup({a.warmup})")
    cores = os.cpu_count() or 1
    if a.nproc > cores:
        print(f"warning: {a.nproc} ranks on {cores} cores time the scheduler as much as the layouts", flush=True)
    start = time.monotonic()
    fits, planned_best, budgets = _static_candidates(a, a.nproc)
    print(f"micro-batch token budgets at {a.budget_mb} MiB per rank: {budgets}; hold {a.seq_length} tokens: "
          f"{[l.name for l in fits]}", flush=True)
    a.profile = PROFILE
    runs = {l.name: ["--tensor-model-parallel-size", str(l.tp), "--pipeline-model-parallel-size", str(l.pp)]
            for l in fits}
    runs["hot"] = ["--hot-switch", "--candidate-layouts", "auto", "--explore", "0.5", "--probe"]
    names = list(runs)
    measured = {n: [] for n in names}
    hot_summaries = []
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(a.repeats):
            # Interleaved, each repetition in another order: drifts of a shared host fall on every run alike.
            for name in names[rep % len(names):] + names[:rep % len(names)]:
                s = _run(a, runs[name], os.path.join(tmp, f"{name}-{rep}.json"), a.nproc)
                measured[name].append(_figures(s, a.warmup))
                if name == "hot":
                    hot_summaries.append(s)
                print(f"repetition {rep + 1}: {name} {measured[name][-1]['tokens_per_s']:.0f} tok/s "
                      f"({s['wall_s']:.0f} s wall)", flush=True)
    median = {n: statistics.median(f["tokens_per_s"] for f in measured[n]) for n in names}
    static = {n: v for n, v in median.items() if n != "hot"}
    best = max(static, key=static.get)
    hot_summary = hot_summaries[-1]
    print(f"hot switching: {median['hot']:.0f} tok/s (median of {a.repeats}), layouts per step of the last run "
          f"{['+'.join(l) for l in hot_summary['step_layouts']]}", flush=True)
    print(f"prediction errors per step of the last run: {hot_summary['prediction_errors']}", flush=True)
    result = {
        # Baseline: the best measured static layout that holds --seq-length within the budget, every
        # such layout measured, packed per sequence like hot switching (not padded).
        "speedup_vs_best_static": round(median["hot"] / static[best], 4),
        "speedup_vs_best_static_per_repeat": [
            round(h["tokens_per_s"] / max(measured[n][i]["tokens_per_s"] for n in static), 4)
            for i, h in enumerate(measured["hot"])],
        "switch_share": round(statistics.median(f["switch_share"] for f in measured["hot"]), 4),
        "pred_error_median": round(statistics.median(f["pred_error_median"] for f in measured["hot"]
                                                     if f["pred_error_median"] is not None), 4),
        # Per step of the last hot run, warm-up included: |predicted - measured| / measured.
        "pred_error_per_step": [round(e, 4) for e in hot_summary["prediction_errors"]],
        "steps": a.steps,
        "warmup_steps": a.warmup,
        "repeats": a.repeats,
        "tokens_per_s_hot": round(median["hot"], 1),
        "tokens_per_s_best_static": round(static[best], 1),
        "best_static": best,
        "static_layouts_measured": sorted(static),
        # The starting profile's pick; the hot runs' home after the start-up probe refit the model.
        "planner_static_pick": planned_best.name,
        "hot_home": sorted({s["home"] for s in hot_summaries}),
        "static_tokens_per_s": {n: round(v, 1) for n, v in static.items()},
        "hot_layouts": sorted({l for s in hot_summaries for l in s["layouts"]}),
        "world": a.nproc,
        "threads_per_rank": max(1, cores // a.nproc),
        "model": {"num_layers": a.num_layers, "hidden_size": a.hidden_size, "seq_length": a.seq_length,
                  "global_batch_size": a.global_batch_size, "budget_mb": a.budget_mb},
        "seconds": round(time.monotonic() - start, 1),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
