"""The data path: reading Megatron-LM indexed datasets, preprocessing, and the data path's
share of a training step.

- ``index_read_docs_per_s``: a synthetic indexed dataset of 1M documents (``--quick``: 100k)
  with long-tailed lengths (log-normal, median 48 tokens, capped at 8192; uint16 tokens),
  written with numpy in the format's layout; the figure is documents read per second by
  ``IndexedDataset.tokens(i)`` (token ids as a list, what the sampler hands the runtime) at
  uniformly random document indices. ``index_open_s`` is the time to open it (map both files,
  check the index, compute the document lengths); ``sampler_docs_per_s`` is documents drawn
  per second by ``LengthAwareSampler`` (shuffled order, truncation to --seq-length).
- ``preprocess_docs_per_s``: ``python -m hotswitch.preprocess_data``'s loop (JSON parse,
  tokenize, write) over a JSONL of blocks of the Python standard library's source, one
  worker, byte tokenizer, ``--append-eod``; ``preprocess_sp_docs_per_s`` the same with a
  SentencePiece (Llama2Tokenizer) model of 1000 pieces trained on that text.
- ``step_overhead_vs_text_loader``: the same documents (those standard-library blocks) come
  once through the text loader (``Corpus``: read the file, cut the block, tokenize) and once
  through the indexed dataset that preprocess_data made of them (byte tokens, so the two
  give identical batches, which is checked). Each loader draws the global batches of
  --steps training steps; a world-1 ``Runtime`` trains the same batches (a small LLaMA-style
  model). ``data_share_indexed`` / ``data_share_text`` = mean time to draw a global batch /
  (draw + train step); ``step_overhead_vs_text_loader`` = (indexed draw - text draw) / text
  loader's whole step: the change of a step's time from switching loaders (negative: faster).

- ``bf16_parity_max_rel_loss_diff``: the tiny model of ``hotswitch.testing.scenarios`` trains
  two steps in bf16 compute (fp32 master weights) on one rank and under each of 4 static
  layouts of 4 ranks (dp4, dp2tp2, tp2pp2, pp4); the largest relative difference of a step's
  loss from the one-rank run's (the test bounds it by 1e-2, a few units of bf16's 2**-8).
  ``grad_norm_rel_diff_max``: the same runs in fp32, the largest relative difference of a
  step's gradient norm (before clipping) from the one-rank run's.

    .venv/bin/python -m benchmarks.data [--quick]
"""

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np



def _synthetic(prefix: str, documents: int, seed: int = 0) -> int:
    """Writes PREFIX.bin/.idx of ``documents`` one-sequence documents; returns the tokens."""
    from hotswitch.data.indexed import INDEX_HEADER

    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.maximum(rng.lognormal(np.log(48), 1.0, documents), 1), 8192).astype(np.int32)
    total = int(lengths.sum())
    with open(prefix + ".bin", "wb") as f:
        chunk = 1 << 24
        for start in range(0, total, chunk):
            f.write(rng.integers(0, 32000, min(chunk, total - start), dtype=np.uint16).tobytes())
    pointers = np.zeros(documents, dtype="<i8")
    np.cumsum(lengths[:-1].astype(np.int64) * 2, out=pointers[1:])
    with open(prefix + ".idx", "wb") as f:
        f.write(INDEX_HEADER + (1).to_bytes(8, "little") + bytes([8]))
        f.write(documents.to_bytes(8, "little") + (documents + 1).to_bytes(8, "little"))
        f.write(lengths.astype("<i4").tobytes() + pointers.tobytes())
        f.write(np.arange(documents + 1, dtype="<i8").tobytes())
    return total


