"""Per-step planning helpers and the planner's dry run: one step's plan, or a simulation.

    /usr/bin/python3 -m hotswitch.plan --model llama-7b --gpus 32 --gpus-per-node 8 \\
        --hardware a800 --lengths FILE --global-batch 512 --max-context 32768 \\
        [--long-sequences truncate|split|reject] [--steps N] [--plot FILE.png]

Lengths files hold one integer per line (tokens of one document). ``--hardware`` takes a
preset name or a JSON file written by ``HardwareProfile.save`` (e.g. from
``hotswitch.calibrate``). Switch costs come from the redistribution plans of the model's
parameters and gradients between the layouts (largest per-rank send over the link it
crosses), or, for large worlds, from their per-rank receive volumes (``SwitchEstimate``);
nothing runs on devices.
"""

import argparse
import random
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import hotswitch as hs
from hotswitch import _C

__all__ = [
    "auto_candidates",
    "build_planner",
    "free_planner",
    "load_hardware",
    "load_lengths",
    "main",
    "simulate",
    "switch_costs",
    "switch_share",
]

# Worlds up to this size get switch costs from real redistribution plans by default.
PLANS_UP_TO_WORLD = 64


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


def load_hardware(spec: str) -> "_C.HardwareProfile":
    """A hardware preset by name (``a800``) or a profile saved as JSON (``FILE.json``)."""
    if spec.endswith(".json"):
        return hs.HardwareProfile.load(spec)
    return hs.HardwareProfile.preset(spec)


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


def _plan_seconds(plan, hardware, topology) -> float:
    """The slowest rank of a plan's exchange: per rank, what it sends (and, separately, what
    it receives) within its node over the intra-node bandwidth plus across nodes over the
    inter-node bandwidth; links are full duplex."""
    world, per_node = topology.world, topology.ranks_per_node
    load = [[0.0, 0.0] for _ in range(world)]  # [send, recv] seconds
    for src, dst, size, _ in plan.messages():
        bandwidth = hardware.intra_node_bandwidth if src // per_node == dst // per_node \
            else hardware.inter_node_bandwidth
        load[src][0] += size / bandwidth
        load[dst][1] += size / bandwidth
    return max((max(r) for r in load), default=0.0)


def switch_costs(model, hardware, topology, candidates, home, zero=True, method="auto",
                 cache=None) -> Tuple[List[List[float]], List[float], List[float]]:
    """Seconds of the switches the planner weighs, per candidate layout.

    Returns ``(params, reduced_grads, partial_grads)``: ``params[i][j]`` moves the bf16
    parameters from candidate i to j; ``reduced_grads[i]`` moves a phase's fp32 gradients,
    already reduced over candidate i's data group (ZeRO shards of it when ``zero``), into the
    home layout's accumulator (ZeRO shards when ``zero``); ``partial_grads[i]`` moves the
    unreduced summands there instead, summed on arrival. Both are 0 for the home layout.
    ``method``: ``"plans"`` (the redistribution plan's slowest rank: its sends, or its receives,
    over the links they cross), ``"estimate"`` (the slowest rank's receives alone,
    ``SwitchEstimate``; no plan is built), or ``"auto"`` (plans up to ``PLANS_UP_TO_WORLD``
    ranks).
    """
    if method not in ("auto", "plans", "estimate"):
        raise ValueError(f"switch cost method must be auto, plans or estimate, got {method!r}")
    if method == "auto":
        method = "plans" if topology.world <= PLANS_UP_TO_WORLD else "estimate"
    shape = (model.num_layers, model.hidden_size, model.ffn_hidden_size, model.num_attention_heads,
             model.num_query_groups, model.vocab_size)
    params = hs.llama_tensor_set(*shape, dtype="bfloat16" if model.param_bytes == 2 else "float32")
    grads = hs.llama_tensor_set(*shape, dtype="float32")
    grad_kind = "zero" if zero else "sharded"
    homel = candidates[home]
    n = len(candidates)
    if method == "plans":
        cache = hs.PlanCache() if cache is None else cache

        def seconds(ts, a, ka, b, kb):
            return _plan_seconds(hs.plan_switch(ts, a, b, src_kind=ka, dst_kind=kb, topology=topology, cache=cache),
                                 hardware, topology)
    else:
        placements: Dict[tuple, "_C.Placement"] = {}

        def placement(ts, layout, kind):
            key = (id(ts), layout.name, kind)
            if key not in placements:
                placements[key] = _C.Placement(ts, layout, kind)
            return placements[key]

        def seconds(ts, a, ka, b, kb):
            est = _C.SwitchEstimate.of(ts, placement(ts, a, ka), placement(ts, b, kb), topology)
            return est.seconds(hardware.intra_node_bandwidth, hardware.inter_node_bandwidth)

    switch = [[0.0 if i == j else seconds(params, a, "sharded", b, "sharded")
               for j, b in enumerate(candidates)] for i, a in enumerate(candidates)]
    reduced = [0.0 if i == home else seconds(grads, l, grad_kind, homel, grad_kind) for i, l in enumerate(candidates)]
    partial = [0.0 if i == home else seconds(grads, l, "partial", homel, grad_kind) for i, l in enumerate(candidates)]
    return switch, reduced, partial


