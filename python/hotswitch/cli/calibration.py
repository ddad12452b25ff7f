"""Calibrates a hardware profile on this machine and writes it as JSON.

    python -m hotswitch.calibration --out profile.json [--world 2] [--quick]
    python3 -m hotswitch.calibration --device cuda --out profile.json [--model llama-7b] [--tp 1,2,4,8]

Spawns ``--world`` gloo processes, times forward and backward of a small parallel
transformer and the layouts' collectives, fits the cost model's hardware fields
(``hotswitch.calibrate``) and writes the profile with ``hotswitch.save_profile``. With ``--device cuda`` (or ``cpu``) it
instead times the model's own layer shards at the shapes of each ``--tp`` on one device, over
``--lengths`` tokens a micro-batch, and fits the compute fields of ``--base`` (default on CUDA:
the device's preset, fitted to measured Megatron-LM runs) to them (``calibration.shards``); it
prints the fitted fields beside ``--base``'s. Use it like a preset:
``python -m hotswitch.cli.plan --hardware profile.json`` or
``hotswitch.Runtime(..., hardware=hotswitch.load_profile("profile.json"))``.
"""

import argparse
import sys

from hotswitch._C import HardwareProfile, Layout
from hotswitch.calibration.offline import DEFAULT_LENGTHS, DEFAULT_MESSAGE_BYTES, calibrate
from hotswitch.hardware import save_profile
from hotswitch.model.config import TransformerConfig

__all__ = ["main"]

QUICK_LENGTHS = (32, 128, 384)
QUICK_MESSAGE_BYTES = (64 << 10, 1 << 20, 4 << 20)
QUICK_REPEATS = 3


def _ints(text: str, flag: str):
    try:
        values = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ValueError(f"{flag} must be comma-separated ints, got {text!r}") from None
    return values


SHARD_LENGTHS = (256, 1024, 4096, 16384, 32768)
SHARD_QUICK_LENGTHS = (256, 1024, 4096)


