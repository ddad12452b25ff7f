"""The planner's dry run: one step's plan, or a simulation of many.

    python -m hotswitch.cli.plan --model llama-7b --gpus 32 --gpus-per-node 8 \\
        --hardware a800 --lengths FILE --global-batch 512 --max-context 32768 \\
        [--long-sequences truncate|split|reject] [--recompute auto|none|selective|full,...]
        [--steps N] [--plot FILE.png] [--fixed-plan FILE.json]

Lengths files hold one integer per line (tokens of one document). ``--hardware`` takes a
preset name or a JSON file written by ``HardwareProfile.save`` (e.g. from
``python -m hotswitch.calibration``). Switch costs come from ``hotswitch.planner``; nothing
runs on devices. ``--recompute`` lists the activation recomputation modes the planner may
give a phase (``auto``: all three); each phase's choice is the table's ``recompute`` column.
``--fixed-plan`` evaluates a hand-written plan, a JSON list of ``[upper_bound, layout,
recompute]`` (``hotswitch.planner.load_fixed_plan``), with the same packing and switches, and
prints it beside the planner's plan and the best static layout.
"""

import argparse
import random
import sys
import time

from hotswitch import _C
from hotswitch.analysis.simulate import padded_static_seconds, simulate, switch_share
from hotswitch.data import load_lengths
from hotswitch.hardware import load_hardware
from hotswitch.planner import (PLANS_UP_TO_WORLD, build_planner, check_candidates, choose_home, choose_model_orders,
                               fixed_plan_entries, free_planner, load_fixed_plan, plan_choice, switch_costs,
                               with_fixed_layouts)

__all__ = ["main"]


def _table(plan, planner, min_gain: float = None) -> str:
    pieces = plan.pieces
    rows = [f"{'phase':<6}{'layout':<12}{'recompute':<10}{'seqs':>6}{'lengths':>14}{'micro-b':>9}{'pred s':>9}"
            f"{'est s':>9}{'peak GiB':>9}{'switch in':>10}{'grad s':>9}  grad method"]
    for k, ph in enumerate(plan.phases):
        ls = [pieces[i].length for i in ph.sequences]
        mbs = sum(len(r) for r in ph.packing.micro_batches)
        rows.append(f"{k:<6}{ph.layout.name:<12}{ph.recompute:<10}{len(ls):>6}{f'{min(ls)}-{max(ls)}':>14}{mbs:>9}"
                    f"{ph.cost.run_seconds:>9.3f}{ph.estimate_seconds:>9.3f}{ph.cost.peak_bytes / 2**30:>9.1f}"
                    f"{ph.switch_in_seconds:>10.3f}{ph.grad_seconds:>9.3f}  {ph.grad_method}")
    static = planner.candidates[plan.best_static_candidate].name
    if plan.best_static_recompute != "none":
        static += f" (recompute {plan.best_static_recompute})"
    order = " -> ".join(ph.layout.name for ph in plan.phases)
    rows.append(f"order {order} (home {planner.candidates[planner.home].name}); switch back {plan.switch_back_seconds:.3f} s; switching "
                f"{switch_share(plan, planner):.3f} s of the step")
    rows.append(f"predicted step {plan.total_seconds:.3f} s (objective {plan.objective_seconds:.3f} s); "
                f"best static {static}: {plan.best_static_seconds:.3f} s; "
                f"speedup over the best static layout packed per sequence "
                f"{plan.best_static_seconds / plan.total_seconds:.2f}x")
    if min_gain is not None:
        rows.append("chosen: " + plan_choice(plan, [c.name for c in planner.candidates], min_gain))
    return "\n".join(rows)


