"""Where a training step's time goes: ``benchmarks.step``'s whole training steps (the
runtime's model and ``transformers``' ``LlamaForCausalLM``, each with AdamW, on the same
packed micro-batches) timed, then run again under ``torch.profiler``, one trace each,
summarised by ``hotswitch.analysis.trace``.

Model and packs: ``benchmarks.step``'s (CUDA: the 1.1B LLaMA-style model, bf16 compute over
fp32 weights; ``--quick``: its tiny model on the CPU, one thread, CPU figures, never GPU ones),
one micro-batch size (``--budget``, default 4096; ``--quick`` 512), ``MICRO_BATCHES`` packs a
step. After one warm-up step, ``STEPS`` steps are timed plainly, then the same steps run again
under the profiler, each inside a ``record_function("step")`` range that ends once the device is
done (a ``torch.cuda.synchronize``, so every kernel of the step falls inside it).

Figures, per step, for ``ours`` and ``reference``:

- ``step_s``: seconds a step, timed without the profiler; ``profiled_step_s`` with it (the
  profiler's own cost on the host is the difference);
- ``busy_share``: the share of the profiled step's wall time in which the device ran a kernel
  (the union of its kernels' intervals). The rest is the device waiting for the host: Python,
  autograd, launches, or a host wait. On the CPU: the share spent inside operators that do
  work, the rest being Python and the framework between them;
- ``kernels``: kernels a step (CPU: operators that do work);
- ``syncs``: the host's waits for the device a step, not counting the benchmark's own
  synchronize that closes each step (CUDA only);
- ``seconds_by_kind``: the kernels' seconds a step by kind (``hotswitch.analysis.trace.KINDS``:
  matrix products, attention, the model's fused Triton steps, PyTorch's element-wise kernels,
  collectives, the optimizer, copies);
- ``top``: the longest kernels by name (``[name, count, seconds]`` a step).

``--compile``: ours with ``compile_layers=True`` (compiled in the warm-up step).
``--trace DIR`` also writes both traces (``ours.json.gz``, ``reference.json.gz``; they open in
Perfetto and Holistic Trace Analysis).

    .venv/bin/python -m benchmarks.profile [--quick] [--data-dir DIR] [--budget 4096] [--trace DIR] [--compile]
"""

import argparse
import gzip
import json
import os
import shutil
import sys
import tempfile
import time

import torch
from torch.profiler import ProfilerActivity, profile, record_function

import hotswitch as hs
from hotswitch.analysis.trace import load_trace, summarize
from hotswitch.distributed import spawn
from benchmarks import default_data_dir, rounded
from benchmarks.gpu import _ints, _sync, document_lengths, draw_packs
from benchmarks.step import MICRO_BATCHES, MODEL, QUICK_MODEL, _ours, _reference, _steps_of, check_run

BUDGET = 4096
QUICK_BUDGET = 512
STEPS = 2
TOP = 8


