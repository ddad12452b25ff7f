"""Megatron-LM's ``--data-path`` and ``--split``: one source or a weighted blend, each cut
into train, validation and test documents.

``--data-path`` is one path, or pairs ``WEIGHT PATH ...`` (``0.3 A 0.7 B``), or several paths
without weights (weighted by their document counts). A path is an indexed-dataset prefix
(``PATH.bin``/``PATH.idx``) or a directory of text files. ``--split 969,30,1`` cuts each
source's documents into contiguous train, validation and test ranges in those proportions,
with Megatron-LM's rounding; the blend of the train ranges is the training data.
"""

import dataclasses
import math
import os
from typing import List, Optional, Sequence, Tuple

import numpy as np

from hotswitch.data.documents import Documents, Subset
from hotswitch.data.indexed import IndexedDataset, bin_path, idx_path
from hotswitch.data.text import Corpus

__all__ = ["Blend", "DataSplits", "open_documents", "open_splits", "parse_data_path", "parse_split",
           "split_ranges"]

SPLIT_NAMES = ("train", "valid", "test")


def _weight(text: str) -> Optional[float]:
    try:
        return float(text)
    except ValueError:
        return None


def parse_data_path(tokens: Sequence[str]) -> List[Tuple[Optional[float], str]]:
    """``(weight, path)`` per source of Megatron-LM's ``--data-path`` words: ``[PATH]``,
    ``[W1, PATH1, W2, PATH2, ...]``, or ``[PATH1, PATH2, ...]`` (weight None for every
    source). ValueError when a weight is not a positive finite number or words do not pair."""
    if isinstance(tokens, str):
        tokens = tokens.split()
    tokens = [t.strip() for t in tokens]
    if not tokens or any(not t for t in tokens):
        raise ValueError(f"--data-path needs a path or WEIGHT PATH pairs, got {list(tokens)!r}")
    weights = [_weight(t) for t in tokens[0::2]]
    if len(tokens) % 2 == 0 and any(w is not None for w in weights):
        out = []
        for w, (text, path) in zip(weights, zip(tokens[0::2], tokens[1::2])):
            if w is None or not math.isfinite(w) or w <= 0:
                raise ValueError(f"--data-path blend weight {text!r} (for {path!r}) must be a positive number; "
                                 f"expected WEIGHT PATH pairs, got {' '.join(tokens)!r}")
            if _weight(path) is not None:
                raise ValueError(f"--data-path expected a path after weight {text!r}, got the number {path!r}")
        for text, path in zip(tokens[0::2], tokens[1::2]):
            out.append((float(text), path))
        return out
    numbers = [t for t in tokens if _weight(t) is not None]
    if numbers:
        raise ValueError(f"--data-path {' '.join(tokens)!r} mixes weights and paths: expected one path, paths, "
                         f"or WEIGHT PATH pairs (the number {numbers[0]!r} has no path after it)")
    return [(None, t) for t in tokens]


def parse_split(text: str) -> List[float]:
    """Megatron-LM's ``--split`` (``"969,30,1"``, ``"98,2"``, ``"1"``; missing parts are 0) as
    three fractions that add up to 1. ValueError for negative, non-numeric or all-zero parts."""
    if not isinstance(text, str):
        raise ValueError(f"--split must be a string like '969,30,1', got {type(text).__name__}")
    parts = [p.strip() for p in text.replace("/", ",").split(",")]
    if not 1 <= len(parts) <= 3:
        raise ValueError(f"--split {text!r} must have 1 to 3 comma-separated parts (train, valid, test)")
    values = []
    for p in parts:
        v = _weight(p)
        if v is None or not math.isfinite(v) or v < 0:
            raise ValueError(f"--split {text!r}: part {p!r} must be a non-negative number")
        values.append(v)
    values += [0.0] * (3 - len(values))
    total = sum(values)
    if total <= 0:
        raise ValueError(f"--split {text!r} gives every split a zero share")
    return [v / total for v in values]


def split_ranges(fractions: Sequence[float], count: int) -> List[Tuple[int, int]]:
    """``[begin, end)`` per split of ``count`` documents, rounded as Megatron-LM rounds (each
    boundary at the rounded cumulative share, the rounding error taken off every boundary)."""
    bounds = [0]
    for f in fractions:
        bounds.append(bounds[-1] + int(round(f * float(count))))
    diff = bounds[-1] - count
    bounds = [bounds[0]] + [b - diff for b in bounds[1:]]
    return [(bounds[i], bounds[i + 1]) for i in range(len(fractions))]


