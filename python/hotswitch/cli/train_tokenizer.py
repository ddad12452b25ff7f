"""Trains a SentencePiece tokenizer on a directory of text files or a JSONL file:

    python -m hotswitch.train_tokenizer --input DIR_OR_JSONL --output-prefix tok \\
        --vocab-size 8000 [--json-keys text] [--model-type bpe|unigram] [--max-files N]

writes ``tok.model``, for ``--tokenizer-type SentencePieceTokenizer|Llama2Tokenizer
--tokenizer-model tok.model`` of ``hotswitch.train`` and ``hotswitch.preprocess_data`` (and of
Megatron-LM). The pieces keep text exactly (no normalization, whitespace and newlines kept,
byte fallback), so code round-trips. Without ``--input`` it trains on the Python standard
library's source.
"""

import argparse
import os
import sys
import time
from typing import Iterator, List, Optional

from hotswitch._checks import json_lines
from hotswitch.data.text import default_corpus_dir, text_files
from hotswitch.data.tokenizers import SENTENCEPIECE_MODEL_TYPES, train_sentencepiece

__all__ = ["build_parser", "main", "read_texts"]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m hotswitch.train_tokenizer", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", default=None, help="directory of text files or a .jsonl file "
                   "(default: the Python standard library's source)")
    p.add_argument("--json-keys", nargs="+", default=["text"], help="keys of a JSONL input to train on")
    p.add_argument("--output-prefix", required=True, help="writes PREFIX.model")
    p.add_argument("--vocab-size", type=int, default=8000)
    p.add_argument("--model-type", default="bpe", choices=SENTENCEPIECE_MODEL_TYPES)
    p.add_argument("--max-files", type=int, default=None, help="read at most this many files of a directory")
    p.add_argument("--max-sentences", type=int, default=0,
                   help="train on at most this many chunks of text, sampled (0: all)")
    p.add_argument("--workers", type=int, default=1, help="training threads")
    p.add_argument("--seed", type=int, default=0)
    return p


def _jsonl(path: str, keys: List[str]) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for number, record in json_lines(f, path):
            for key in keys:
                if key not in record:
                    raise ValueError(f"{path}:{number}: no key {key!r}")
                value = record[key]
                for text in value if isinstance(value, list) else [value]:
                    if not isinstance(text, str):
                        raise ValueError(f"{path}:{number}: {key!r} must be a string or a list of strings")
                    yield text


def read_texts(path: Optional[str], keys: List[str], max_files: Optional[int] = None) -> Iterator[str]:
    """The documents of a directory (text files) or a JSONL file (the keys' strings)."""
    path = default_corpus_dir() if path is None else path
    if os.path.isdir(path):
        return (data.decode("utf-8") for _, data in text_files(path, max_files))
    if os.path.isfile(path):
        return _jsonl(path, keys)
    raise ValueError(f"--input {path!r} is neither a directory nor a file")


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.max_files is not None and args.max_files < 1:
        parser.error(f"--max-files must be >= 1, got {args.max_files}")
    model_file = args.output_prefix + ".model"
    start = time.monotonic()
    try:
        info = train_sentencepiece(read_texts(args.input, args.json_keys, args.max_files), model_file,
                                   args.vocab_size, args.model_type, args.max_sentences, args.workers, args.seed)
    except ValueError as e:
        parser.error(str(e))
    except OSError as e:
        parser.error(f"{e.filename or args.input}: {e.strerror}")
    print(f"trained a {args.model_type} model of {info['vocab_size']} pieces on {info['chunks']} chunks in "
          f"{time.monotonic() - start:.1f} s; wrote {model_file}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
