"""Dry run of the per-step planner: the plan of one step, or a simulation of many.

    /usr/bin/python3 -m hotswitch.plan --model llama-7b --gpus 32 --gpus-per-node 8 \\
        --hardware a800 --lengths FILE --global-batch 512 --max-context 32768 [--steps N]

Lengths files hold one integer per line (tokens of one document). Switch costs come from
the redistribution plans of the model's parameters between the layouts (largest per-rank
send over the link it crosses); nothing runs on devices.
"""

import argparse
import random
import sys
import time
from typing import List, Sequence

import hotswitch as hs
from hotswitch import _C

__all__ = ["auto_candidates", "build_planner", "load_lengths", "main"]


def load_lengths(path: str) -> List[int]:
    """Reads one positive integer per line; ValueError naming the file and line otherwise."""
    try:
        with open(path) as f:
            text = f.read().split("\n")
    except OSError as e:
        raise ValueError(f"cannot read lengths file {path!r}: {e.strerror}") from None
    out = []
    for number, line in enumerate(text, 1):
        line = line.strip()
        if not line:
            continue
        if not line.isdigit() or int(line) < 1:
            raise ValueError(f"{path}:{number}: expected a positive integer length, got {line!r}")
        out.append(int(line))
    if not out:
        raise ValueError(f"lengths file {path!r} holds no lengths")
    return out


def auto_candidates(model: "_C.ModelConfig", world: int) -> List["_C.Layout"]:
    """Every (dp, tp, pp) layout of the world that the model's heads, groups, FFN and layers divide."""
    out = []
    for layout in hs.Layout.enumerate(world):
        try:
            model.validate(layout)
        except ValueError:
            continue
        out.append(layout)
    return out


def _switch_seconds(plan, hardware) -> float:
    stats = plan.stats
    if stats["bytes_moved"] == 0:
        return 0.0
    bandwidth = hardware.inter_node_bandwidth if stats["inter_node_bytes"] else hardware.intra_node_bandwidth
    return stats["max_send_bytes"] / bandwidth


def switch_costs(model, hardware, topology, candidates, home, zero=True, cache=None):
    """Seconds to switch parameters between every pair of candidates, and to move each
    candidate's gradients (partial summands) into the home layout's accumulator (ZeRO shards
    when ``zero``), from real redistribution plans of the model's weights."""
    specs = hs.llama_tensor_set(model.num_layers, model.hidden_size, model.ffn_hidden_size,
                                model.num_attention_heads, model.num_query_groups, model.vocab_size)
    cache = hs.PlanCache() if cache is None else cache
    n = len(candidates)
    switch = [[0.0 if i == j else _switch_seconds(hs.plan_switch(specs, a, b, topology=topology, cache=cache),
                                                  hardware)
               for j, b in enumerate(candidates)] for i, a in enumerate(candidates)]
    # Under the home layout the phase's own data-parallel reduction (in the cost model) puts
    # the gradients in place; elsewhere their switch is charged on top of it (conservative).
    grads = [0.0 if i == home else _switch_seconds(
        hs.plan_switch(specs, l, candidates[home], src_kind="partial", dst_kind="zero" if zero else "sharded",
                       topology=topology, cache=cache), hardware)
        for i, l in enumerate(candidates)]
    return switch, grads


def build_planner(model, hardware, topology, candidates, home, zero=True) -> "_C.Planner":
    """A Planner over the candidates with switch costs from ``switch_costs``."""
    switch, grads = switch_costs(model, hardware, topology, candidates, home, zero)
    return hs.Planner(hs.CostModel(model, hardware, topology, zero=zero), candidates, home, switch, grads)


def _free(cost, candidates, home) -> "_C.Planner":
    """The same planner with free switches: the upper bound of bucketing."""
    n = len(candidates)
    return hs.Planner(cost, candidates, home, [[0.0] * n for _ in range(n)], [0.0] * n)


