"""The model at device speed: tokens/s and MFU of LLaMA-7B-shaped layers on packed
micro-batches, against Hugging Face ``transformers``' LLaMA decoder layer on the same packs in
the same run, and the switch of the LLaMA-7B tensor set against the device's copy bandwidth.
Needs a CUDA device; ``--quick`` runs tiny shapes on the CPU instead (device "cpu": CPU
figures, never GPU ones).

Layers. ``LAYERS`` decoder layers of LLaMA-7B's shape (hidden 4096, 32 heads, 32 K/V heads,
FFN 11008) as one rank of a tensor-parallel group holds them: tp1, and the shard shapes of
tp2, tp4 and tp8 (heads / tp and FFN / tp; the hidden size stays) on one device, without the
TP collectives. fp32 weights (the runtime's master weights), bf16 compute under autocast
with the runtime's bf16 copies of the matrix weights (made once a pass over the micro-batches,
as the model makes them once a step, their gradients added into the fp32 ``.grad`` at every
micro-batch: ``TransformerLayer.use_compute_copies``),
the attention kernel ``hotswitch.model.attention.select_kernel`` chooses (one call per layer;
``--attention`` names another; ``attention`` in the RESULT line, per case),
the fused steps ``hotswitch.model.fused`` chooses (Triton on CUDA), forward and backward of
the layer stack (``TransformerLayer``, the runtime's own layer). ``--compile``: each layer
through ``torch.compile`` instead, as ``ParallelTransformer(compile_layers=True)`` runs it
(inductor fuses the PyTorch path of the steps; the warm-up pass compiles).
Micro-batches: documents drawn at random from ``wikipedia.lengths`` (``--data-dir``), each cut
to the micro-batch size (as Megatron cuts to ``seq_length``), packed in draw order until the
next does not fit; 4096 and 16384 tokens a micro-batch, ``MICRO_BATCHES`` timed after a
warm-up pass over each of them. Random token ids: the time does not depend on them.

- ``tokens_per_s``: tokens through the stack of ``LAYERS`` shard layers per second.
- ``mfu``: model FLOPs of those layers (per token 6 x the shard's matrix parameters, plus
  12 x d x heads per causal query-key pair, forward and backward) per second over the
  device's peak (the bf16 dense peak of the ``HardwareProfile`` preset named in the device's
  name; on the CPU the rate of a 512 x 512 fp32 matrix product on one thread).
- ``reference_tokens_per_s``, ``vs_reference``: the same ``LAYERS`` shard shapes as
  ``transformers``' ``LlamaDecoderLayer`` (same dtype policy, device and packs), each pack
  one row whose ``position_ids`` restart at every document, so that transformers' own
  ``create_causal_mask`` finds the packed documents and builds its mask once per pack for all
  layers: a FlexAttention block mask on CUDA (``attn_implementation="flex_attention"``), a
  dense block-diagonal mask for SDPA on the CPU. Rotary tables once per pack, outside the
  timing, as ours. ``vs_reference`` is ours over it, per case. None when ``transformers`` is
  missing.
- ``per_gpu_tokens_per_s``: what that rate means for a whole LLaMA-7B on tp GPUs:
  ``tokens_per_s * LAYERS / 32 / tp`` (each GPU runs 32 shard layers per token; TP
  collectives, the embedding, the head, the optimizer and pipeline bubbles are not counted,
  so it bounds the end-to-end figure from above).
- ``megatron_context``: context only, not a like-for-like ratio (whole Megatron-LM steps
  with embedding, head, TP collectives, bubbles and optimizer against a layer-only bound):
  Megatron-LM's per-GPU throughput from ``megatron_runs/runs.csv``, the best packed LLaMA-7B
  run (8 H100, bf16, flash attention) with the same tp whose ``seq_length`` equals the
  micro-batch size. Per run, tokens/s/GPU = ``global_batch_size * mean length /
  (iter_ms_median / 1000) / world``; the mean length comes from ``real_seq_len_hist`` (bucket
  ``K`` holds lengths in ``(K/2, K]``, taken at its midpoint, ``128`` at 64.5, capped at
  ``seq_length``); a run with an empty histogram takes the pooled histogram of the packed runs
  of its ``seq_length``. None where no such run exists (tp1 at 16K, tp8 at 4K) and in
  ``--quick``.
- ``switch_over_copy_bound``: on one device (world 1: only dp1 exists) a switch of the
  LLaMA-7B tensor set (bf16, 32 layers) between the ``"sharded"`` placement (one tensor per
  parameter) and the ``"zero"`` placement (one flat buffer) and back: the executor's packing
  and unpacking, which is all a switch does locally. Its seconds over those of one plain
  device copy of the same bytes; the larger of the two directions. Each switch writes into
  fresh memory (on the CPU its first touch costs about a copy of its own).
  ``switch_donated_over_copy_bound``: the same switches back and forth with ``donate=True``,
  as the runtime's phase switches of parameters run: each writes into the memory its last
  input held, and nothing is allocated. ``--quick`` switches the tiny model's set with as many
  layers, so as many tensors (195), as LLaMA-7B's: the per-tensor costs are the same, the
  bytes 51 MB.

    .venv/bin/python -m benchmarks.gpu [--quick] [--data-dir DIR] [--tp 1,2] [--budgets 4096]
                                       [--attention KERNEL] [--compile]
"""

