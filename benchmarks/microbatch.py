"""This runtime's fixed cost per micro-batch: seconds per micro-batch and per layer of a
micro-batch at a few token counts, and the fitted ``layer_overhead_seconds``.

``hotswitch.calibration.measure_micro_batch`` times forward and backward of the real
``ParallelTransformer`` (one process, layout dp1) on one-sequence micro-batches of each
token count with the model cut to two layer counts; the difference per layer removes
what is outside the layers. Fitted: ``layer seconds = overhead + a * T + b * T^2``.

- CPU (one thread): a small fp32 model (hidden 128, 8 heads over 4 K/V heads, FFN 352,
  vocabulary 512), 1 and 3 layers.
- CUDA: LLaMA-7B-shaped layers (hidden 4096, 32 heads, FFN 11008, vocabulary 32000) with
  fp32 master weights and bf16 compute under autocast, 1 and 3 layers.

The CPU's proxies of the launch overhead, measured on every run whatever the device:
``kernels_per_layer`` — the kernels one layer launches per micro-batch, forward and backward:
ATen operators other than views and allocations (each at least one kernel launch on a GPU)
plus launches of the fused Triton kernels, at tp1 and tp2 (2 gloo ranks), on a 16-token
micro-batch of the CPU model under bf16 autocast, with the fused steps as CUDA runs them
(Triton, interpreted on the CPU; ``hotswitch.calibration.overhead.count_layer_ops``);
``kernels_per_layer_unfused`` — the same with the PyTorch path of those steps (the layer
before they were fused, and the CPU's path); ``kernels_per_layer_of_4`` — with the fused steps,
per micro-batch of a call of 4 micro-batches (what runs once per call spread over them;
not under ``--quick``); ``kernels_outside_layers`` (and ``_unfused``) — the kernels per
micro-batch outside the layers (embedding, final norm, loss head with its cross entropy, fused
or not); and ``host_layer_s_16`` — the seconds per layer
of a 16-token micro-batch on the CPU (PyTorch path; only when timing on the CPU). Without
``triton`` installed only the unfused count is reported.

``tp_overlap`` — the sequence-parallel column-parallel product (the layer's QKV and gate/up,
the loss head), forward and backward at tp2 on 2 gloo ranks of the CPU, fp32:
``gathered_linear``, which keeps only the rank's slice and whose backward gathers it again
beside the input gradient's product and reduce-scatters that gradient beside the weight
gradient's, against the gather followed by ``F.linear`` (which keeps the gathered rows; its
backward's products, then the reduce-scatter). Per shape ``tokens x hidden -> columns``:
median seconds of each (rank 0, the two alternating, a barrier before each) and
``serial_over_overlapped``. Gloo's thread shares the CPU's cores with the product, so this is
the CPU's figure only (measured only when timing on the CPU); on NCCL the collectives run on
their own stream.

``--graphs`` measures the same with the layers run from CUDA graphs (every token count a
graph bucket, so nothing is padded; on the CPU compiled and not captured):
``graph_layer_overhead_seconds`` (what ``RuntimeConfig.graph_layer_overhead_seconds`` takes)
and ``graph_layer_micro_batch_s``, beside the eager ``layer_overhead_seconds`` of the same run.

``micro_batch_s`` is per token count the time of a micro-batch through the model with the
larger layer count; ``layer_micro_batch_s`` the time per layer of a micro-batch. With
``--write-profile OUT.json`` the fitted overhead replaces ``layer_overhead_seconds`` of
``--base`` (a preset or a profile JSON; default on CUDA the preset named in the device's
name) and the profile is written, so the cost model plans with this runtime's own fixed
cost.

    .venv/bin/python -m benchmarks.microbatch [--quick] [--graphs] [--write-profile OUT.json --base h100|FILE.json]
"""

import argparse
import importlib.util
import json
import sys

import torch

import hotswitch as hs
from hotswitch.calibration.overhead import count_layer_ops, measure_micro_batch, with_layer_overhead
from hotswitch.distributed import spawn
from hotswitch.hardware import load_hardware, preset_for_device, save_profile
from benchmarks import rounded

CPU_MODEL = dict(hidden_size=128, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=352, vocab_size=512)
CUDA_MODEL = dict(hidden_size=4096, num_attention_heads=32, num_query_groups=32, ffn_hidden_size=11008,
                  vocab_size=32000)
CPU_TOKENS = (16, 32, 64, 128, 256, 512)
CPU_QUICK_TOKENS = (16, 64, 256)
CUDA_TOKENS = (64, 256, 1024, 4096, 8192)
CUDA_QUICK_TOKENS = (64, 1024, 4096)
LAYERS = (1, 3)
# (tokens, hidden, columns) of the tp overlap's column-parallel product, whole over 2 ranks.
OVERLAP_SHAPES = ((1024, 1024, 4096), (4096, 1024, 2048))
OVERLAP_QUICK_SHAPES = ((1024, 1024, 4096),)