def _table(plan, batch: Sequence[int], candidates) -> str:
    rows = [f"{'phase':<6}{'layout':<12}{'seqs':>6}{'lengths':>18}{'micro-batches':>15}"
            f"{'pred s':>9}{'peak GiB':>10}{'switch s':>10}"]
    for k, ph in enumerate(plan["phases"]):
        ls = [batch[i] for i in ph["sequences"]]
        mbs = sum(len(r) for r in ph["micro_batches"])
        rows.append(f"{k:<6}{ph['layout'].name:<12}{len(ls):>6}{f'{min(ls)}-{max(ls)}':>18}{mbs:>15}"
                    f"{ph['predicted_s']:>9.3f}{ph['peak_bytes'] / 2**30:>10.1f}"
                    f"{ph['switch_in_s'] + ph['grad_s']:>10.3f}")
    static = candidates[plan["best_static"]].name
    rows.append(f"predicted step {plan['total_s']:.3f} s (switch back {plan['switch_back_s']:.3f} s); "
                f"best static {static}: {plan['best_static_s']:.3f} s; "
                f"speedup {plan['best_static_s'] / plan['total_s']:.2f}x")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-7b", help=f"one of {', '.join(hs.ModelConfig.preset_names())}")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--hardware", default="a800", help=f"one of {', '.join(hs.HardwareProfile.preset_names())}")
    parser.add_argument("--lengths", required=True, help="file with one sequence length per line")
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per step")
    parser.add_argument("--max-context", type=int, default=32768, help="longer sequences are truncated")
    parser.add_argument("--candidates", default="auto", help='"auto" or layouts, e.g. "dp8,dp2tp4,tp8"')
    parser.add_argument("--home", default=None, help="home layout (default: the first candidate)")
    parser.add_argument("--steps", type=int, default=0, help="simulate this many steps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        for name in ("gpus", "gpus_per_node", "global_batch", "max_context"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.steps < 0:
            raise ValueError(f"--steps must be >= 0, got {args.steps}")
        model = hs.ModelConfig.preset(args.model)
        hardware = hs.HardwareProfile.preset(args.hardware)
        topology = hs.Topology(args.gpus, args.gpus_per_node)
        if args.candidates == "auto":
            candidates = auto_candidates(model, args.gpus)
        else:
            candidates = [hs.Layout.parse(t) for t in args.candidates.split(",") if t]
        if not candidates:
            raise ValueError(f"no candidate layout of {args.gpus} GPUs divides {args.model}")
        for layout in candidates:
            layout.validate(args.gpus)
            model.validate(layout)
        names = [l.name for l in candidates]
        home = None
        if args.home is not None:
            wanted = hs.Layout.parse(args.home).name
            if wanted not in names:
                raise ValueError(f"--home {args.home} is not among the candidates {names}")
            home = names.index(wanted)
        lengths = [min(l, args.max_context) for l in load_lengths(args.lengths)]
    except ValueError as e:
        parser.error(str(e))

    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    batch = rng.sample(lengths, args.global_batch) if len(lengths) >= args.global_batch else \
        [rng.choice(lengths) for _ in range(args.global_batch)]
    if home is None:
        # The home layout a Megatron user would run: the best static layout for the context.
        cost = hs.CostModel(model, hardware, topology, zero=True)
        probe = _free(cost, candidates, 0).plan(batch + [args.max_context])
        home = probe["best_static"]
    planner = build_planner(model, hardware, topology, candidates, home)
    print(f"{len(candidates)} candidate layouts, home {candidates[home].name}, switch costs from "
          f"{len(candidates) ** 2} plans in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    t0 = time.perf_counter()
    plan = planner.plan(batch)
    print(_table(plan, batch, candidates))
    print(f"planned in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    if args.steps:
        free = _free(hs.CostModel(model, hardware, topology, zero=True), candidates, home)
        hot = static = ideal = 0.0
        tokens = 0
        for _ in range(args.steps):
            step = [rng.choice(lengths) for _ in range(args.global_batch)]
            tokens += sum(step)
            planned = planner.plan(step)
            hot += planned["total_s"]
            # Per step, the best single layout that holds the step's longest sequence: no
            # worse than any one layout a user could fix for the whole run.
            static += planned["best_static_s"]
            ideal += free.plan(step)["total_s"]
        print(f"simulated {args.steps} steps: tokens/s hot switching {tokens / hot:,.0f}, "
              f"best static per step {tokens / static:,.0f}, free switches {tokens / ideal:,.0f}; "
              f"speedup {static / hot:.2f}x (upper bound {static / ideal:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