import argparse
import contextlib
import csv
import json
import math
import os
import random
import sys
import time

import torch

import hotswitch as hs
from hotswitch.data import load_lengths
from hotswitch.distributed import spawn
from hotswitch.hardware import preset_for_device
from hotswitch.model.attention import KERNELS, PackAttention, select_kernel
from hotswitch.model.fused import select_fused
from hotswitch.model.init import init_shards
from hotswitch.model.transformer import LocalRegion, PackContext, TransformerLayer
from benchmarks import default_data_dir, rounded

DEFAULT_DATA_DIR = default_data_dir()
LLAMA_7B = dict(hidden_size=4096, num_attention_heads=32, num_query_groups=32, ffn_hidden_size=11008,
                vocab_size=32000)
MODEL_LAYERS = 32
LAYERS = 2
TPS = (1, 2, 4, 8)
BUDGETS = (4096, 16384)
MICRO_BATCHES = 4
WARMUP = 1
SWITCH_REPEATS = 3
QUICK = dict(model=dict(hidden_size=256, num_attention_heads=8, num_query_groups=8, ffn_hidden_size=688,
                        vocab_size=512), budgets=(128, 512), micro_batches=2, warmup=1,
             switch_layers=MODEL_LAYERS)  # as many tensors to switch as LLaMA-7B's set: 195


# ----------------------------------------------------------------------------- Megatron-LM


def _hist_mean(hist: dict, seq_length: int) -> float:
    total = weighted = 0.0
    for key, count in hist.items():
        top = seq_length if key == ">32k" else int(key)
        low = 1 if top == 128 else top // 2 + 1
        weighted += count * min((low + top) / 2.0, seq_length)
        total += count
    return weighted / total


def megatron_rows(path: str):
    """Packed LLaMA-7B runs of ``runs.csv`` with their derived per-GPU throughput (see the
    module docstring): dicts with ``run``, ``tp``, ``seq_length``, ``micro_batch_size``,
    ``mean_length``, ``micro_batch_tokens``, ``tokens_per_s_per_gpu``, ``histogram``
    (``"own"`` or ``"pooled"``)."""
    with open(path, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["family"] == "llama" and r["packing"] == "True" and
                int(r["hidden_size"]) == LLAMA_7B["hidden_size"] and int(r["num_layers"]) == MODEL_LAYERS]
    pooled = {}
    for r in rows:
        for key, count in json.loads(r["real_seq_len_hist"] or "{}").items():
            bucket = pooled.setdefault(int(r["seq_length"]), {})
            bucket[key] = bucket.get(key, 0) + count
    out = []
    for r in rows:
        seq = int(r["seq_length"])
        hist = json.loads(r["real_seq_len_hist"] or "{}")
        source = "own" if sum(hist.values()) else "pooled"
        if source == "pooled":
            if seq not in pooled:
                continue
            hist = pooled[seq]
        mean = _hist_mean(hist, seq)
        seconds = float(r["iter_ms_median"]) / 1000.0
        out.append({"run": r["run"], "tp": int(r["tp"]), "seq_length": seq,
                    "micro_batch_size": int(r["micro_batch_size"]), "mean_length": mean,
                    "micro_batch_tokens": int(r["micro_batch_size"]) * mean,
                    "tokens_per_s_per_gpu": int(r["global_batch_size"]) * mean / seconds / int(r["world"]),
                    "histogram": source})
    return out


