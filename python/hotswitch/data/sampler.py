"""The length-aware sampler: the same global batches of whole documents on every rank, from a
text corpus, an indexed dataset, a split of either, or a weighted blend of them."""

import random
from typing import Dict, Iterator, List, Optional, Tuple

import numpy as np

from hotswitch.data.blend import Blend
from hotswitch.data.documents import Documents

__all__ = ["LONG_SEQUENCE_POLICIES", "LengthAwareSampler", "fit_length"]

LONG_SEQUENCE_POLICIES = ("truncate", "split")


def fit_length(tokens: List[int], max_length: int, policy: str = "truncate") -> List[List[int]]:
    """A document cut to sequences of at most ``max_length`` tokens: its first ``max_length``
    tokens (``"truncate"``) or consecutive pieces of ``max_length`` (``"split"``)."""
    if policy not in LONG_SEQUENCE_POLICIES:
        raise ValueError(f"long-sequence policy {policy!r} is not one of {', '.join(LONG_SEQUENCE_POLICIES)}")
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1:
        raise ValueError(f"max_length must be a positive int, got {max_length!r}")
    if len(tokens) <= max_length or policy == "truncate":
        return [tokens[:max_length]]
    return [tokens[i:i + max_length] for i in range(0, len(tokens), max_length)]


class _Stream:
    """One source's documents in an order shuffled per epoch by ``(seed, source, epoch)``;
    empty documents are never drawn."""

    def __init__(self, documents: Documents, seed: int, number: int):
        self.documents = documents
        self.lengths = np.asarray(documents.lengths)
        self.usable = np.flatnonzero(self.lengths > 0)
        if not len(self.usable):
            raise ValueError(f"{documents.name} holds no non-empty document")
        self.seed, self.number = seed, number
        self.epoch, self.position = 0, 0
        self.order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> np.ndarray:
        key = f"{self.seed}:{epoch}" if self.number == 0 else f"{self.seed}:{self.number}:{epoch}"
        rng = np.random.Generator(np.random.PCG64(random.Random(key).getrandbits(128)))
        return self.usable[rng.permutation(len(self.usable))]

    @property
    def drawn(self) -> int:
        return self.epoch * len(self.usable) + self.position

    def peek(self) -> int:
        if self.position >= len(self.order):
            return int(self._shuffle(self.epoch + 1)[0])
        return int(self.order[self.position])

    def take(self) -> int:
        if self.position >= len(self.order):
            self.epoch, self.position = self.epoch + 1, 0
            self.order = self._shuffle(self.epoch)
        doc = int(self.order[self.position])
        self.position += 1
        return doc

    def restore(self, epoch: int, position: int) -> None:
        self.epoch, self.position = epoch, position
        self.order = self._shuffle(epoch)