def build_planner(model, hardware, topology, candidates, home, zero=True, method="auto", costs=None,
                  **options) -> "_C.Planner":
    """A Planner over the candidates with switch costs from ``switch_costs`` (or ``costs``,
    its result). ``options`` go to ``hs.Planner`` (max_context, long_sequences, ...)."""
    switch, reduced, partial = costs or switch_costs(model, hardware, topology, candidates, home, zero, method)
    return hs.Planner(hs.CostModel(model, hardware, topology, zero=zero), candidates, home, switch, reduced,
                      partial, **options)


def free_planner(planner: "_C.Planner", **options) -> "_C.Planner":
    """The same planner with free switches: the upper bound of bucketing."""
    n = len(planner.candidates)
    return hs.Planner(planner.cost, planner.candidates, planner.home, [[0.0] * n for _ in range(n)], [0.0] * n,
                      [0.0] * n, **options)


def switch_share(plan: dict, planner: "_C.Planner") -> float:
    """Seconds of a step plan spent switching: parameters in and back, and the gradients'
    switches (beyond the phase's own reduction)."""
    total = plan["switch_back_s"]
    for ph in plan["phases"]:
        total += ph["switch_in_s"]
        if ph["grad_method"] == "reduce_then_switch":
            total += ph["grad_s"] - planner.candidate_model(ph["candidate"])["reduce_s"]
        elif ph["grad_method"] == "switch_partial":
            total += ph["grad_s"]
    return total