def best_megatron(rows, tp: int, seq_length: int):
    """The fastest run with this tp and seq_length, or None."""
    matching = [r for r in rows if r["tp"] == tp and r["seq_length"] == seq_length]
    return max(matching, key=lambda r: r["tokens_per_s_per_gpu"]) if matching else None


# ----------------------------------------------------------------------------- micro-batches


def document_lengths(parser, data_dir: str, quick: bool):
    """``(lengths, source)``: ``wikipedia.lengths`` of ``data_dir``, or with ``quick`` a fixed
    log-normal sample when it is missing (otherwise a usage error)."""
    lengths_path = os.path.join(data_dir, "wikipedia.lengths")
    if os.path.exists(lengths_path):
        return load_lengths(lengths_path), "wikipedia.lengths"
    if not quick:
        parser.error(f"{lengths_path} not found (--data-dir)")
    rng = random.Random(5)
    print(f"{lengths_path} not found; --quick draws lengths from a log-normal sample")
    return [max(1, int(rng.lognormvariate(5.9, 1.2))) for _ in range(10000)], "log-normal sample"


def draw_packs(lengths, budget: int, count: int, seed: int):
    """``count`` packs (lists of sequence lengths) of at most ``budget`` tokens: documents
    drawn at random, cut to ``budget``, packed in draw order until the next does not fit."""
    rng = random.Random(seed)
    packs, pack = [], []
    while len(packs) < count:
        n = min(rng.choice(lengths), budget)
        if sum(pack) + n > budget:
            packs.append(pack)
            pack = []
        pack.append(n)
    return packs


def _layer_flops(cfg: hs.TransformerConfig, tp: int, pack) -> float:
    """Forward and backward FLOPs of one shard layer on one pack."""
    d, h = cfg.head_dim, cfg.hidden_size
    hq, hkv, ffn = cfg.num_attention_heads // tp, cfg.num_query_groups // tp, cfg.ffn_hidden_size // tp
    matrix = (hq + 2 * hkv) * d * h + hq * d * h + 2 * ffn * h + ffn * h
    pairs = sum(n * (n + 1) / 2 for n in pack)
    return 3.0 * (2.0 * matrix * sum(pack) + 4.0 * hq * d * pairs)


# ----------------------------------------------------------------------------- the rank


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak(device) -> tuple:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        preset = preset_for_device(name)
        if preset is None:
            return None, f"{name}: no preset"
        return hs.HardwareProfile.preset(preset).peak_flops, f"{preset} preset bf16 dense peak"
    n = 512
    a, b = torch.randn(n, n), torch.randn(n, n)
    best = math.inf
    for _ in range(5):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best, "fp32 512x512 matrix product, one thread"


def _timed(step, count: int, warmup: int, device) -> float:
    """Seconds of ``step(i)`` for every ``i < count`` once, after ``warmup`` untimed passes
    (a compiled kernel, FlexAttention, compiles for its shapes there, not in the timed loop)."""
    for _ in range(warmup):
        for i in range(count):
            step(i)
    _sync(device)
    t0 = time.perf_counter()
    for i in range(count):
        step(i)
    _sync(device)
    return time.perf_counter() - t0