class LengthAwareSampler:
    """Draws global batches of whole documents, the same on every rank.

    ``documents``: a ``hotswitch.data`` ``Documents`` (a text ``Corpus``, an
    ``IndexedDataset``, a ``Subset`` split) or a ``Blend`` of them. Each epoch of a source
    visits each of its non-empty documents once, in an order shuffled by ``(seed, epoch)``; a
    blend picks the source of each draw as Megatron-LM's blended dataset does (the one
    furthest behind its weight's share).

    A global batch takes documents until it holds ``global_batch_size`` sequences or, when
    ``global_batch_tokens`` is set, until adding the next document would exceed that many
    tokens (at least one document per batch): with long-tailed lengths, a fixed token count
    keeps the work per step steady where a fixed sequence count would not. Documents longer
    than ``max_length`` are truncated or split (``long_sequences``) and counted in
    ``cut_documents``; with a fixed sequence count, pieces of a split document beyond the
    batch's last slot are dropped.

    ``state_dict()`` / ``load_state_dict()`` save and restore the position in the data.
    """

    def __init__(self, documents, max_length: int, global_batch_size: Optional[int] = None,
                 global_batch_tokens: Optional[int] = None, seed: int = 0, long_sequences: str = "truncate"):
        if isinstance(documents, Documents):
            sources, weights = [documents], [1.0]
        elif isinstance(documents, Blend):
            sources, weights = documents.sources, documents.weights
        else:
            raise ValueError(f"documents must be hotswitch.data Documents (e.g. a Corpus) or a Blend, got "
                             f"{type(documents).__name__}")
        for name, value in (("global_batch_size", global_batch_size), ("global_batch_tokens", global_batch_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if (global_batch_size is None) == (global_batch_tokens is None):
            raise ValueError("give exactly one of global_batch_size and global_batch_tokens, got "
                             f"{global_batch_size!r} and {global_batch_tokens!r}")
        fit_length([], max_length, long_sequences)  # validates both
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.documents = documents
        self.max_length = max_length
        self.global_batch_size = global_batch_size
        self.global_batch_tokens = global_batch_tokens
        self.seed = seed
        self.long_sequences = long_sequences
        self._streams = [_Stream(d, seed, k) for k, d in enumerate(sources)]
        self._weights = np.asarray(weights, dtype=np.float64)
        self.documents_drawn = 0  # by this sampler object (not restored by load_state_dict)
        self.cut_documents = 0    # of those, longer than max_length

    def _choose(self) -> int:
        if len(self._streams) == 1:
            return 0
        counts = np.asarray([s.drawn for s in self._streams], dtype=np.float64)
        errors = self._weights * max(float(counts.sum()), 1.0) - counts
        return int(np.argmax(errors))

    def _peek_length(self) -> int:
        stream = self._streams[self._choose()]
        length = int(stream.lengths[stream.peek()])
        return length if self.long_sequences == "split" else min(length, self.max_length)

    def _take(self) -> Tuple[Documents, int]:
        stream = self._streams[self._choose()]
        return stream.documents, stream.take()

    def next_batch(self) -> List[List[int]]:
        """The next global batch: a list of token sequences (lists of ids), each of length
        1..max_length."""
        batch: List[List[int]] = []
        tokens = 0
        while True:
            if self.global_batch_size is not None:
                if len(batch) >= self.global_batch_size:
                    break
            elif batch and tokens + self._peek_length() > self.global_batch_tokens:
                break
            source, doc = self._take()
            ids = source.tokens(doc)
            self.documents_drawn += 1
            self.cut_documents += len(ids) > self.max_length
            pieces = fit_length(ids, self.max_length, self.long_sequences)
            if self.global_batch_size is not None:
                pieces = pieces[:self.global_batch_size - len(batch)]
            batch.extend(pieces)
            tokens += sum(len(p) for p in pieces)
        return batch

    def __iter__(self) -> Iterator[List[List[int]]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> Dict[str, object]:
        """The position in the data: ``{"seed", "epoch", "position"}`` for one source,
        ``{"seed", "streams": [[epoch, position] per source]}`` for a blend."""
        if len(self._streams) == 1:
            s = self._streams[0]
            return {"seed": self.seed, "epoch": s.epoch, "position": s.position}
        return {"seed": self.seed, "streams": [[s.epoch, s.position] for s in self._streams]}

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Restores a position saved by ``state_dict``; ValueError, with nothing changed, for a
        bad or foreign state."""
        single = len(self._streams) == 1
        keys = {"seed", "epoch", "position"} if single else {"seed", "streams"}
        if not isinstance(state, dict) or set(state) != keys:
            raise ValueError(f"sampler state must be a dict with {', '.join(sorted(keys))}, got {state!r}")
        if state["seed"] != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']!r}, this sampler has {self.seed}")
        positions = [[state["epoch"], state["position"]]] if single else state["streams"]
        if not isinstance(positions, list) or len(positions) != len(self._streams):
            raise ValueError(f"sampler state has positions for {positions!r}, this sampler blends "
                             f"{len(self._streams)} sources")
        for k, (entry, stream) in enumerate(zip(positions, self._streams)):
            if not (isinstance(entry, (list, tuple)) and len(entry) == 2):
                raise ValueError(f"sampler state of source {k} must be [epoch, position], got {entry!r}")
            epoch, position = entry
            if not (all(isinstance(v, int) and not isinstance(v, bool) for v in entry)
                    and epoch >= 0 and 0 <= position <= len(stream.usable)):
                raise ValueError(f"sampler state epoch {epoch!r} / position {position!r} of source {k} outside "
                                 f"[0, inf) / [0, {len(stream.usable)}]")
        for (epoch, position), stream in zip(positions, self._streams):
            stream.restore(epoch, position)