def simulate(planner, lengths: Sequence[int], steps: int, global_batch: int, seed: int = 0,
             free: Optional["_C.Planner"] = None) -> dict:
    """Plans ``steps`` steps of ``global_batch`` lengths drawn from ``lengths``.

    Returns tokens and predicted seconds summed over the steps (exact packing): ``hot_s``
    (hot switching), ``static_s`` (per step the best single layout that holds its longest
    sequence: no worse than any one layout a user could fix for the whole run), ``free_s``
    (hot switching with free switches, when ``free`` is given), ``switch_s`` (of hot_s),
    ``plan_ms`` (median planning time), and the layouts the hot plans used.
    """
    rng = random.Random(seed)
    out = {"steps": steps, "tokens": 0, "hot_s": 0.0, "static_s": 0.0, "free_s": 0.0, "switch_s": 0.0,
           "layouts": {}}
    times = []
    for _ in range(steps):
        step = [rng.choice(lengths) for _ in range(global_batch)]
        pieces = planner.pieces(step)
        out["tokens"] += sum(p[2] for p in pieces)
        t0 = time.perf_counter()
        planned = planner.plan(step)
        times.append(time.perf_counter() - t0)
        out["hot_s"] += planned["total_s"]
        out["static_s"] += planned["best_static_s"]
        out["switch_s"] += switch_share(planned, planner)
        for ph in planned["phases"]:
            out["layouts"][ph["layout"].name] = out["layouts"].get(ph["layout"].name, 0) + 1
        if free is not None:
            out["free_s"] += free.plan(step)["total_s"]
    times.sort()
    out["plan_ms"] = times[len(times) // 2] * 1e3 if times else 0.0
    return out


def _table(plan, planner) -> str:
    pieces = plan["pieces"]
    rows = [f"{'phase':<6}{'layout':<12}{'seqs':>6}{'lengths':>14}{'micro-b':>9}{'pred s':>9}{'est s':>9}"
            f"{'peak GiB':>9}{'switch in':>10}{'grad s':>9}  grad method"]
    for k, ph in enumerate(plan["phases"]):
        ls = [pieces[i][2] for i in ph["sequences"]]
        mbs = sum(len(r) for r in ph["micro_batches"])
        rows.append(f"{k:<6}{ph['layout'].name:<12}{len(ls):>6}{f'{min(ls)}-{max(ls)}':>14}{mbs:>9}"
                    f"{ph['predicted_s']:>9.3f}{ph['estimate_s']:>9.3f}{ph['peak_bytes'] / 2**30:>9.1f}"
                    f"{ph['switch_in_s']:>10.3f}{ph['grad_s']:>9.3f}  {ph['grad_method']}")
    static = planner.candidates[plan["best_static"]].name
    order = " -> ".join(ph["layout"].name for ph in plan["phases"])
    rows.append(f"order {order} (home {planner.candidates[planner.home].name}); switch back {plan['switch_back_s']:.3f} s; switching "
                f"{switch_share(plan, planner):.3f} s of the step")
    rows.append(f"predicted step {plan['total_s']:.3f} s (objective {plan['objective_s']:.3f} s); "
                f"best static {static}: {plan['best_static_s']:.3f} s; "
                f"speedup {plan['best_static_s'] / plan['total_s']:.2f}x")
    return "\n".join(rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-7b", help=f"one of {', '.join(hs.ModelConfig.preset_names())}")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--hardware", default="a800",
                        help=f"one of {', '.join(hs.HardwareProfile.preset_names())}, or a profile FILE.json")
    parser.add_argument("--lengths", required=True, help="file with one sequence length per line")
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per step")
    parser.add_argument("--max-context", type=int, default=32768, help="longest piece a layout must hold")
    parser.add_argument("--long-sequences", default="truncate", choices=["truncate", "split", "reject"],
                        help="what happens to sequences longer than --max-context")
    parser.add_argument("--candidates", default="auto", help='"auto" or layouts, e.g. "dp8,dp2tp4,tp8"')
    parser.add_argument("--home", default=None, help="home layout (default: the best static layout for the "
                                                     "max context)")
    parser.add_argument("--switch-costs", default="auto", choices=["auto", "plans", "estimate"],
                        help=f"from redistribution plans or receive volumes (auto: plans up to "
                             f"{PLANS_UP_TO_WORLD} GPUs)")
    parser.add_argument("--steps", type=int, default=0, help="simulate this many steps")
    parser.add_argument("--plot", default=None, help="draw the step's lengths and phases to this PNG file")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        for name in ("gpus", "gpus_per_node", "global_batch", "max_context"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.steps < 0:
            raise ValueError(f"--steps must be >= 0, got {args.steps}")
        if args.plot is not None and not args.plot.endswith(".png"):
            raise ValueError(f"--plot must name a .png file, got {args.plot!r}")
        model = hs.ModelConfig.preset(args.model)
        hardware = load_hardware(args.hardware)
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
        lengths = load_lengths(args.lengths)
    except ValueError as e:
        parser.error(str(e))

    options = dict(max_context=args.max_context, long_sequences=args.long_sequences)
    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    batch = rng.sample(lengths, args.global_batch) if len(lengths) >= args.global_batch else \
        [rng.choice(lengths) for _ in range(args.global_batch)]
    cost = hs.CostModel(model, hardware, topology, zero=True)
    if home is None:
        # The home layout a Megatron user would run: the best static layout for the context.
        n = len(candidates)
        probe = hs.Planner(cost, candidates, 0, [[0.0] * n for _ in range(n)], [0.0] * n, **options)
        try:
            home = probe.plan([min(l, args.max_context) for l in batch] + [args.max_context])["best_static"]
        except ValueError as e:
            parser.error(str(e))
    planner = build_planner(model, hardware, topology, candidates, home, method=args.switch_costs, **options)
    print(f"{len(candidates)} candidate layouts, home {candidates[home].name}, switch costs "
          f"({args.switch_costs}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        plan = planner.plan(batch)
    except ValueError as e:
        parser.error(str(e))
    elapsed = time.perf_counter() - t0
    print(_table(plan, planner))
    print(f"planned in {elapsed * 1e3:.1f} ms ({plan['candidates_used']} of {len(candidates)} layouts "
          f"after dropping dominated ones)")
    if args.plot:
        from hotswitch.plots import plot_step
        plot_step(plan, planner, args.plot)
        print(f"plot written to {args.plot}")
    if args.steps:
        free = free_planner(planner, **options)
        sim = simulate(planner, lengths, args.steps, args.global_batch, seed=args.seed + 1, free=free)
        tokens = sim["tokens"]
        print(f"simulated {args.steps} steps: tokens/s hot switching {tokens / sim['hot_s']:,.0f}, "
              f"best static {tokens / sim['static_s']:,.0f}, free switches {tokens / sim['free_s']:,.0f}; "
              f"speedup {sim['static_s'] / sim['hot_s']:.2f}x (upper bound {sim['static_s'] / sim['free_s']:.2f}x); "
              f"switching {sim['switch_s'] / sim['hot_s']:.1%} of the time; median plan {sim['plan_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