def _reference_layers(cfg: hs.TransformerConfig, tp: int, device):
    """``transformers``' LLaMA decoder layers of the tp shard shapes (fp32 weights on
    ``device``) and their config, or None without ``transformers``."""
    try:
        from transformers import LlamaConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer
    except ImportError:
        return None
    config = LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_hidden_size // tp,
                         num_attention_heads=cfg.num_attention_heads // tp,
                         num_key_value_heads=cfg.num_query_groups // tp, head_dim=cfg.head_dim,
                         num_hidden_layers=LAYERS, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.norm_eps,
                         max_position_embeddings=cfg.max_position_embeddings, attention_bias=False,
                         mlp_bias=False, attention_dropout=0.0)
    config._attn_implementation = "flex_attention" if device.type == "cuda" else "sdpa"
    layers = [LlamaDecoderLayer(config, layer_idx=i).to(device) for i in range(LAYERS)]
    return config, layers


def _reference_seconds(cfg, tp, device, packs, compute, warmup) -> float:
    """Seconds of forward and backward of ``_reference_layers`` over ``packs``, or None."""
    made = _reference_layers(cfg, tp, device)
    if made is None:
        return None
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config, layers = made
    rotary = LlamaRotaryEmbedding(config).to(device)
    inputs = []
    for pack in packs:
        positions = torch.cat([torch.arange(n) for n in pack]).unsqueeze(0).to(device)
        probe = torch.empty(1, sum(pack), cfg.hidden_size, device=device,
                            dtype=compute if device.type == "cuda" else torch.float32)
        mask = create_causal_mask(config=config, inputs_embeds=probe, attention_mask=None, past_key_values=None,
                                  position_ids=positions)
        with torch.no_grad():
            tables = rotary(probe, positions)
        inputs.append((positions, mask, tables, torch.randn(1, sum(pack), cfg.hidden_size, device=device)))

    def step(i):
        positions, mask, tables, grad = inputs[i]
        x = torch.randn(1, grad.shape[1], cfg.hidden_size, device=device, requires_grad=True)
        with torch.autocast(device.type, dtype=compute) if device.type == "cuda" else contextlib.nullcontext():
            y = x
            for layer in layers:
                y = layer(y, attention_mask=mask, position_embeddings=tables, position_ids=positions)
        y.backward(grad)

    seconds = _timed(step, len(inputs), warmup, device)
    del layers, inputs
    return seconds


