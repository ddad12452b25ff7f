"""What a sampler draws from: a numbered collection of documents with known lengths.

A text corpus (``hotswitch.data.text.Corpus``) and a Megatron-LM indexed dataset
(``hotswitch.data.indexed.IndexedDataset``) are both ``Documents``; ``Subset`` is a
contiguous range of one (a train, validation or test split).
"""

from typing import List, Sequence

import numpy as np

__all__ = ["Documents", "Subset"]


class Documents:
    """A collection of documents, numbered from 0.

    Subclasses give ``name`` (for messages), ``lengths`` (tokens per document, a sequence of
    ints that ``np.asarray`` takes without copying the corpus) and ``tokens(index)`` (the
    token ids of one document as a list of ints, read when asked).
    """

    name: str = "documents"
    lengths: Sequence[int] = ()

    def __len__(self) -> int:
        return len(self.lengths)

    def tokens(self, index: int) -> List[int]:
        raise NotImplementedError

    def _check_index(self, index) -> int:
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or not 0 <= index < len(self):
            raise ValueError(f"document index {index!r} outside [0, {len(self)}) of {self.name}")
        return int(index)


class Subset(Documents):
    """Documents ``[begin, end)`` of ``parent``, renumbered from 0 (a split)."""

    def __init__(self, parent: Documents, begin: int, end: int, name: str = ""):
        if not isinstance(parent, Documents):
            raise ValueError(f"parent must be hotswitch.data Documents, got {type(parent).__name__}")
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end <= len(parent)):
            raise ValueError(f"subset [{begin!r}, {end!r}) is not a range inside [0, {len(parent)}] of {parent.name}")
        self.parent = parent
        self.begin, self.end = begin, end
        self.name = name or f"{parent.name}[{begin}:{end}]"
        self.lengths = np.asarray(parent.lengths)[begin:end]

    def tokens(self, index: int) -> List[int]:
        return self.parent.tokens(self.begin + self._check_index(index))
