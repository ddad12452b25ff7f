"""Concurrent heterogeneous layouts against the best static layout and our sequential plan,
by the cost model (predictions, nothing runs): LLaMA-7B, A800 preset, 512 sequences per
step drawn from the length files, ``hotswitch.analysis.composite``.

Cases: wlbllm at 128K on 32 and 256 GPUs; 32K on 8/32/256 GPUs (wikipedia and wlbllm); a
long-context mix, wlbllm lengths x4 (up to ~500K tokens) at 512K on 64 and 256 GPUs. Each
figure is the median over ``--steps`` steps (2). ``gap_vs_exact``: the composite planner's time
over the exhaustive reference's (every partition, every assignment) on small cases, 8
sequences on 8 GPUs at 128K.

    .venv/bin/python -m benchmarks.composite [--quick]
"""

import argparse
import json
import random
import statistics
import sys
import time

from benchmarks import default_data_dir


CASES = [("wlbllm", 1, 131072, 32), ("wlbllm", 1, 131072, 256), ("wikipedia", 1, 32768, 8), ("wlbllm", 1, 32768, 8),
         ("wikipedia", 1, 32768, 32), ("wlbllm", 1, 32768, 32), ("wikipedia", 1, 32768, 256),
         ("wlbllm", 1, 32768, 256), ("wlbllm", 4, 524288, 64), ("wlbllm", 4, 524288, 256)]
QUICK = [("wlbllm", 1, 131072, 32), ("wikipedia", 1, 32768, 8)]


def main(argv=None) -> int:
    import os

    from hotswitch import _C
    from hotswitch.analysis.composite import composite_step, exact_composite
    from hotswitch.data import load_lengths

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="two cases, one step each, two exact cases")
    p.add_argument("--steps", type=int, default=None, help="steps per case (default 2; quick 1)")
    p.add_argument("--global-batch", type=int, default=512)
    p.add_argument("--data", default=default_data_dir())
    a = p.parse_args(argv)
    steps = a.steps or (1 if a.quick else 2)
    start = time.monotonic()
    model, hardware = _C.ModelConfig.preset("llama-7b"), _C.HardwareProfile.preset("a800")
    data = {n: load_lengths(os.path.join(a.data, f"{n}.lengths")) for n in ("wikipedia", "wlbllm")}
    vs_static, vs_sequential, groups, plan_s = {}, {}, {}, []
    for name, scale, context, gpus in (QUICK if a.quick else CASES):
        rng = random.Random(11)
        cache: dict = {}
        label = f"{name}{'x' + str(scale) if scale > 1 else ''}/{context // 1024}K/{gpus}"
        s, q = [], []
        for step in range(steps):
            batch = [rng.choice(data[name]) * scale for _ in range(a.global_batch)]
            t0 = time.perf_counter()
            # The local search re-plans groups of hundreds of sequences: fewer moves on big worlds.
            r = composite_step(model, hardware, gpus, 8, batch, context, cache=cache, moves=16 if gpus <= 64 else 4)
            plan_s.append(time.perf_counter() - t0)
            s.append(r["speedup_vs_static"])
            q.append(r["speedup_vs_sequential"])
            groups[label] = [f"{g['size']}:{g['layout']}" for g in (r["groups"] or [])]
            print(f"{label} step {step}: static {r['static_s']:.2f} s ({r['best_static']}), sequential "
                  f"{r['sequential_s']:.2f} s, composite {r['composite_s']:.2f} s {groups[label]}", flush=True)
        vs_static[label] = round(statistics.median(s), 3)
        vs_sequential[label] = round(statistics.median(q), 3)
    gaps = []
    rng = random.Random(3)
    cache = {}
    for _ in range(2 if a.quick else 6):
        batch = [rng.choice(data["wlbllm"]) for _ in range(8)]
        gaps.append(exact_composite(model, hardware, 8, 8, batch, 131072, cache=cache)["gap_vs_exact"])
    result = {
        # Baselines: the best static layout of the whole world (cp allowed, packed per sequence),
        # and our sequential hot plan over the same candidates. Predictions of the cost model.
        "sim_speedup_vs_static": vs_static,
        "sim_speedup_vs_sequential": vs_sequential,
        "groups_last_step": groups,
        "gap_vs_exact_max": round(max(gaps), 4),
        "gap_vs_exact": [round(g, 4) for g in gaps],
        "plan_seconds_p50": round(statistics.median(plan_s), 2),
        "steps": steps,
        "seconds": round(time.monotonic() - start, 1),
    }
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
