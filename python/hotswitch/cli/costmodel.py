"""Fits the cost model's hardware profile to measured training runs, or checks a profile
against them.

    python -m hotswitch.costmodel fit --runs runs.csv --out profile.json [--base h100-datasheet]
    python -m hotswitch.costmodel check --runs runs.csv [--profile h100|profile.json] [--plot scatter.png]

A runs file is a CSV with the columns of data/megatron_runs/runs.csv (see
``hotswitch.calibration.runs``). ``fit`` moves the profile's efficiencies, link bandwidths and
latencies and overheads within bounds (least squares on log time) and writes the profile as
JSON, usable wherever a preset is (``--hardware profile.json``). ``check`` prints, per run,
the predicted and measured iteration time and their ratio, draws them log-log (``--plot``)
and ends with one line ``RESULT {json}``: ``runs`` (predicted), ``skipped`` (packed runs
without a length histogram), ``median_abs_rel_error``, ``max_abs_rel_error``,
``pairwise_order_agreement`` and ``pairs`` (pairs of runs of one model, GPU count,
seq_length and packing, measured 5% or more apart).
"""

import argparse
import json
import sys

from hotswitch._C import HardwareProfile
from hotswitch.calibration import runs as measured
from hotswitch.hardware import load_hardware, save_profile

__all__ = ["main"]


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", required=True, help="CSV of measured runs (columns of data/megatron_runs)")
    parser.add_argument("--steps", type=int, default=8, help="steps drawn per packed run (default 8)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn lengths (default 0)")
    parser.add_argument("--gpus-per-node", type=int, default=measured.GPUS_PER_NODE,
                        help=f"GPUs of one node (default {measured.GPUS_PER_NODE})")


def _positive(name: str, value: int) -> int:
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


def _print_check(result: "measured.Check", out) -> None:
    print(f"{'run':58} {'layout':>12} {'S':>6} {'mbs':>3} {'pack':>4} {'pred_s':>9} {'meas_s':>9} {'ratio':>6}",
          file=out)
    for run, p, m in zip(result.runs, result.predicted_s, result.measured_s):
        print(f"{run.label[:58]:58} {run.layout().name:>12} {run.seq_length:>6} {run.micro_batch_size:>3} "
              f"{'yes' if run.packing else 'no':>4} {p:9.3f} {m:9.3f} {p / m:6.3f}", file=out)
    for run in result.skipped:
        print(f"{run.label}: skipped (packed, no length histogram)", file=out)


def _fit(args) -> int:
    runs = measured.read_runs(args.runs)
    base = load_hardware(args.base)
    profile, report = measured.fit(runs, base, steps=_positive("--steps", args.steps), seed=args.seed,
                                   gpus_per_node=_positive("--gpus-per-node", args.gpus_per_node),
                                   name=args.name)
    save_profile(profile, args.out)
    result = measured.check(runs, profile, steps=args.steps, seed=args.seed, gpus_per_node=args.gpus_per_node)
    for field, value in report["fitted"].items():
        lo, hi = report["bounds"][field]
        at = " (at its bound)" if value <= lo * (1 + 1e-6) or value >= hi * (1 - 1e-6) else ""
        print(f"{field:26} {value:.6g}{at}")
    print(f"wrote {args.out}: {report['runs']} runs, {report['iterations']} iterations, rms log error "
          f"{report['rms_log_error']:.4f}")
    print("RESULT " + json.dumps(dict(result.result(), fitted=report["fitted"])))
    return 0


def _check(args) -> int:
    runs = measured.read_runs(args.runs)
    hardware = load_hardware(args.profile)
    result = measured.check(runs, hardware, steps=_positive("--steps", args.steps), seed=args.seed,
                            gpus_per_node=_positive("--gpus-per-node", args.gpus_per_node))
    _print_check(result, sys.stdout)
    if args.plot:
        from hotswitch.analysis.plots import plot_predicted_measured

        groups = [f"{r.family} {'packed' if r.packing else 'padded'}" for r in result.runs]
        r = result.result()
        plot_predicted_measured([x.label for x in result.runs], list(result.predicted_s), list(result.measured_s),
                                args.plot, groups=groups,
                                title=f"{hardware.name}: {r['runs']} runs, median |error| "
                                      f"{100 * r['median_abs_rel_error']:.1f}%, pairs ordered "
                                      f"{100 * (r['pairwise_order_agreement'] or 0):.0f}%")
    print("RESULT " + json.dumps(result.result()))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.costmodel", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fit = sub.add_parser("fit", help="fit a hardware profile to measured runs")
    _common(fit)
    fit.add_argument("--out", required=True, help="JSON file to write the fitted profile to")
    fit.add_argument("--base", default="h100-datasheet",
                     help="preset or profile JSON giving the fields not fitted and the data-sheet link bandwidths "
                          f"(default h100-datasheet; presets: {', '.join(HardwareProfile.preset_names())})")
    fit.add_argument("--name", default="fitted", help="the fitted profile's name")
    check = sub.add_parser("check", help="compare a profile's predictions with measured runs")
    _common(check)
    check.add_argument("--profile", default="h100", help="preset name or profile JSON (default h100)")
    check.add_argument("--plot", default=None, help="PNG file for the log-log scatter of predicted vs measured")
    args = parser.parse_args(argv)
    try:
        return _fit(args) if args.command == "fit" else _check(args)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
