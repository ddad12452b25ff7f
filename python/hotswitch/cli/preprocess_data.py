"""Tokenizes a JSONL file into Megatron-LM's indexed dataset format, as Megatron-LM's
``tools/preprocess_data.py`` does:

    python -m hotswitch.preprocess_data --input F.jsonl --json-keys text \\
        --output-prefix P --tokenizer-type Llama2Tokenizer --tokenizer-model tok.model \\
        --append-eod --workers 2

writes ``P_text_document.bin`` and ``P_text_document.idx`` (one pair per JSON key): one
document per JSON line, the key's text tokenized (a list of strings is one sequence each),
``<eod>`` appended with ``--append-eod``; tokens as uint16 below 65500 ids, int32 above. The
files are what Megatron-LM writes for the same tokens, byte for byte, and what
``python -m hotswitch.train --data-path P_text_document`` reads. Blank lines are skipped.
"""

import argparse
import json
import multiprocessing
import sys
import time
from typing import Iterator, List, Optional, Tuple

from hotswitch.data.indexed import IndexedDatasetBuilder, optimal_dtype
from hotswitch.data.tokenizers import TOKENIZER_TYPES, build_tokenizer

__all__ = ["build_parser", "main", "preprocess"]

_tokenizer = None  # per worker process


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hotswitch.preprocess_data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="JSONL file, one document per line")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys whose text to tokenize (default: text)")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX_KEY_document.bin/.idx")
    p.add_argument("--tokenizer-type", default="ByteTokenizer", choices=TOKENIZER_TYPES)
    p.add_argument("--tokenizer-model", default=None,
                   help="SentencePiece model file, or a Hugging Face tokenizer directory (HuggingFaceTokenizer)")
    p.add_argument("--vocab-file", default=None, help="GPT2BPETokenizer's vocab.json")
    p.add_argument("--merge-file", default=None, help="GPT2BPETokenizer's merges.txt")
    p.add_argument("--append-eod", action="store_true", help="append the end-of-document token to each document")
    p.add_argument("--workers", type=int, default=1, help="tokenizing processes")
    p.add_argument("--log-interval", type=int, default=10000, help="documents between progress lines")
    return p


def _init_worker(tokenizer_type: str, tokenizer_model: Optional[str], vocab_file=None, merge_file=None) -> None:
    global _tokenizer
    _tokenizer = build_tokenizer(tokenizer_type, tokenizer_model, vocab_file, merge_file)


def _encode(job: Tuple[int, str, List[str], bool, str]):
    """``(line number, line, keys, append_eod, path)`` -> per key ``(token ids, sequence
    lengths)``, or ``(None, message)`` for a bad line."""
    number, line, keys, append_eod, path = job
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        return None, f"{path}:{number}: not valid JSON ({e})"
    if not isinstance(record, dict):
        return None, f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
    out = {}
    for key in keys:
        if key not in record:
            return None, f"{path}:{number}: no key {key!r} (keys: {sorted(record)[:10]})"
        text = record[key]
        sentences = text if isinstance(text, list) else [text]
        if not all(isinstance(s, str) for s in sentences):
            return None, f"{path}:{number}: {key!r} must be a string or a list of strings"
        ids: List[int] = []
        lengths: List[int] = []
        for sentence in sentences:
            piece = _tokenizer.tokenize(sentence)
            if piece:
                ids.extend(piece)
                lengths.append(len(piece))
        if ids and append_eod:
            ids.append(_tokenizer.eod)
            lengths[-1] += 1
        out[key] = (ids, lengths)
    return out, len(line)


def _lines(path: str) -> Iterator[Tuple[int, str]]:
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                yield number, line


def preprocess(input_path: str, output_prefix: str, json_keys: List[str], tokenizer_type: str = "ByteTokenizer",
               tokenizer_model: Optional[str] = None, append_eod: bool = False, workers: int = 1,
               log_interval: int = 10000, log=None, vocab_file: Optional[str] = None,
               merge_file: Optional[str] = None) -> dict:
    """Writes ``{output_prefix}_{key}_document.bin/.idx`` per key; returns ``{"documents",
    "tokens": {key: n}, "seconds", "files": [...]}``. ValueError naming the file and line for
    bad input, after removing the partial output (the ``.idx`` is written last, so no
    half-written dataset is ever complete on disk)."""
    tokenizer = build_tokenizer(tokenizer_type, tokenizer_model, vocab_file, merge_file)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"--workers must be a positive int, got {workers!r}")
    if not json_keys or len(set(json_keys)) != len(json_keys):
        raise ValueError(f"--json-keys must name distinct keys, got {json_keys!r}")
    try:
        with open(input_path, encoding="utf-8"):
            pass
    except OSError as e:
        raise ValueError(f"cannot read --input {input_path!r}: {e.strerror}") from None
    dtype = optimal_dtype(tokenizer.vocab_size)
    prefixes = {k: f"{output_prefix}_{k}_document" for k in json_keys}
    builders = {k: IndexedDatasetBuilder(p, dtype) for k, p in prefixes.items()}
    jobs = ((n, line, json_keys, append_eod, input_path) for n, line in _lines(input_path))
    pool = None
    if workers > 1:
        pool = multiprocessing.Pool(workers, initializer=_init_worker, initargs=(tokenizer_type, tokenizer_model, vocab_file, merge_file))
        results = pool.imap(_encode, jobs, 32)
    else:
        _init_worker(tokenizer_type, tokenizer_model, vocab_file, merge_file)
        results = map(_encode, jobs)
    start = time.monotonic()
    documents, total_bytes = 0, 0
    tokens = {k: 0 for k in json_keys}
    try:
        for out, info in results:
            if out is None:
                raise ValueError(info)
            for key in json_keys:
                ids, lengths = out[key]
                builders[key].add_document(ids, lengths)
                tokens[key] += len(ids)
            documents += 1
            total_bytes += info
            if log is not None and documents % log_interval == 0:
                elapsed = time.monotonic() - start
                log(f"processed {documents} documents ({documents / elapsed:.0f} docs/s, "
                    f"{total_bytes / elapsed / 2**20:.2f} MB/s)")
    except UnicodeDecodeError as e:
        for builder in builders.values():
            builder.abort()
        raise ValueError(f"{input_path}: not UTF-8 text ({e})") from None
    except BaseException:
        for builder in builders.values():
            builder.abort()
        raise
    finally:
        if pool is not None:
            pool.terminate()
            pool.join()
    for builder in builders.values():
        builder.finalize()
    files = [p + ext for p in prefixes.values() for ext in (".bin", ".idx")]
    return {"documents": documents, "tokens": tokens, "seconds": time.monotonic() - start, "files": files,
            "dtype": str(dtype.__name__)}


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.log_interval < 1:
        parser.error(f"--log-interval must be >= 1, got {args.log_interval}")
    try:
        info = preprocess(args.input, args.output_prefix, args.json_keys, args.tokenizer_type, args.tokenizer_model,
                          args.append_eod, args.workers, args.log_interval,
                          log=lambda msg: print(msg, file=sys.stderr, flush=True), vocab_file=args.vocab_file,
                          merge_file=args.merge_file)
    except ValueError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"cannot write under --output-prefix {args.output_prefix!r}: {e.strerror} ({e.filename})")
    rate = info["documents"] / info["seconds"] if info["seconds"] else 0.0
    print(f"{info['documents']} documents ({', '.join(f'{k}: {n} tokens' for k, n in info['tokens'].items())}, "
          f"{info['dtype']}) in {info['seconds']:.2f} s ({rate:,.0f} docs/s); wrote {', '.join(info['files'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