class Blend:
    """Documents drawn from several sources in proportion to ``weights`` (normalized), the
    sources chosen as Megatron-LM's blended dataset chooses them: each draw goes to the source
    furthest behind its share."""

    def __init__(self, sources: Sequence[Documents], weights: Sequence[float]):
        if not sources or len(sources) != len(weights):
            raise ValueError(f"a blend needs one weight per source, got {len(sources)} sources and "
                             f"{len(weights)} weights")
        for s in sources:
            if not isinstance(s, Documents):
                raise ValueError(f"blend sources must be hotswitch.data Documents, got {type(s).__name__}")
        for w in weights:
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
                raise ValueError(f"blend weight {w!r} must be a positive number")
        total = float(sum(weights))
        self.sources = list(sources)
        self.weights = [float(w) / total for w in weights]

    def __len__(self) -> int:
        return sum(len(s) for s in self.sources)

    @property
    def name(self) -> str:
        return " + ".join(f"{w:.3g} x {s.name}" for w, s in zip(self.weights, self.sources))


def open_documents(path: str, tokenizer=None, max_files: Optional[int] = None, unit: str = "file") -> Documents:
    """An indexed dataset when ``PATH.idx`` or ``PATH.bin`` exists, else the text files of the
    directory ``path`` (tokenized with ``tokenizer``). ValueError naming the path otherwise."""
    if os.path.exists(idx_path(path)) or os.path.exists(bin_path(path)):
        return IndexedDataset(path)
    if os.path.isdir(path):
        return Corpus(path, tokenizer=tokenizer, max_files=max_files, unit=unit)
    for suffix in (".bin", ".idx"):
        if path.endswith(suffix) and (os.path.exists(idx_path(path[:-4])) or os.path.exists(bin_path(path[:-4]))):
            raise ValueError(f"data path {path!r} names a file of an indexed dataset: give its prefix "
                             f"{path[:-4]!r}, as Megatron-LM's --data-path takes it")
    raise ValueError(f"data path {path!r} is neither an indexed dataset prefix (no {idx_path(path)}) nor a "
                     "directory of text files")


@dataclasses.dataclass
class DataSplits:
    """The train, validation and test data (a ``Documents`` or a ``Blend``; None when the
    split is empty), and how many documents of each are longer than ``max_length``."""

    train: Optional[object]
    valid: Optional[object]
    test: Optional[object]
    documents: List[int]      # documents per split
    cut: List[int]            # of those, longer than max_length (cut to it when drawn)
    max_length: Optional[int]

    def describe(self) -> str:
        """One line for the log, e.g. ``969 train, 30 valid, 1 test documents; 12, 0, 0 of
        them longer than 1024 tokens (cut when drawn)``."""
        out = ", ".join(f"{n} {name}" for n, name in zip(self.documents, SPLIT_NAMES)) + " documents"
        if self.max_length is not None:
            out += (f"; {', '.join(map(str, self.cut))} of them longer than {self.max_length} tokens "
                    "(cut when drawn)")
        return out


def open_splits(data_path: Sequence[str], split: str = "969,30,1", tokenizer=None, max_length: Optional[int] = None,
                max_files: Optional[int] = None, unit: str = "file") -> DataSplits:
    """Opens every source of ``data_path`` (``parse_data_path`` words), cuts each by ``split``
    and blends each split over the sources. Sources without weights are weighted by their
    document counts. ValueError naming the path or value for any bad source, weight or split."""
    sources = parse_data_path(data_path)
    fractions = parse_split(split)
    opened = [(w, open_documents(p, tokenizer, max_files, unit)) for w, p in sources]
    if all(w is None for w, _ in opened):
        opened = [(float(len(d)), d) for _, d in opened]
    splits: List[Optional[object]] = []
    documents, cut = [], []
    for k in range(3):
        parts, weights = [], []
        for w, d in opened:
            begin, end = split_ranges(fractions, len(d))[k]
            if end > begin:
                parts.append(Subset(d, begin, end, name=f"{d.name} {SPLIT_NAMES[k]}"))
                weights.append(w)
        documents.append(sum(len(p) for p in parts))
        cut.append(sum(int(np.count_nonzero(np.asarray(p.lengths) > max_length)) for p in parts)
                   if max_length is not None else 0)
        if not parts:
            splits.append(None)
        elif len(opened) == 1:
            splits.append(parts[0])
        else:
            splits.append(Blend(parts, weights))
    if splits[0] is None:
        raise ValueError(f"--split {split!r} leaves no training documents in {' '.join(map(str, data_path))!r}")
    return DataSplits(splits[0], splits[1], splits[2], documents, cut, max_length)
