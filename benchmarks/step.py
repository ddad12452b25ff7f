"""Whole training steps on one device: the runtime's model against Hugging Face
``transformers``' ``LlamaForCausalLM``, both with ``torch.optim.AdamW``, on the same packed
micro-batches in the same run.

Model (CUDA): LLaMA-style, about 1.1B parameters (hidden 2048, 22 layers, 32 heads over 4
K/V heads, FFN 5632, vocabulary 32000, untied head), fp32 weights and optimizer state, bf16
compute under autocast, TF32 on. ``--quick``: a tiny model (hidden 128, 4 layers, 8 heads
over 4 K/V heads, FFN 352, vocabulary 512) in fp32 on the CPU, one thread (CPU figures,
never GPU ones).

Work: ``STEPS`` timed steps after one warm-up step, per micro-batch size (4096 and 16384
tokens; ``--quick``: 128 and 512). A step is ``MICRO_BATCHES`` packs of documents drawn from
``wikipedia.lengths`` (``--data-dir``), each cut to the micro-batch size and packed in draw
order until the next does not fit (``benchmarks.gpu.draw_packs``); forward and backward of
every pack with the loss the mean next-token cross entropy over the step's target tokens,
then one AdamW update (``fused=True`` on CUDA for both) and ``zero_grad``. Both models see
the same packs and token ids.

- Ours: ``hotswitch.ParallelTransformer`` at world 1 (the runtime's model, its default
  attention kernel and fused steps), ``forward_backward`` over the step's packs.
- ``--compile``: also ours with ``compile_layers=True`` (compiled in its warm-up step), in the
  same run: ``compiled_step_tokens_per_s``, ``compiled_step_mfu``, ``compiled_vs_ours`` (over
  ours eager) and ``compiled_vs_reference``.
- ``--graphs``: also ours with ``graph_buckets=[micro-batch size]`` (every pack padded to the
  micro-batch size, its layers run from CUDA graphs; compiled and not captured on the CPU),
  captured in its warm-up step, in the same run: ``graphed_step_tokens_per_s`` and
  ``graphed_step_mfu`` (of the real tokens: the padding is work the graphs add),
  ``graphed_vs_ours``, ``graphed_vs_reference``, ``graphed_padding`` (padding tokens over
  real ones) and ``graphed_from_graphs`` (false where the packs ran as they are: on the CPU a
  pack whose attention runs grouped has no static shapes).
- Reference: ``LlamaForCausalLM`` (``attn_implementation`` ``flex_attention`` on CUDA, ``sdpa``
  on the CPU), one row per pack whose ``position_ids`` restart at every document, so that
  transformers builds its packed-document mask; labels ``-100`` where a document begins (no
  target across documents); its mean loss per pack weighted by the pack's share of targets.

Figures: ``step_tokens_per_s`` (ours), ``reference_step_tokens_per_s``, ``step_vs_reference``
(ours over the reference), ``step_mfu`` (ours: 6 x the matrix parameters, head included, per
token plus 12 x d x heads x layers per causal query-key pair, over the device's bf16 dense
peak; on the CPU over a one-thread fp32 512^3 product's rate), ``reference_step_mfu``.

    .venv/bin/python -m benchmarks.step [--quick] [--data-dir DIR] [--budgets 4096,16384] [--compile] [--graphs]
"""

import argparse
import contextlib
import json
import sys
import time

import torch

import hotswitch as hs
from hotswitch.distributed import spawn
from benchmarks import default_data_dir, rounded
from benchmarks.gpu import _ints, _peak, _sync, document_lengths, draw_packs

MODEL = dict(num_layers=22, hidden_size=2048, num_attention_heads=32, num_query_groups=4, ffn_hidden_size=5632,
             vocab_size=32000)
QUICK_MODEL = dict(num_layers=4, hidden_size=128, num_attention_heads=8, num_query_groups=4, ffn_hidden_size=352,
                   vocab_size=512)
