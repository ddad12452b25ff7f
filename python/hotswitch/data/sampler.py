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
    ``global_batch_tokens`` is set, exactly that many tokens: whole documents while they fit,
    then the first part of the next one, whose rest opens the next batch (as Megatron-LM's
    samples of ``seq_length`` tokens run across documents, so a step holds Megatron-LM's
    ``global_batch_size * seq_length`` tokens). With long-tailed lengths, a fixed token count
    keeps the work per step steady where a fixed sequence count would not. Documents longer
    than ``max_length`` are truncated or split (``long_sequences``) and counted in
    ``cut_documents``; with a fixed sequence count, pieces of a split document beyond the
    batch's last slot are dropped. The rest of a document carried into the next batch starts
    a sequence of its own (positions from 0).

    ``state_dict()`` / ``load_state_dict()`` save and restore the position in the data, a
    document carried over included.
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
        # Token batches: the pieces of the last document drawn not yet in a batch, and
        # [source, document, tokens of it already placed] to restore them from.
        self._pending: List[List[int]] = []
        self._carry: Optional[List[int]] = None

    def _choose(self) -> int:
        if len(self._streams) == 1:
            return 0
        counts = np.asarray([s.drawn for s in self._streams], dtype=np.float64)
        errors = self._weights * max(float(counts.sum()), 1.0) - counts
        return int(np.argmax(errors))

    def _take(self) -> Tuple[Documents, int]:
        stream = self._streams[self._choose()]
        return stream.documents, stream.take()

    def next_batch(self) -> List[List[int]]:
        """The next global batch: a list of token sequences (lists of ids), each of length
        1..max_length."""
        if self.global_batch_tokens is not None:
            return self._token_batch()
        batch: List[List[int]] = []
        while len(batch) < self.global_batch_size:
            source, doc = self._take()
            ids = source.tokens(doc)
            self.documents_drawn += 1
            self.cut_documents += len(ids) > self.max_length
            batch.extend(fit_length(ids, self.max_length, self.long_sequences)[:self.global_batch_size - len(batch)])
        return batch

    def _token_batch(self) -> List[List[int]]:
        batch: List[List[int]] = []
        room = self.global_batch_tokens
        while room > 0:
            if not self._pending:
                k = self._choose()
                doc = self._streams[k].take()
                ids = self._streams[k].documents.tokens(doc)
                self.documents_drawn += 1
                self.cut_documents += len(ids) > self.max_length
                self._pending = fit_length(ids, self.max_length, self.long_sequences)
                self._carry = [k, doc, 0]
            piece = self._pending[0]
            part = piece[:room]
            batch.append(part)
            room -= len(part)
            self._carry[2] += len(part)
            if len(part) == len(piece):
                self._pending.pop(0)
            else:
                self._pending[0] = piece[len(part):]
        if not self._pending:
            self._carry = None
        return batch

    def __iter__(self) -> Iterator[List[List[int]]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> Dict[str, object]:
        """The position in the data: ``{"seed", "epoch", "position"}`` for one source,
        ``{"seed", "streams": [[epoch, position] per source]}`` for a blend."""
        if len(self._streams) == 1:
            s = self._streams[0]
            state = {"seed": self.seed, "epoch": s.epoch, "position": s.position}
        else:
            state = {"seed": self.seed, "streams": [[s.epoch, s.position] for s in self._streams]}
        if self._carry is not None:
            state["carry"] = list(self._carry)  # [source, document, tokens already placed]
        return state

    def load_state_dict(self, state: Dict[str, object]) -> None:
        """Restores a position saved by ``state_dict``; ValueError, with nothing changed, for a
        bad or foreign state."""
        single = len(self._streams) == 1
        keys = {"seed", "epoch", "position"} if single else {"seed", "streams"}
        if not isinstance(state, dict) or set(state) - {"carry"} != keys:
            raise ValueError(f"sampler state must be a dict with {', '.join(sorted(keys))} (and carry), "
                             f"got {state!r}")
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
        pending = self._carried(state.get("carry"))
        for (epoch, position), stream in zip(positions, self._streams):
            stream.restore(epoch, position)
        self._pending, self._carry = pending, (list(state["carry"]) if pending else None)

    def _carried(self, carry) -> List[List[int]]:
        """The pieces still to place of a carried-over document ``[source, document, tokens
        already placed]`` (none for ``None``); ValueError for one that names no such rest."""
        if carry is None:
            return []
        if not (isinstance(carry, (list, tuple)) and len(carry) == 3
                and all(isinstance(v, int) and not isinstance(v, bool) for v in carry)
                and 0 <= carry[0] < len(self._streams) and carry[2] > 0
                and 0 <= carry[1] < len(self._streams[carry[0]].lengths)):
            raise ValueError(f"sampler state carry must be [source, document, tokens placed] of a document "
                             f"of this sampler's sources, got {carry!r}")
        k, doc, skip = carry
        pending = []
        for piece in fit_length(self._streams[k].documents.tokens(doc), self.max_length, self.long_sequences):
            if skip >= len(piece):
                skip -= len(piece)
                continue
            pending.append(piece[skip:])
            skip = 0
        if not pending:
            raise ValueError(f"sampler state carry {carry!r}: the document has no tokens left to place")
        return pending