def _layers(rank, world, spec):
    device = torch.device("cuda", torch.cuda.current_device()) if spec["cuda"] else torch.device("cpu")
    if spec["cuda"]:
        torch.backends.cuda.matmul.allow_tf32 = True
    peak, peak_source = _peak(device)
    rows = {}
    for tp in spec["tps"]:
        cfg = hs.TransformerConfig(num_layers=LAYERS, max_position_embeddings=max(spec["budgets"]),
                                   compute_dtype="bfloat16" if spec["cuda"] else None, **spec["model"])
        shards = init_shards(cfg, hs.Layout.parse(f"tp{tp}"), 0, 0, device)  # rank 0's shard shapes
        layers = [TransformerLayer(cfg, tp, shards, f"layers.{i}.") for i in range(LAYERS)]
        del shards
        cfg_dtype = getattr(torch, cfg.dtype)
        compute = getattr(torch, cfg.compute_dtype or cfg.dtype)
        kernel = select_kernel(device, compute, cfg.head_dim, spec["attention"])
        region = LocalRegion()  # one TP rank's layer without its group: the shard's compute only
        for layer in layers:
            layer.kernels = select_fused(device)
            if spec["compile"]:  # as ParallelTransformer(compile_layers=True)
                layer.compile_pair()
        for budget, packs in spec["packs"].items():
            contexts = []
            for pack in packs:
                mb = hs.MicroBatch.from_sequences([torch.randint(0, cfg.vocab_size, (n,)) for n in pack])
                ctx = PackContext(mb, cfg, 1, device, kernel)
                ctx.attention = PackAttention(mb.cu_seqlens, kernel, cfg.num_attention_heads // tp, device)
                ctx.attention.prepare(compute)  # as the model prepares its packs: no call has a side effect
                contexts.append(ctx)
            attention = "+".join(sorted({c.attention.kernel for c in contexts}))
            grads = [torch.randn(ctx.num_tokens, cfg.hidden_size, device=device) for ctx in contexts]

            def step(i):
                if i == 0:  # once a step of len(contexts) micro-batches, as the model refreshes them
                    for layer in layers:
                        layer.use_compute_copies()
                x = torch.randn(contexts[i].num_tokens, cfg.hidden_size, device=device, requires_grad=True)
                with torch.autocast(device.type, dtype=compute) if compute != cfg_dtype else contextlib.nullcontext():
                    y, delta = x, None
                    for layer in layers:  # as the model runs its stack: each residual sum in the next norm
                        y, delta = layer.run_pair(y, delta, contexts[i], region)
                    y = y + delta
                y.backward(grads[i])

            seconds = _timed(step, len(contexts), spec["warmup"], device)
            del contexts, grads
            reference = _reference_seconds(cfg, tp, device, packs, compute, spec["warmup"])
            tokens = sum(sum(p) for p in packs)
            flops = LAYERS * sum(_layer_flops(cfg, tp, p) for p in packs)
            rows[f"tp{tp}/{budget}"] = {
                "tp": tp, "budget": budget, "tokens": tokens, "sequences": sum(len(p) for p in packs),
                "seconds": seconds, "tokens_per_s": tokens / seconds,
                "mfu": flops / seconds / peak if peak else None,
                "per_gpu_tokens_per_s": tokens / seconds * LAYERS / MODEL_LAYERS / tp,
                "attention": attention, "fused": layers[0].kernels,
                "reference_tokens_per_s": tokens / reference if reference else None,
                "vs_reference": reference / seconds if reference else None}
            row = rows[f"tp{tp}/{budget}"]
            # As it is measured: a run stopped at a time limit keeps what it measured.
            print(f"measured tp{tp}/{budget}: {row['tokens_per_s']:.0f} tokens/s, MFU "
                  f"{(row['mfu'] or float('nan')):.1%}, {row['attention']} attention, {seconds:.3f} s; "
                  f"transformers {(row['reference_tokens_per_s'] or float('nan')):.0f} tokens/s, ours over it "
                  f"{(row['vs_reference'] or float('nan')):.2f}x", flush=True)
        layers.clear()  # frees the weights before the next shape
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return {"device": device.type, "device_name": torch.cuda.get_device_name(device) if spec["cuda"] else "cpu",
            "peak_flops": peak, "peak_source": peak_source, "rows": rows}


def _switch(rank, world, spec):
    device = torch.device("cuda", torch.cuda.current_device()) if spec["cuda"] else torch.device("cpu")
    ts = hs.llama_tensor_set(num_layers=spec["switch_layers"], dtype="bfloat16", **spec["switch_model"])
    dp1 = hs.Layout.parse("dp1")
    shards = {s.name: torch.empty(tuple(s.shape), dtype=torch.bfloat16, device=device).normal_() for s in ts.specs}
    total = sum(t.numel() * t.element_size() for t in shards.values())

    def timed(fn):
        best = math.inf
        for _ in range(SWITCH_REPEATS + 1):  # the first builds the plan
            _sync(device)
            t0 = time.perf_counter()
            out = fn()
            _sync(device)
            best = min(best, time.perf_counter() - t0)
            del out
        return best

    flat = hs.switch(shards, ts, dp1, dp1, dst_kind="zero").shards
    to_zero = timed(lambda: hs.switch(shards, ts, dp1, dp1, dst_kind="zero"))
    to_sharded = timed(lambda: hs.switch(flat, ts, dp1, dp1, src_kind="zero"))
    dst = torch.empty_like(flat)
    copy = timed(lambda: dst.copy_(flat))
    del dst, flat
    # The runtime's steady state: the set switched back and forth with donate=True, as its phase
    # switches of parameters run, so each switch writes into the memory its last input held and
    # allocates nothing. The shards themselves start it (no copy of the set is kept beside them).
    state = {"shards": shards, "kind": "sharded"}
    shards = None
    donated = {"sharded": math.inf, "zero": math.inf}  # the fastest switch into each kind

    def flip():
        into = "zero" if state["kind"] == "sharded" else "sharded"
        _sync(device)
        t0 = time.perf_counter()
        state["shards"] = hs.switch(state["shards"], ts, dp1, dp1, src_kind=state["kind"], dst_kind=into,
                                    donate=True).shards
        _sync(device)
        return into, time.perf_counter() - t0

    for k in range(2 * (SWITCH_REPEATS + 1)):
        into, seconds = flip()
        state["kind"] = into
        if k >= 2:  # the first round trip builds the plans and the donated memory
            donated[into] = min(donated[into], seconds)
    return {"bytes": total, "to_zero_s": to_zero, "to_sharded_s": to_sharded, "copy_s": copy,
            "copy_bytes_per_s": 2.0 * total / copy, "donated_to_zero_s": donated["zero"],
            "donated_to_sharded_s": donated["sharded"]}


def _ints(text, flag, default):
    """A comma list of positive ints from the command line, or ``default`` when not given."""
    if text is None:
        return default
    try:
        values = tuple(int(x) for x in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v < 1 for v in values):
        raise ValueError(f"{flag} must be a comma list of positive ints, got {text!r}")
    return values


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (exercises the code)")
    parser.add_argument("--data-dir", default=DEFAULT_DATA_DIR,
                        help="holds wikipedia.lengths and megatron_runs/runs.csv (default: third_party/data when "
                             "script/gpu-check --prepare filled it, else ../shared/data)")
    parser.add_argument("--tp", default=None, help=f"tensor-parallel shard shapes, e.g. 1,2 (default "
                                                   f"{','.join(map(str, TPS))})")
    parser.add_argument("--attention", default=None, choices=KERNELS,
                        help="the layers' attention kernel (default: select_kernel's choice, logged per case)")
    parser.add_argument("--budgets", default=None, help=f"tokens a micro-batch, e.g. 4096 (default "
                                                        f"{','.join(map(str, BUDGETS))}; --quick: its own)")
    parser.add_argument("--compile", action="store_true",
                        help="our layers through torch.compile, as ParallelTransformer(compile_layers=True)")
    args = parser.parse_args(argv)
    try:
        tps = _ints(args.tp, "--tp", TPS)
        chosen_budgets = _ints(args.budgets, "--budgets", None)
    except ValueError as e:
        parser.error(str(e))
    bad = [t for t in tps if LLAMA_7B["num_attention_heads"] % t or LLAMA_7B["ffn_hidden_size"] % t]
    if bad:
        parser.error(f"--tp {bad[0]} does not divide LLaMA-7B's 32 heads and FFN 11008")
    cuda = torch.cuda.is_available() and not args.quick
    if not cuda and not args.quick:
        parser.error("no CUDA device: the full benchmark measures a GPU; run --quick for CPU figures")
    start = time.perf_counter()
    runs_path = os.path.join(args.data_dir, "megatron_runs", "runs.csv")
    lengths, source = document_lengths(parser, args.data_dir, args.quick)
    budgets = chosen_budgets or (QUICK["budgets"] if args.quick else BUDGETS)
    count = QUICK["micro_batches"] if args.quick else MICRO_BATCHES
    spec = {"cuda": cuda, "tps": tps, "budgets": budgets, "model": QUICK["model"] if args.quick else LLAMA_7B,
            "warmup": QUICK["warmup"] if args.quick else WARMUP, "attention": args.attention, "compile": args.compile,
            "packs": {b: draw_packs(lengths, b, count, seed=b) for b in budgets}}
    backend = "nccl" if cuda else "gloo"
    layers = spawn(1, _layers, spec, timeout=1500.0, pg_timeout=1500.0, backend=backend)[0]
    switch_spec = {"cuda": cuda, "switch_layers": QUICK["switch_layers"] if args.quick else MODEL_LAYERS,
                   "switch_model": QUICK["model"] if args.quick else LLAMA_7B}
    switch = spawn(1, _switch, switch_spec, timeout=900.0, pg_timeout=900.0, backend=backend)[0]

    megatron = megatron_rows(runs_path) if os.path.exists(runs_path) else []
    if not megatron:
        print(f"{runs_path}: no packed LLaMA-7B runs found; no Megatron-LM context")
    print(f"device: {layers['device']} ({layers['device_name']}); peak {layers['peak_flops'] or float('nan'):.4g} "
          f"FLOP/s ({layers['peak_source']}); {LAYERS} layers of "
          f"{'LLaMA-7B' if cuda else 'a tiny model'}; micro-batches from {source}")
    print(f"{'case':<12}{'kernel':>15}{'fused':>8}{'tokens':>8}{'seqs':>6}{'tokens/s':>11}{'MFU':>7}"
          f"{'HF tok/s':>10}{'vs HF':>7}{'per GPU':>10}  Megatron-LM context: best run tokens/s/GPU")
    tokens_per_s, mfu, reference, vs_reference, context = {}, {}, {}, {}, {}
    for key, row in layers["rows"].items():
        best = best_megatron(megatron, row["tp"], row["budget"]) if cuda else None
        tokens_per_s[key], mfu[key] = row["tokens_per_s"], row["mfu"]
        reference[key], vs_reference[key] = row["reference_tokens_per_s"], row["vs_reference"]
        context[key] = best["tokens_per_s_per_gpu"] if best else None
        print(f"{key:<12}{row['attention']:>15}{row['fused']:>8}{row['tokens']:>8}{row['sequences']:>6}"
              f"{row['tokens_per_s']:>11.0f}{(row['mfu'] or float('nan')):>7.1%}"
              f"{(row['reference_tokens_per_s'] or float('nan')):>10.0f}{(row['vs_reference'] or float('nan')):>7.2f}"
              f"{row['per_gpu_tokens_per_s']:>10.0f}"
              + (f"  {best['tokens_per_s_per_gpu']:.0f} ({best['run']}, micro-batch {best['micro_batch_tokens']:.0f} "
                 f"tokens, {best['histogram']} histogram; whole steps, not a like-for-like ratio)" if best else "  -"))
    if megatron:
        print("Megatron-LM packed LLaMA-7B runs, tokens/s/GPU: " + ", ".join(
            f"tp{r['tp']}@{r['seq_length']} mbs{r['micro_batch_size']} {r['tokens_per_s_per_gpu']:.0f}"
            for r in sorted(megatron, key=lambda r: (r["seq_length"], r["tp"], -r["tokens_per_s_per_gpu"]))))
    ratio = max(switch["to_zero_s"], switch["to_sharded_s"]) / switch["copy_s"]
    print(f"switch of {switch['bytes'] / 2**30:.2f} GiB (bf16, {switch_spec['switch_layers']} layers): sharded->zero "
          f"{switch['to_zero_s'] * 1e3:.2f} ms, zero->sharded {switch['to_sharded_s'] * 1e3:.2f} ms; one copy "
          f"{switch['copy_s'] * 1e3:.2f} ms ({switch['copy_bytes_per_s'] / 1e9:.1f} GB/s read+write); "
          f"ratio {ratio:.2f}")
    donated = max(switch["donated_to_zero_s"], switch["donated_to_sharded_s"]) / switch["copy_s"]
    print(f"the same switches back and forth with donate=True (the runtime's steady state, nothing allocated): "
          f"sharded->zero {switch['donated_to_zero_s'] * 1e3:.2f} ms, zero->sharded "
          f"{switch['donated_to_sharded_s'] * 1e3:.2f} ms; ratio {donated:.2f}")

    result = {"device": layers["device"], "device_name": layers["device_name"], "layers": LAYERS,
              "compile": args.compile,
              "tokens_per_s": tokens_per_s, "mfu": mfu, "reference_tokens_per_s": reference,
              "vs_reference": vs_reference, "attention": {k: r["attention"] for k, r in layers["rows"].items()},
              "megatron_context": context,
              "per_gpu_tokens_per_s": {k: r["per_gpu_tokens_per_s"] for k, r in layers["rows"].items()},
              "switch_over_copy_bound": ratio, "switch_donated_over_copy_bound": donated,
              "switch_bytes": switch["bytes"],
              "copy_bytes_per_s": switch["copy_bytes_per_s"], "seconds": time.perf_counter() - start}
    print("RESULT " + json.dumps(rounded(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