BUDGETS = (4096, 16384)
QUICK_BUDGETS = (128, 512)
MICRO_BATCHES = 4
STEPS = 3
QUICK_STEPS = 4
LR = 1e-4


def check_run(parser: argparse.ArgumentParser, quick: bool) -> bool:
    """Whether the run is on CUDA; stops through ``parser`` without ``transformers`` (the
    reference) or, for a full run, without a CUDA device."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        parser.error("the reference needs transformers (pip install -e '.[hf]')")
    cuda = torch.cuda.is_available() and not quick
    if not cuda and not quick:
        parser.error("no CUDA device: the full benchmark measures a GPU; run --quick for CPU figures")
    return cuda


def step_flops(cfg: hs.TransformerConfig, packs) -> float:
    """Model FLOPs of forward and backward over ``packs`` (lists of document lengths)."""
    d, h = cfg.head_dim, cfg.hidden_size
    hq, hkv = cfg.num_attention_heads, cfg.num_query_groups
    per_layer = (hq + 2 * hkv) * d * h + hq * d * h + 3 * cfg.ffn_hidden_size * h
    matrix = cfg.num_layers * per_layer + cfg.vocab_size * h
    tokens = sum(sum(p) for p in packs)
    pairs = sum(n * (n + 1) / 2 for p in packs for n in p)
    return 3.0 * (2.0 * matrix * tokens + 4.0 * hq * d * pairs * cfg.num_layers)


def _steps_of(spec, budget):
    """The token ids of every step's packs: ``[[ [ids of a document], ... ] per pack] per step]``."""
    gen = torch.Generator().manual_seed(budget)
    out = []
    for packs in spec["packs"][budget]:
        out.append([[torch.randint(0, spec["model"]["vocab_size"], (n,), generator=gen) for n in pack]
                    for pack in packs])
    return out


def _ours(cfg, device, steps, cuda, compile_layers=False, graph_buckets=None):
    layout = hs.Layout()
    model = hs.ParallelTransformer(cfg, layout, hs.ParallelGroups(layout), seed=0, compile_layers=compile_layers,
                                   graph_buckets=graph_buckets)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=cuda)
    batches = [[hs.MicroBatch.from_sequences(pack) for pack in step] for step in steps]

    def step(i):
        loss, targets = model.forward_backward(batches[i], 1.0 / hs.count_targets(batches[i]))
        model.finish_gradients()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss / targets

    fused = "compiled" if compile_layers else "graphed" if graph_buckets else model.kernels
    info = {"attention": model.attention_kernel, "fused": fused}
    if graph_buckets:
        # Whether the packs ran from the graphs (else as they are: attention grouped on the CPU).
        info["from_graphs"] = model.runs_graphed(graph_buckets[0])
    return step, info


def _reference(cfg, device, steps, cuda, compute):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=cfg.hidden_size, intermediate_size=cfg.ffn_hidden_size,
                         num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_query_groups,
                         num_hidden_layers=cfg.num_layers, vocab_size=cfg.vocab_size, rms_norm_eps=cfg.norm_eps,
                         max_position_embeddings=cfg.max_position_embeddings, rope_theta=cfg.rope_theta,
                         tie_word_embeddings=False, attention_bias=False, mlp_bias=False, attention_dropout=0.0)
    config._attn_implementation = "flex_attention" if cuda else "sdpa"
    model = LlamaForCausalLM(config).to(device)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, fused=cuda)
    batches = []
    for packs in steps:
        rows = []
        for pack in packs:
            ids = torch.cat(pack).unsqueeze(0)
            positions = torch.cat([torch.arange(len(doc)) for doc in pack]).unsqueeze(0)
            labels = ids.clone()
            labels[positions == 0] = -100  # a document's first token is no target of the previous one
            targets = sum(len(doc) - 1 for doc in pack)
            rows.append((ids.to(device), positions.to(device), labels.to(device), targets))
        batches.append(rows)

    def step(i):
        total = sum(r[3] for r in batches[i])
        loss_sum = 0.0
        for ids, positions, labels, targets in batches[i]:
            with torch.autocast(device.type, dtype=compute) if cuda else contextlib.nullcontext():
                loss = model(input_ids=ids, position_ids=positions, labels=labels).loss
            (loss * (targets / total)).backward()
            loss_sum += float(loss.detach()) * targets
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss_sum / total

    return step, {"attention": config._attn_implementation}


