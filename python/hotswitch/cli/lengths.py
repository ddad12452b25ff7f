"""Writes the token lengths of a directory of text files, one per line: the input of
``python -m hotswitch.cli.plan --lengths`` and of the planner benchmark.

    python -m hotswitch.cli.lengths [DIR] -o FILE [--max-files N] [--unit file|block]

DIR defaults to the Python standard library's source tree; documents are tokenized with
hotswitch's byte-level tokenizer (``hotswitch.data``), so a length counts BOS, bytes and EOS.
"""

import argparse
import sys

from hotswitch.data import Corpus, default_corpus_dir

__all__ = ["main"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.cli.lengths", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("directory", nargs="?", default=None,
                        help=f"directory of text files (default: {default_corpus_dir()})")
    parser.add_argument("-o", "--output", required=True, help="lengths file to write")
    parser.add_argument("--max-files", type=int, default=None, help="read at most this many files")
    parser.add_argument("--unit", default="file", help="a document is a whole file or one top-level "
                        "block of it: file or block")
    args = parser.parse_args(argv)
    try:
        corpus = Corpus(args.directory, max_files=args.max_files, unit=args.unit)
    except ValueError as e:
        parser.error(str(e))
    try:
        with open(args.output, "w") as f:
            f.write("".join(f"{n}\n" for n in corpus.lengths))
    except OSError as e:
        parser.error(f"cannot write {args.output!r}: {e.strerror}")
    lengths = sorted(corpus.lengths)
    print(f"{len(lengths)} documents from {corpus.root}: median {lengths[len(lengths) // 2]} tokens, "
          f"max {lengths[-1]}, total {sum(lengths)}; wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