def _overlap_rank(rank: int, world: int, shapes, repeats: int) -> dict:
    """Rank ``rank`` of ``world`` gloo ranks: median seconds of forward and backward of the
    column-parallel product per shape, overlapped and serial (see the module's docstring)."""
    import statistics
    import time

    import torch.distributed as dist
    import torch.nn.functional as F

    from hotswitch.model.comm import gather_from_sequence, gathered_linear

    group = dist.group.WORLD
    out = {}
    for tokens, hidden, columns in shapes:
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn(tokens // world, hidden, generator=gen).requires_grad_()
        w = torch.randn(columns // world, hidden, generator=gen).requires_grad_()
        grad = torch.randn(tokens, columns // world, generator=gen)
        paths = [("overlapped", lambda: gathered_linear(x, w, group, world, rank)),
                 ("serial", lambda: F.linear(gather_from_sequence(x, group, world, rank), w))]
        times = {name: [] for name, _ in paths}
        warmup = 2
        for i in range(warmup + repeats):
            for name, fn in (paths if i % 2 else paths[::-1]):
                dist.barrier(group)
                t0 = time.perf_counter()
                fn().backward(grad)
                elapsed = time.perf_counter() - t0
                x.grad = w.grad = None
                if i >= warmup:
                    times[name].append(elapsed)
        row = {name: statistics.median(v) for name, v in times.items()}
        row["serial_over_overlapped"] = row["serial"] / row["overlapped"]
        out[f"{tokens}x{hidden}->{columns}"] = row
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="three token counts, three repetitions")
    parser.add_argument("--cpu", action="store_true", help="time on the CPU even when CUDA is available")
    parser.add_argument("--graphs", action="store_true",
                        help="also time the layers run from CUDA graphs (graph buckets at the token counts; "
                             "compiled, and captured on CUDA): graph_layer_overhead_seconds")
    parser.add_argument("--write-profile", default=None, metavar="OUT.json",
                        help="write --base with the measured layer_overhead_seconds")
    parser.add_argument("--base", default=None,
                        help=f"profile to start from: a preset ({', '.join(hs.HardwareProfile.preset_names())}) "
                             "or a profile JSON (default on CUDA: the device's preset)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available() and not args.cpu
    tokens = (CUDA_QUICK_TOKENS if args.quick else CUDA_TOKENS) if cuda else \
        (CPU_QUICK_TOKENS if args.quick else CPU_TOKENS)
    shape = CUDA_MODEL if cuda else CPU_MODEL
    config = hs.TransformerConfig(num_layers=max(LAYERS), max_position_embeddings=max(tokens), **shape,
                                  compute_dtype="bfloat16" if cuda else None)
    base = None
    if args.write_profile is not None:
        spec = args.base
        if spec is None and cuda:
            spec = preset_for_device(torch.cuda.get_device_name(0))
        if spec is None:
            parser.error("--write-profile needs --base (a preset or a profile JSON) on this device")
        try:
            base = load_hardware(spec)
        except ValueError as e:
            parser.error(str(e))
    costs = measure_micro_batch(config, tokens, LAYERS, repeats=3 if args.quick else 7, cuda=cuda,
                                timeout=900.0)
    print(f"device: {costs.device} ({costs.device_name}); attention kernel {costs.attention}; compute "
          f"{costs.compute_dtype}; model hidden {shape['hidden_size']}, {shape['num_attention_heads']} heads, "
          f"FFN {shape['ffn_hidden_size']}, vocabulary {shape['vocab_size']}")
    high = max(LAYERS)
    print(f"{'tokens':>8}" + "".join(f"{f'{n} layers ms':>14}" for n in sorted(costs.micro_batch_seconds))
          + f"{'per layer ms':>14}{'fit ms':>10}")
    for i, t in enumerate(costs.token_counts):
        fit = costs.layer_overhead_seconds + costs.per_token_seconds * t + costs.per_score_seconds * t * t
        print(f"{t:>8}" + "".join(f"{costs.micro_batch_seconds[n][i] * 1e3:>14.3f}"
                                  for n in sorted(costs.micro_batch_seconds))
              + f"{costs.layer_seconds[i] * 1e3:>14.3f}{fit * 1e3:>10.3f}")
    print(f"fit: layer_overhead_seconds {costs.layer_overhead_seconds:.4g}, per token {costs.per_token_seconds:.4g} s, "
          f"per score {costs.per_score_seconds:.4g} s; largest relative error {costs.fit_error_max:.1%}")
    count_config = hs.TransformerConfig(num_layers=max(LAYERS), max_position_embeddings=max(CPU_TOKENS), **CPU_MODEL,
                                        compute_dtype="bfloat16")
    kernels = {"unfused": {}, "fused": {}}
    outside = {"unfused": {}, "fused": {}}
    paths = ("torch", "triton") if importlib.util.find_spec("triton") is not None else ("torch",)
    for path in paths:
        for tp in (1, 2):
            ops = count_layer_ops(count_config, tp=tp, tokens=16, layer_counts=LAYERS, kernels=path)
            kernels["fused" if path == "triton" else "unfused"][f"tp{tp}"] = ops["kernels"]
            outside["fused" if path == "triton" else "unfused"][f"tp{tp}"] = ops["kernels_outside_layers"]
            top = ", ".join(f"{k} {v:g}" for k, v in list(ops.items())[4:10])
            print(f"tp{tp}, {path} steps: {ops['kernels']:g} kernels, {ops['views']:g} views and "
                  f"{ops['allocations']:g} allocations per layer and micro-batch (16 tokens, bf16 autocast, "
                  f"CPU model), {ops['kernels_outside_layers']:g} kernels outside the layers; most: {top}")
    if kernels["fused"] and not args.quick:  # (two more interpreted runs: not under --quick)
        kernels["of_4"] = {}
        for tp in (1, 2):
            ops = count_layer_ops(count_config, tp=tp, tokens=16, layer_counts=LAYERS, kernels="triton",
                                  micro_batches=4)
            kernels["of_4"][f"tp{tp}"] = ops["kernels"]
            print(f"tp{tp}, triton steps, 4 micro-batches a call: {ops['kernels']:g} kernels per layer and "
                  f"micro-batch")
    for tp in (1, 2):
        if f"tp{tp}" in kernels["fused"]:
            print(f"tp{tp}: fused steps launch {kernels['unfused'][f'tp{tp}'] / kernels['fused'][f'tp{tp}']:.2f}x "
                  f"fewer kernels per layer than the unfused layer")
    overlap = {}
    if costs.device == "cpu":  # a figure of the CPU's gloo: not where a GPU is timed
        overlap = spawn(2, _overlap_rank, OVERLAP_QUICK_SHAPES if args.quick else OVERLAP_SHAPES,
                        5 if args.quick else 15, timeout=600.0, pg_timeout=600.0)[0]
    for shape, row in overlap.items():
        print(f"tp2 column-parallel product {shape} (gloo, CPU, fp32), forward+backward: overlapped "
              f"{row['overlapped'] * 1e3:.2f} ms, serial {row['serial'] * 1e3:.2f} ms, "
              f"serial/overlapped {row['serial_over_overlapped']:.3f}")
    result = {
        "device": costs.device,
        "device_name": costs.device_name,
        "attention": costs.attention,
        "compute_dtype": costs.compute_dtype,
        "layers": high,
        "micro_batch_s": {str(t): s for t, s in zip(costs.token_counts, costs.micro_batch_seconds[high])},
        "layer_micro_batch_s": {str(t): s for t, s in zip(costs.token_counts, costs.layer_seconds)},
        "layer_overhead_seconds": costs.layer_overhead_seconds,
        "fit_error_max": costs.fit_error_max,
        "kernels_per_layer": kernels["fused"] or None,
        "kernels_per_layer_unfused": kernels["unfused"],
        "kernels_per_layer_of_4": kernels.get("of_4"),
        "kernels_outside_layers": outside["fused"] or None,
        "kernels_outside_layers_unfused": outside["unfused"],
        "tp_overlap": overlap or None,
        "seconds": costs.seconds,
    }
    if args.graphs:
        graphed = measure_micro_batch(config, tokens, LAYERS, repeats=3 if args.quick else 7, cuda=cuda,
                                      timeout=900.0, graphs=True)
        print(f"{'tokens':>8}{'eager layer ms':>16}{'graphed layer ms':>18}")
        for i, t in enumerate(tokens):
            print(f"{t:>8}{costs.layer_seconds[i] * 1e3:>16.3f}{graphed.layer_seconds[i] * 1e3:>18.3f}")
        print(f"graphs: layer_overhead_seconds {graphed.layer_overhead_seconds:.4g} against "
              f"{costs.layer_overhead_seconds:.4g} eager (fit error max {graphed.fit_error_max:.1%}), "
              f"{graphed.seconds:.1f} s with compilation")
        result["graph_layer_overhead_seconds"] = graphed.layer_overhead_seconds
        result["graph_layer_micro_batch_s"] = {str(t): s for t, s in zip(tokens, graphed.layer_seconds)}
        result["graph_fit_error_max"] = graphed.fit_error_max
    if costs.device == "cpu" and 16 in costs.token_counts:
        result["host_layer_s_16"] = costs.layer_seconds[costs.token_counts.index(16)]
    if base is not None:
        profile = with_layer_overhead(base, costs, name=f"{base.name}+measured-overhead")
        save_profile(profile, args.write_profile)
        print(f"wrote {args.write_profile}: {base.name} with layer_overhead_seconds "
              f"{base.layer_overhead_seconds:.4g} -> {profile.layer_overhead_seconds:.4g}")
        result["profile"] = args.write_profile

    print("RESULT " + json.dumps({k: rounded(v) for k, v in result.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