def _model(path: str) -> "_C.ModelConfig":
    """The cost model's view of a model file: hotswitch's ``TransformerConfig`` fields (as
    checkpoints record them) or a Hugging Face LLaMA ``config.json``."""
    from hotswitch._checks import read_json_object
    from hotswitch.huggingface import config_from_hf
    from hotswitch.model.config import TransformerConfig

    raw = read_json_object(path, "model config")
    if "num_hidden_layers" in raw or "model_type" in raw:
        return config_from_hf(raw, path).cost_config()
    try:
        return TransformerConfig(**raw).cost_config()
    except TypeError as e:
        raise ValueError(f"{path}: not a model config ({e}); expected TransformerConfig fields or a Hugging Face "
                         "config.json") from None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.cli.plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="llama-7b", help=f"one of {', '.join(_C.ModelConfig.preset_names())}")
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--hardware", default="a800",
                        help=f"one of {', '.join(_C.HardwareProfile.preset_names())}, or a profile FILE.json")
    parser.add_argument("--lengths", required=True,
                        help="file with one sequence length per line, or an indexed dataset (PREFIX of PREFIX.bin/.idx)")
    parser.add_argument("--model-config", default=None, metavar="FILE.json",
                        help="the model from a JSON file instead of --model: hotswitch TransformerConfig fields, or a "
                             "Hugging Face LLaMA config.json")
    parser.add_argument("--memory-budget-gb", type=float, default=None,
                        help="GiB per GPU the plans may use (default: the hardware profile's memory)")
    parser.add_argument("--global-batch", type=int, default=512, help="sequences per step")
    parser.add_argument("--max-context", type=int, default=32768, help="longest piece a layout must hold")
    parser.add_argument("--long-sequences", default="truncate", choices=["truncate", "split", "reject"],
                        help="what happens to sequences longer than --max-context")
    parser.add_argument("--recompute", default="auto",
                        help='activation recomputation the planner may choose per phase: "auto" (none, selective, '
                             'full) or a list, e.g. "none" or "none,full"')
    parser.add_argument("--candidates", default="auto", help='"auto" or layouts, e.g. "dp8,dp2tp4,tp8,dp2cp4"')
    parser.add_argument("--context-parallel-size", type=int, default=1,
                        help="with --candidates auto: the largest cp among the candidates (1: no cp layouts)")
    parser.add_argument("--home", default="auto",
                        help='home layout; "auto" (default): the home with the least predicted time over a window of '
                             '4 batches; "static": the best static layout for the max context, as a Megatron-LM user '
                             'fixes it')
    parser.add_argument("--switch-costs", default="auto", choices=["auto", "plans", "estimate"],
                        help=f"from redistribution plans or receive volumes (auto: plans up to "
                             f"{PLANS_UP_TO_WORLD} GPUs)")
    parser.add_argument("--steps", type=int, default=0, help="simulate this many steps")
    parser.add_argument("--plot", default=None, help="draw the step's lengths and phases to this PNG file")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fixed-plan", default=None, metavar="FILE.json",
                        help="evaluate this hand-written plan too: a JSON list of [upper_bound, layout, recompute]")
    parser.add_argument("--rank-order", default="auto", choices=["auto", "megatron"],
                        help="auto: each candidate takes the rank order whose switches to and from the home cost "
                             "least, keeping its tp/cp/pp groups on as few nodes; megatron: tp fastest, then cp, dp, pp")
    parser.add_argument("--min-gain", type=float, default=0.01,
                        help="switch only when the planned phases are predicted at least this fraction faster than "
                             "one phase under the home or best static layout (default 0.01: 1%%)")
    args = parser.parse_args(argv)
    try:
        for name in ("gpus", "gpus_per_node", "global_batch", "max_context"):
            if getattr(args, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.steps < 0:
            raise ValueError(f"--steps must be >= 0, got {args.steps}")
        modes = ["none", "selective", "full"] if args.recompute == "auto" else \
            [t.strip() for t in args.recompute.split(",") if t.strip()]
        if not modes or any(m not in ("none", "selective", "full") for m in modes) or len(set(modes)) < len(modes):
            raise ValueError(f"--recompute must be auto or a list of distinct none, selective, full; "
                             f"got {args.recompute!r}")
        if args.plot is not None and not args.plot.endswith(".png"):
            raise ValueError(f"--plot must name a .png file, got {args.plot!r}")
        model = _model(args.model_config) if args.model_config else _C.ModelConfig.preset(args.model)
        hardware = load_hardware(args.hardware)
        if args.memory_budget_gb is not None:
            if not args.memory_budget_gb > 0:
                raise ValueError(f"--memory-budget-gb must be a positive number, got {args.memory_budget_gb}")
            fields = hardware.to_dict()
            fields["memory_bytes"] = int(args.memory_budget_gb * 2**30)
            hardware = _C.HardwareProfile.from_dict(fields)
        # Fewer GPUs than a node: one partial node.
        topology = _C.Topology(args.gpus, min(args.gpus_per_node, args.gpus))
        if args.context_parallel_size < 1:
            raise ValueError(f"--context-parallel-size must be >= 1, got {args.context_parallel_size}")
        if args.context_parallel_size != 1 and args.candidates != "auto":
            raise ValueError(f"--context-parallel-size({args.context_parallel_size}) bounds the cp of --candidates "
                             f"auto; with listed candidates ({args.candidates}) name the cp layouts there")
        candidates = check_candidates(model, args.gpus, "auto" if args.candidates == "auto" else
                                      [t for t in args.candidates.split(",") if t], args.context_parallel_size)
        names = [l.name for l in candidates]
        home = None
        if args.home not in ("auto", "static"):
            wanted = _C.Layout.parse(args.home).name
            if wanted not in names:
                raise ValueError(f"--home {args.home} is not among the candidates {names}")
            home = names.index(wanted)
        fixed = None
        if args.fixed_plan is not None:
            fixed = load_fixed_plan(args.fixed_plan, args.gpus, model, args.max_context)
        lengths = load_lengths(args.lengths)
    except ValueError as e:
        parser.error(str(e))

    if not args.min_gain >= 0:
        parser.error(f"--min-gain must be a fraction >= 0 (0.01: 1%), got {args.min_gain}")
    options = dict(max_context=args.max_context, long_sequences=args.long_sequences, recompute=modes,
                   min_gain=args.min_gain)
    t0 = time.perf_counter()
    rng = random.Random(args.seed)
    batch = rng.sample(lengths, args.global_batch) if len(lengths) >= args.global_batch else \
        [rng.choice(lengths) for _ in range(args.global_batch)]
    cost = _C.CostModel(model, hardware, topology, zero=True)
    if home is None:
        # The home layout a Megatron user would run: the best static layout for the context.
        n = len(candidates)
        probe = _C.Planner(cost, candidates, 0, [[0.0] * n for _ in range(n)], [0.0] * n, **options)
        try:
            home = probe.plan([min(l, args.max_context) for l in batch] + [args.max_context]).best_static_candidate
        except ValueError as e:
            parser.error(str(e))
    if args.home == "auto":
        # The home with the least predicted time over a window of batches drawn beside this one.
        window = [batch] + [[rng.choice(lengths) for _ in range(args.global_batch)] for _ in range(3)]
        params = switch_costs(model, hardware, topology, candidates, home, method=args.switch_costs)[0]
        planners = {}

        def planner_for(h):
            if h not in planners:
                costs = switch_costs(model, hardware, topology, candidates, h, method=args.switch_costs,
                                     params_switch=params)
                planners[h] = build_planner(model, hardware, topology, candidates, h, costs=costs, **options)
            return planners[h]
        try:
            home, totals = choose_home(planner_for, range(len(candidates)), window)
        except ValueError as e:
            parser.error(str(e))
        print(f"home chosen over {len(window)} batches: {candidates[home].name} ({totals[home]:.3f} s predicted; "
              + ", ".join(f"{candidates[h].name} {t:.3f} s" for h, t in sorted(totals.items(), key=lambda kv: kv[1])[1:4])
              + ")", file=sys.stderr)
    if args.rank_order == "auto":
        # Each candidate's rank order: the one whose switches to and from home cost least.
        candidates, saved = choose_model_orders(model, hardware, topology, candidates, home, method=args.switch_costs)
        changed = [f"{c.name} ({s * 1e3:.1f} ms)" for c, s in zip(candidates, saved) if s > 0]
        print(f"rank orders chosen: {', '.join(changed) if changed else 'Megatron order for every candidate'}"
              + (" (switch seconds saved per use, there and back)" if changed else ""), file=sys.stderr)
    if fixed is not None:
        candidates = with_fixed_layouts(candidates, fixed)
    planner = build_planner(model, hardware, topology, candidates, home, method=args.switch_costs, **options)
    entries = None
    if fixed is not None:
        entries = fixed_plan_entries(fixed, candidates)
        try:
            planner.check_fixed_plan(entries)
        except ValueError as e:
            parser.error(f"--fixed-plan {args.fixed_plan}: {e}")
    print(f"{len(candidates)} candidate layouts, home {candidates[home].name}, switch costs "
          f"({args.switch_costs}) in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    t0 = time.perf_counter()
    try:
        plan = planner.plan(batch)
    except ValueError as e:
        parser.error(str(e))
    elapsed = time.perf_counter() - t0
    print(_table(plan, planner, args.min_gain))
    padded = padded_static_seconds(planner, len(plan.pieces))
    print(f"padded static (every sequence padded to {args.max_context} tokens, best layout): {padded:.3f} s; "
          f"speedup over padded static {padded / plan.total_seconds:.2f}x")
    print(f"planned in {elapsed * 1e3:.1f} ms ({plan.candidates_used} of {len(candidates) * len(modes)} "
          f"(layout, recompute) candidates after dropping dominated ones)")
    if entries is not None:
        fixed_step = planner.plan_fixed(batch, entries)
        print(f"\nfixed plan {args.fixed_plan}:")
        print(_table(fixed_step, planner))
        print(f"predicted step: planner {plan.total_seconds:.3f} s, fixed plan {fixed_step.total_seconds:.3f} s, "
              f"best static layout packed per sequence {plan.best_static_seconds:.3f} s; planner's speedup over "
              f"the fixed plan {fixed_step.total_seconds / plan.total_seconds:.2f}x")
    if args.plot:
        from hotswitch.analysis.plots import plot_step
        plot_step(plan, planner, args.plot)
        print(f"plot written to {args.plot}")
    if args.steps:
        free = free_planner(planner, **options)
        sim = simulate(planner, lengths, args.steps, args.global_batch, seed=args.seed + 1, free=free, fixed=entries,
                       static_run=options)
        tokens = sim["tokens"]
        print(f"simulated {args.steps} steps: tokens/s hot switching {tokens / sim['hot_s']:,.0f}, "
              f"best static layout for the run ({sim['static_run']}) {tokens / sim['static_run_s']:,.0f}, "
              f"best single layout per step {tokens / sim['static_s']:,.0f}, free switches "
              f"{tokens / sim['free_s']:,.0f}; speedup over the best static layout for the run "
              f"{sim['static_run_s'] / sim['hot_s']:.2f}x, over the best single layout per step (another each step "
              f"where it pays, no switch: no static run reaches it) {sim['static_s'] / sim['hot_s']:.2f}x (upper "
              f"bound {sim['static_s'] / sim['free_s']:.2f}x); switching {sim['switch_s'] / sim['hot_s']:.1%} of the "
              f"time; median plan {sim['plan_ms']:.1f} ms; speedup over padded static "
              f"{sim['padded_s'] / sim['hot_s']:.2f}x")
        if entries is not None:
            print(f"fixed plan: tokens/s {tokens / sim['fixed_s']:,.0f}; speedup over the fixed plan "
                  f"{sim['fixed_s'] / sim['hot_s']:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