def _shards_main(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--device``: the model's layer shards on one device, the compute fields fitted."""
    import dataclasses

    import torch

    from hotswitch._C import ModelConfig
    from hotswitch.calibration.shards import fit_shards, measure_shards
    from hotswitch.hardware import load_hardware, preset_for_device

    cuda = args.device == "cuda"
    try:
        if cuda and not torch.cuda.is_available():
            raise ValueError("--device cuda, but no CUDA device is available")
        spec = args.base or (preset_for_device(torch.cuda.get_device_name(0)) if cuda else None)
        if spec is None:
            raise ValueError("--base is needed on this device: a preset or a profile JSON whose peak_flops and "
                             "memory_bandwidth are this device's")
        base = load_hardware(spec)
        tps = _ints(args.tp, "--tp") if args.tp else ([1, 2] if args.quick else [1, 2, 4, 8])
        lengths = _ints(args.lengths, "--lengths") if args.lengths else \
            list(SHARD_QUICK_LENGTHS if args.quick else SHARD_LENGTHS)
        m = ModelConfig.preset(args.model)
        config = TransformerConfig(num_layers=m.num_layers, hidden_size=m.hidden_size,
                                   num_attention_heads=m.num_attention_heads, num_query_groups=m.num_query_groups,
                                   ffn_hidden_size=m.ffn_hidden_size, vocab_size=m.vocab_size,
                                   max_position_embeddings=max(lengths), compute_dtype="bfloat16" if cuda else None)
        if not cuda:
            config = dataclasses.replace(config, **{f: getattr(args, f) for f in
                                                    ("hidden_size", "num_attention_heads", "num_query_groups",
                                                     "ffn_hidden_size", "vocab_size")})
        repeats = args.repeats if args.repeats is not None else 3
        times = measure_shards(config, tps, lengths, repeats=repeats, cuda=cuda, timeout=args.timeout)
        profile, report = fit_shards(times, base, name=args.name)
        save_profile(profile, args.out)
    except ValueError as e:
        parser.error(str(e))
    print(f"device: {times.device} ({times.device_name}); attention {times.attention}; compute "
          f"{times.compute_dtype}; shards of hidden {config.hidden_size}, {config.num_attention_heads} heads, "
          f"FFN {config.ffn_hidden_size} at tp {', '.join(map(str, tps))}; {times.seconds:.0f} s")
    print(f"{'tp':>4}{'tokens':>8}{'measured ms':>13}{'predicted ms':>14}{'error':>8}")
    for smp in report["samples"]:
        print(f"{smp['tp']:>4}{smp['tokens']:>8}{smp['measured_s'] * 1e3:>13.3f}{smp['predicted_s'] * 1e3:>14.3f}"
              f"{smp['error']:>8.1%}")
    was = base.to_dict()
    print(f"{'field':<24}{'fitted':>14}{'--base ' + base.name:>22}")
    for name, value in report["fitted"].items():
        print(f"{name:<24}{value:>14.5g}{was[name]:>22.5g}" + ("  (at a bound)" if name in report["at_bound"] else ""))
    print(f"fit error: median {report['median_abs_rel_error']:.1%}, max {report['max_abs_rel_error']:.1%}")
    print(f"wrote {args.out}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.calibration", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file to write the profile to")
    parser.add_argument("--device", default=None, choices=("cuda", "cpu"),
                        help="time the model's layer shards on one device and fit the compute fields of --base")
    parser.add_argument("--model", default="llama-7b", help="with --device: the model whose shards are timed "
                        "(on cpu only its layer count: the shapes come from --hidden-size etc.)")
    parser.add_argument("--tp", default=None, help="with --device: tensor-parallel sizes (default 1,2,4,8)")
    parser.add_argument("--world", type=int, default=2, help="processes to measure with (2..8)")
    parser.add_argument("--quick", action="store_true",
                        help=f"lengths {','.join(map(str, QUICK_LENGTHS))}, {QUICK_REPEATS} repeats, no pp check "
                             "(under a minute)")
    parser.add_argument("--lengths", default=None,
                        help=f"tokens per micro-batch, e.g. {','.join(map(str, DEFAULT_LENGTHS))}")
    parser.add_argument("--repeats", type=int, default=None, help="timed repetitions per sample (default 5)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds for the whole measurement")
    parser.add_argument("--name", default="calibrated", help="the profile's name")
    parser.add_argument("--memory-gb", type=float, default=None,
                        help="per-rank memory budget in GiB (default: --base's, else host memory / world)")
    parser.add_argument("--base", default=None,
                        help=f"preset whose memory budget to keep: {', '.join(HardwareProfile.preset_names())}")
    for flag, default in (("num-layers", 2), ("hidden-size", 128), ("num-attention-heads", 8),
                          ("num-query-groups", 4), ("ffn-hidden-size", 352), ("vocab-size", 512)):
        parser.add_argument(f"--{flag}", type=int, default=default, help=f"model to time (default {default})")
    args = parser.parse_args(argv)
    if args.device is not None:
        return _shards_main(parser, args)
    try:
        if args.lengths is not None:
            lengths = _ints(args.lengths, "--lengths")
        else:
            lengths = list(QUICK_LENGTHS if args.quick else DEFAULT_LENGTHS)
        repeats = args.repeats if args.repeats is not None else (QUICK_REPEATS if args.quick else 5)
        memory = None
        if args.memory_gb is not None:
            if not args.memory_gb > 0:
                raise ValueError(f"--memory-gb must be > 0, got {args.memory_gb}")
            memory = int(args.memory_gb * (1 << 30))
        config = TransformerConfig(num_layers=args.num_layers, hidden_size=args.hidden_size,
                                      num_attention_heads=args.num_attention_heads,
                                      num_query_groups=args.num_query_groups, ffn_hidden_size=args.ffn_hidden_size,
                                      vocab_size=args.vocab_size,
                                      max_position_embeddings=max(lengths + [1]))
        checks = [f"tp{args.world}"] if args.quick else None
        if checks:
            try:
                config.validate(Layout.parse(checks[0]))
            except ValueError:
                checks = []
        profile, report = calibrate(
            config, world=args.world, lengths=lengths, repeats=repeats, timeout=args.timeout,
            message_bytes=list(QUICK_MESSAGE_BYTES if args.quick else DEFAULT_MESSAGE_BYTES),
            check_layouts=checks, memory_bytes=memory, base=args.base, name=args.name)
        save_profile(profile, args.out)
    except ValueError as e:
        parser.error(str(e))

    print(f"{'kind':<18}{'layout':<8}{'size':>22}{'measured ms':>13}{'predicted ms':>14}{'error':>8}  role")
    for s in report["samples"]:
        size = "+".join("/".join(map(str, m)) for m in s["lengths"]) + " tok" if "lengths" in s \
            else f"{s['bytes']} B"
        print(f"{s['kind']:<18}{s['layout']:<8}{size:>22}{s['measured_s'] * 1e3:>13.3f}{s['predicted_s'] * 1e3:>14.3f}"
              f"{s['error']:>8.1%}  {s['role']}")
    f = report["fitted"]
    print(f"fitted: peak_flops {f['peak_flops']:.4g} FLOP/s ({report['peak_flops_source']}), "
          f"efficiency {f['efficiency']:.4f}, attention_efficiency {f['attention_efficiency']:.4f}, "
          f"layer_overhead_seconds {f['layer_overhead_seconds']:.4g}, "
          f"sequence_overhead_seconds {f['sequence_overhead_seconds']:.4g}, "
          f"intra/inter_node_bandwidth {f['intra_node_bandwidth']:.4g} B/s, "
          f"intra/inter_node_latency {f['intra_node_latency']:.4g} s; memory_bytes {report['memory_bytes']}")
    for note in report["notes"]:
        print(f"note: {note}")
    line = f"fit error: median {report['fit_error_median']:.1%}, max {report['fit_error_max']:.1%}"
    if report["check_error_median"] is not None:
        line += (f"; check ({', '.join(report['check_layouts'])}, not fitted): median "
                 f"{report['check_error_median']:.1%}, max {report['check_error_max']:.1%}")
    print(line)
    print("fit error median by kind: " + ", ".join(f"{k} {v:.1%}" for k, v in report["fit_error_median_by_kind"].items()))
    print(f"wrote {args.out} ({report['world']} ranks, {report['seconds']:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
