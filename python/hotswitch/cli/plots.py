"""Pictures of a training run.

    python -m hotswitch.plots metrics F.jsonl --out F.png [--title T]

``F.jsonl`` is what ``python -m hotswitch.train --metrics-file F.jsonl`` writes: one JSON
object per logged iteration. The picture shows the loss, the throughput and each layout's
share of the phases against the iteration.
"""

import argparse
import sys

from hotswitch._checks import json_lines
from hotswitch.analysis.plots import plot_metrics

__all__ = ["main", "read_metrics"]


def read_metrics(path: str) -> list:
    """The records of a metrics file; ValueError naming the file and line of a bad one."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise ValueError(f"cannot read metrics file {path!r}: {e.strerror}") from None
    out = [record for _, record in json_lines(lines, path)]
    if not out:
        raise ValueError(f"metrics file {path!r} holds no records")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotswitch.plots", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    m = sub.add_parser("metrics", help="loss, throughput and layout share of a --metrics-file")
    m.add_argument("file", help="the JSON-lines metrics file")
    m.add_argument("--out", required=True, help="PNG file to write")
    m.add_argument("--title", default=None)
    args = parser.parse_args(argv)
    if not args.out.endswith(".png"):
        parser.error(f"--out must name a .png file, got {args.out!r}")
    try:
        plot_metrics(read_metrics(args.file), args.out, title=args.title)
    except ValueError as e:
        parser.error(str(e))
    print(f"plot written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