def _index_read(tmp: str, documents: int, reads: int, seq_length: int) -> dict:
    from hotswitch.data.indexed import IndexedDataset
    from hotswitch.data.sampler import LengthAwareSampler

    prefix = os.path.join(tmp, "synthetic")
    start = time.perf_counter()
    tokens = _synthetic(prefix, documents)
    written = time.perf_counter() - start
    start = time.perf_counter()
    ds = IndexedDataset(prefix)
    opened = time.perf_counter() - start
    order = np.random.default_rng(1).integers(0, len(ds), reads)
    start = time.perf_counter()
    read_tokens = sum(len(ds.tokens(int(i))) for i in order)
    read_s = time.perf_counter() - start
    sampler = LengthAwareSampler(ds, max_length=seq_length, global_batch_size=256, seed=3)
    start = time.perf_counter()
    batches = max(1, reads // 256)
    for _ in range(batches):
        sampler.next_batch()
    sample_s = time.perf_counter() - start
    return {"documents": documents, "tokens": tokens, "bin_bytes": os.path.getsize(prefix + ".bin"),
            "write_s": round(written, 2), "index_open_s": round(opened, 4),
            "index_read_docs_per_s": round(reads / read_s), "index_read_tokens_per_s": round(read_tokens / read_s),
            "sampler_docs_per_s": round(batches * 256 / sample_s)}


def _stdlib_jsonl(path: str, max_files: int) -> int:
    """The stdlib blocks (the text loader's documents, in its order) as JSONL; returns the count."""
    from hotswitch.data.text import Corpus

    corpus = Corpus(unit="block", max_files=max_files)
    with open(path, "w") as f:
        for i in range(len(corpus)):
            p, a, b = corpus.spans[i]
            with open(corpus.paths[p], "rb") as g:
                text = g.read()[a:b].decode("utf-8")
            f.write(json.dumps({"text": text}) + "\n")
    return len(corpus)


def _preprocess(tmp: str, jsonl: str, sp_model: str) -> dict:
    from hotswitch.cli.preprocess_data import preprocess

    out = {}
    for key, kind, model in (("preprocess_docs_per_s", "ByteTokenizer", None),
                             ("preprocess_sp_docs_per_s", "Llama2Tokenizer", sp_model)):
        info = preprocess(jsonl, os.path.join(tmp, kind), ["text"], kind, model, append_eod=True, workers=1)
        out[key] = round(info["documents"] / info["seconds"])
        out[key.replace("docs", "tokens")] = round(info["tokens"]["text"] / info["seconds"])
    return out


def _step_share(rank, world, jsonl_prefix, max_files, steps, batch, seq_length):
    """Draw times of both loaders and train-step times of a world-1 runtime on the same batches."""

    import hotswitch as hs
    from hotswitch.data.indexed import IndexedDataset
    from hotswitch.data.sampler import LengthAwareSampler
    from hotswitch.data.text import Corpus

    cfg = hs.TransformerConfig(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=4,
                               ffn_hidden_size=192, vocab_size=384, max_position_embeddings=seq_length)
    rt = hs.Runtime(cfg, candidates="auto", max_context=seq_length, seed=1, recalibrate=False)
    samplers = {"text": LengthAwareSampler(Corpus(unit="block", max_files=max_files), seq_length,
                                           global_batch_size=batch, seed=2),
                "indexed": LengthAwareSampler(IndexedDataset(jsonl_prefix), seq_length,
                                              global_batch_size=batch, seed=2)}
    draw = {k: [] for k in samplers}
    step = []
    for i in range(steps + 1):
        got = {}
        for k, s in samplers.items():
            start = time.perf_counter()
            got[k] = s.next_batch()
            draw[k].append(time.perf_counter() - start)
        if got["text"] != got["indexed"]:
            raise SystemExit("benchmarks.data: the text loader and the indexed dataset drew different batches")
        start = time.perf_counter()
        rt.train_step(got["indexed"])
        step.append(time.perf_counter() - start)
    # The first step builds caches and plans: left out.
    return {k: float(np.mean(v[1:])) for k, v in draw.items()}, float(np.mean(step[1:]))


PARITY_LAYOUTS = ["dp4", "dp2tp2", "tp2pp2", "pp4"]


def _parity() -> dict:
    from hotswitch.testing.harness import run_world
    from hotswitch.testing.precision import max_rel_diff, parity

    single = run_world(1, parity, ["dp1"], ["bfloat16", None], timeout=900)[0]
    multi = run_world(4, parity, PARITY_LAYOUTS, ["bfloat16", None], timeout=900)[0]
    loss = max_rel_diff(multi["bfloat16"], single["bfloat16"]["dp1"], 0)
    grad_norm = max_rel_diff(multi["float32"], single["float32"]["dp1"], 1)
    return {"parity_layouts": PARITY_LAYOUTS, "bf16_parity_max_rel_loss_diff": float(f"{loss:.3e}"),
            "grad_norm_rel_diff_max": float(f"{grad_norm:.3e}")}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="100k synthetic documents, fewer reads and steps")
    p.add_argument("--documents", type=int, default=None, help="synthetic documents (default 1M; quick 100k)")
    p.add_argument("--steps", type=int, default=None, help="training steps timed (default 8; quick 3)")
    p.add_argument("--max-files", type=int, default=None, help="stdlib files (default 400; quick 120)")
    p.add_argument("--seq-length", type=int, default=512)
    p.add_argument("--global-batch-size", type=int, default=32)
    a = p.parse_args(argv)
    a.documents = a.documents or (100_000 if a.quick else 1_000_000)
    a.steps = a.steps or (3 if a.quick else 8)
    a.max_files = a.max_files or (120 if a.quick else 400)
    reads = 20_000 if a.quick else 200_000

    from hotswitch.data.text import default_corpus_dir, text_files
    from hotswitch.data.tokenizers import train_sentencepiece
    from hotswitch.testing.harness import run_world

    start = time.monotonic()
    result = {"quick": a.quick}
    with tempfile.TemporaryDirectory() as tmp:
        result.update(_index_read(tmp, a.documents, reads, a.seq_length))
        print(f"indexed read: {result}", flush=True)
        jsonl = os.path.join(tmp, "stdlib.jsonl")
        result["stdlib_documents"] = _stdlib_jsonl(jsonl, a.max_files)
        model = os.path.join(tmp, "tok.model")
        train_sentencepiece((d.decode() for _, d in text_files(default_corpus_dir(), 60)), model, 1000)
        result.update(_preprocess(tmp, jsonl, model))
        print(f"preprocess: {result}", flush=True)
        draw, step = run_world(1, _step_share, os.path.join(tmp, "ByteTokenizer_text_document"), a.max_files,
                               a.steps, a.global_batch_size, a.seq_length, timeout=1800)[0]
    result.update(_parity())
    print(f"parity: {result}", flush=True)
    text_step = draw["text"] + step
    result.update({
        "draw_text_s": round(draw["text"], 5), "draw_indexed_s": round(draw["indexed"], 5),
        "train_step_s": round(step, 4),
        "data_share_text": round(draw["text"] / text_step, 5),
        "data_share_indexed": round(draw["indexed"] / (draw["indexed"] + step), 5),
        "step_overhead_vs_text_loader": round((draw["indexed"] - draw["text"]) / text_step, 5),
        "wall_s": round(time.monotonic() - start, 1),
    })
    print("RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