def _rank(rank, world, spec):
    cuda = spec["cuda"]
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    peak, peak_source = _peak(device)
    compute = torch.bfloat16
    rows = {}
    for budget in spec["budgets"]:
        cfg = hs.TransformerConfig(max_position_embeddings=budget, compute_dtype="bfloat16" if cuda else None,
                                   **spec["model"])
        steps = _steps_of(spec, budget)
        flops = sum(step_flops(cfg, packs) for packs in spec["packs"][budget][1:])
        tokens = sum(sum(sum(p) for p in packs) for packs in spec["packs"][budget][1:])
        row = {"budget": budget, "tokens": tokens}
        runs = [("ours", lambda: _ours(cfg, device, steps, cuda)),
                ("reference", lambda: _reference(cfg, device, steps, cuda, compute))]
        if spec["compile"]:
            runs.append(("compiled", lambda: _ours(cfg, device, steps, cuda, compile_layers=True)))
        if spec["graphs"]:
            runs.append(("graphed", lambda: _ours(cfg, device, steps, cuda, graph_buckets=[budget])))
        for name, make in runs:
            step, info = make()
            first = step(0)  # warm-up: lazy set-up and compiled kernels for these shapes
            _sync(device)
            t0 = time.perf_counter()
            for i in range(1, len(steps)):
                step(i)
            _sync(device)
            seconds = time.perf_counter() - t0
            row[name] = {"seconds": seconds, "tokens_per_s": tokens / seconds,
                         "mfu": flops / seconds / peak if peak else None, "first_loss": first, **info}
            if "from_graphs" in info:  # padded only where the packs ran from the graphs
                row[name]["padding"] = sum(budget - sum(p) for packs in spec["packs"][budget][1:] for p in packs) \
                    / tokens if info["from_graphs"] else 0.0
            print(f"measured {name} at {budget}-token micro-batches: {tokens / seconds:.0f} tokens/s, MFU "
                  f"{(row[name]['mfu'] or float('nan')):.1%}, {seconds:.3f} s, first loss {first:.4f}", flush=True)
            del step
            if cuda:
                torch.cuda.empty_cache()
        rows[str(budget)] = row
    return {"device": device.type, "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
            "peak_flops": peak, "peak_source": peak_source, "rows": rows}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a tiny model on the CPU (exercises the code)")
    parser.add_argument("--data-dir", default=default_data_dir(), help="holds wikipedia.lengths")
    parser.add_argument("--budgets", default=None, help="tokens a micro-batch, e.g. 4096 (default "
                                                        f"{','.join(map(str, BUDGETS))}; --quick: its own)")
    parser.add_argument("--compile", action="store_true",
                        help="also ours with compile_layers=True (regional torch.compile), in the same run")
    parser.add_argument("--graphs", action="store_true",
                        help="also ours with every pack padded to the micro-batch size and its layers run from CUDA "
                             "graphs, in the same run")
    args = parser.parse_args(argv)
    try:
        chosen = _ints(args.budgets, "--budgets", None)
    except ValueError as e:
        parser.error(str(e))
    cuda = check_run(parser, args.quick)
    start = time.perf_counter()
    lengths, source = document_lengths(parser, args.data_dir, args.quick)
    budgets = chosen or (QUICK_BUDGETS if args.quick else BUDGETS)
    steps = (QUICK_STEPS if args.quick else STEPS) + 1
    packs = {b: [draw_packs(lengths, b, MICRO_BATCHES, seed=b * 100 + s) for s in range(steps)] for b in budgets}
    spec = {"cuda": cuda, "budgets": budgets, "model": QUICK_MODEL if args.quick else MODEL, "packs": packs,
            "compile": args.compile, "graphs": args.graphs}
    out = spawn(1, _rank, spec, timeout=1800.0, pg_timeout=1800.0, backend="nccl" if cuda else "gloo")[0]
    model = spec["model"]
    print(f"device: {out['device']} ({out['device_name']}); peak {out['peak_flops'] or float('nan'):.4g} FLOP/s "
          f"({out['peak_source']}); model hidden {model['hidden_size']}, {model['num_layers']} layers, "
          f"{model['num_attention_heads']} heads over {model['num_query_groups']} K/V heads, FFN "
          f"{model['ffn_hidden_size']}, vocabulary {model['vocab_size']}; {MICRO_BATCHES} packs a step from {source}")
    print(f"{'micro-batch':>12}{'ours tok/s':>12}{'MFU':>7}{'HF tok/s':>11}{'MFU':>7}{'ours/HF':>9}  kernels (ours; HF)")
    result = {"device": out["device"], "device_name": out["device_name"], "step_tokens_per_s": {},
              "reference_step_tokens_per_s": {}, "step_vs_reference": {}, "step_mfu": {}, "reference_step_mfu": {}}
    for key, row in out["rows"].items():
        ours, ref = row["ours"], row["reference"]
        ratio = ours["tokens_per_s"] / ref["tokens_per_s"]
        result["step_tokens_per_s"][key] = ours["tokens_per_s"]
        result["reference_step_tokens_per_s"][key] = ref["tokens_per_s"]
        result["step_vs_reference"][key] = ratio
        result["step_mfu"][key] = ours["mfu"]
        result["reference_step_mfu"][key] = ref["mfu"]
        print(f"{key:>12}{ours['tokens_per_s']:>12.0f}{(ours['mfu'] or float('nan')):>7.1%}{ref['tokens_per_s']:>11.0f}"
              f"{(ref['mfu'] or float('nan')):>7.1%}{ratio:>9.2f}  {ours['attention']} + {ours['fused']} steps; "
              f"{ref['attention']}")
    for variant, wanted, what in (("compiled", args.compile, "compiled layers"),
                                  ("graphed", args.graphs, "layers from graphs")):
        if not wanted:
            continue
        for field in ("step_tokens_per_s", "step_mfu", "vs_ours", "vs_reference"):
            result[f"{variant}_{field}"] = {}
        for key, row in out["rows"].items():
            run = row[variant]
            result[f"{variant}_step_tokens_per_s"][key] = run["tokens_per_s"]
            result[f"{variant}_step_mfu"][key] = run["mfu"]
            result[f"{variant}_vs_ours"][key] = run["tokens_per_s"] / row["ours"]["tokens_per_s"]
            result[f"{variant}_vs_reference"][key] = run["tokens_per_s"] / row["reference"]["tokens_per_s"]
            note = ""
            if variant == "graphed":
                note = (f", padding {run['padding']:.1%} of the tokens" if run["from_graphs"] else
                        " (the packs ran as they are: their attention has no static shapes here)")
            print(f"{key:>12} {what}: {run['tokens_per_s']:.0f} tokens/s, MFU {(run['mfu'] or float('nan')):.1%}, "
                  f"over ours eager {result[f'{variant}_vs_ours'][key]:.2f}, over HF "
                  f"{result[f'{variant}_vs_reference'][key]:.2f}{note}")
        if variant == "graphed":
            result["graphed_padding"] = {key: row["graphed"]["padding"] for key, row in out["rows"].items()}
            result["graphed_from_graphs"] = {key: row["graphed"]["from_graphs"] for key, row in out["rows"].items()}
    result["seconds"] = time.perf_counter() - start
    print("RESULT " + json.dumps(rounded(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