def _profiled(step, first: int, count: int, device, path: str) -> float:
    """Runs ``step(first) ... step(first + count - 1)`` under the profiler, each in a ``step``
    range closed by a synchronize; writes the trace to ``path``; returns the wall seconds."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    _sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        for i in range(first, first + count):
            with record_function("step"):
                step(i)
                _sync(device)
        seconds = time.perf_counter() - t0
    prof.export_chrome_trace(path)
    return seconds


def _rank(rank, world, spec):
    cuda = spec["cuda"]
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    budget = spec["budget"]
    cfg = hs.TransformerConfig(max_position_embeddings=budget, compute_dtype="bfloat16" if cuda else None,
                               **spec["model"])
    steps = _steps_of(spec, budget)
    out = {"device": device.type, "device_name": torch.cuda.get_device_name(device) if cuda else "cpu"}
    for name, make in (("ours", lambda: _ours(cfg, device, steps, cuda, spec["compile"])),
                       ("reference", lambda: _reference(cfg, device, steps, cuda, torch.bfloat16))):
        step, info = make()
        step(0)  # warm-up: lazy set-up and compiled kernels for these shapes
        _sync(device)
        t0 = time.perf_counter()
        for i in range(1, 1 + STEPS):
            step(i)
        _sync(device)
        plain = (time.perf_counter() - t0) / STEPS
        path = os.path.join(spec["trace_dir"], f"{name}.json")
        profiled = _profiled(step, 1, STEPS, device, path) / STEPS  # the same steps again
        summary = summarize(load_trace(path), window="step", top=TOP).per_window()
        if cuda:
            summary["syncs"] -= 1  # the synchronize that closes each step is the benchmark's
        else:
            summary["syncs"] = None
        out[name] = {"step_s": plain, "profiled_step_s": profiled, **summary, **info}
        print(f"profiled {name}: {plain * 1e3:.1f} ms a step ({profiled * 1e3:.1f} ms profiled), device busy "
              f"{summary['busy_share']:.1%}, {summary['kernels']:.0f} kernels a step", flush=True)
        del step
        if cuda:
            torch.cuda.empty_cache()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny model on the CPU (exercises the code)")
    parser.add_argument("--data-dir", default=default_data_dir(), help="holds wikipedia.lengths")
    parser.add_argument("--budget", default=None, help=f"tokens a micro-batch (default {BUDGET}; --quick "
                                                       f"{QUICK_BUDGET})")
    parser.add_argument("--trace", default=None, metavar="DIR", help="also write both traces there (gzipped)")
    parser.add_argument("--compile", action="store_true", help="ours with compile_layers=True (regional torch.compile)")
    args = parser.parse_args(argv)
    try:
        chosen = _ints(args.budget, "--budget", None)
    except ValueError as e:
        parser.error(str(e))
    if chosen is not None and len(chosen) != 1:
        parser.error(f"--budget takes one number of tokens, got {args.budget!r}")
    cuda = check_run(parser, args.quick)
    start = time.perf_counter()
    lengths, source = document_lengths(parser, args.data_dir, args.quick)
    budget = chosen[0] if chosen else (QUICK_BUDGET if args.quick else BUDGET)
    packs = {budget: [draw_packs(lengths, budget, MICRO_BATCHES, seed=budget * 100 + s)
                      for s in range(1 + STEPS)]}
    model = QUICK_MODEL if args.quick else MODEL
    scratch = tempfile.mkdtemp(prefix="hotswitch-profile-")
    try:
        spec = {"cuda": cuda, "budget": budget, "model": model, "packs": packs, "trace_dir": scratch,
                "compile": args.compile}
        out = spawn(1, _rank, spec, timeout=1800.0, pg_timeout=1800.0, backend="nccl" if cuda else "gloo")[0]
        if args.trace:
            os.makedirs(args.trace, exist_ok=True)
            for name in ("ours", "reference"):
                with open(os.path.join(scratch, f"{name}.json"), "rb") as f, \
                        gzip.open(os.path.join(args.trace, f"{name}.json.gz"), "wb") as g:
                    shutil.copyfileobj(f, g)
            print(f"traces: {', '.join(os.path.join(args.trace, n + '.json.gz') for n in ('ours', 'reference'))}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"device: {out['device']} ({out['device_name']}); model hidden {model['hidden_size']}, "
          f"{model['num_layers']} layers; {MICRO_BATCHES} packs of {budget} tokens a step from {source}; "
          f"figures per step")
    kinds = list(out["ours"]["seconds_by_kind"])
    print(f"{'':<10}{'step ms':>9}{'busy':>7}{'kernels':>9}{'syncs':>7}" + "".join(f"{k[:9]:>10}" for k in kinds)
          + "   (kernel ms by kind)")
    for name in ("ours", "reference"):
        r = out[name]
        print(f"{name:<10}{r['step_s'] * 1e3:>9.1f}{r['busy_share']:>7.1%}{r['kernels']:>9.0f}"
              f"{(r['syncs'] if r['syncs'] is not None else float('nan')):>7.0f}"
              + "".join(f"{r['seconds_by_kind'][k] * 1e3:>10.2f}" for k in kinds))
    for name in ("ours", "reference"):
        print(f"longest kernels, {name}: " + "; ".join(f"{n[:60]} x{c:.0f} {s * 1e3:.2f} ms"
                                                       for n, c, s in out[name]["top"]))
    result = {"device": out["device"], "device_name": out["device_name"], "budget": budget, "compile": args.compile,
              "step_vs_reference": out["reference"]["step_s"] / out["ours"]["step_s"]}
    for name in ("ours", "reference"):
        r = out[name]
        result[name] = {"step_s": r["step_s"], "profiled_step_s": r["profiled_step_s"], "busy_share": r["busy_share"],
                        "kernels": r["kernels"], "syncs": r["syncs"], "seconds_by_kind": r["seconds_by_kind"],
                        "top": [[n[:80], round(c, 2), float(f"{s:.4g}")] for n, c, s in r["top"]]}
    result["seconds"] = time.perf_counter() - start
    print("RESULT " + json.dumps(rounded(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
