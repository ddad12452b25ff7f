"""Training data: a directory of text files, a byte-level tokenizer, and a length-aware
sampler that draws the same global batches of documents on every rank.

A *document* is one text file, or one top-level block of it (``unit="block"``: the file cut at
blank lines followed by an unindented line — a top-level definition in code, a paragraph in
prose); its tokens are its UTF-8 bytes, with a BOS token in front and an EOS token at the end. The default corpus is the Python standard library's source tree
(found through ``sysconfig``): real code, present wherever Python is, with the long-tailed
lengths of real corpora (most files short, a few very long).
"""

import dataclasses
import os
import random
import re
import sysconfig
from typing import Dict, Iterator, List, Optional, Sequence

__all__ = [
    "ByteTokenizer",
    "Corpus",
    "LengthAwareSampler",
    "default_corpus_dir",
    "fit_length",
    "load_lengths",
]

LONG_SEQUENCE_POLICIES = ("truncate", "split")
DOCUMENT_UNITS = ("file", "block")
_BLOCK_BREAK = re.compile(rb"\n[ \t]*\n(?=\S)")


def default_corpus_dir() -> str:
    """The Python standard library's source directory, e.g. ``/usr/lib/python3.11``."""
    return sysconfig.get_paths()["stdlib"]


class ByteTokenizer:
    """Byte-level tokenizer: token ``b`` for byte ``b`` (0..255), then BOS (256) and EOS (257).

    ``vocab_size`` is 258; a model may use a larger, padded vocabulary (e.g. divisible by tp).
    """

    bos_id = 256
    eos_id = 257
    vocab_size = 258

    def encode(self, text: str, bos: bool = True, eos: bool = True) -> List[int]:
        """Token ids of ``text`` (UTF-8 bytes), with BOS and EOS around it when asked."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids; BOS and EOS are dropped, bad UTF-8 is replaced."""
        out = bytearray()
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i!r} is outside [0, {self.vocab_size})")
            if i < 256:
                out.append(i)
        return out.decode("utf-8", errors="replace")


def _is_text(data: bytes) -> bool:
    if b"\0" in data:
        return False
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _blocks(data: bytes) -> List[tuple]:
    """Byte ranges of the top-level blocks of a file, blank-only blocks dropped."""
    out, start = [], 0
    for m in _BLOCK_BREAK.finditer(data):
        out.append((start, m.start()))
        start = m.end()
    out.append((start, len(data)))
    return [(a, b) for a, b in out if data[a:b].strip()]


class Corpus:
    """The text files under ``root`` (recursively, in sorted path order), as documents: one
    per file (``unit="file"``) or one per top-level block (``unit="block"``).

    Files that are not UTF-8 text (NUL bytes, bad encoding) and empty files are skipped;
    ``max_files`` reads only the first so many files. Only the lengths are kept in memory:
    ``tokens(i)`` reads and tokenizes document ``i`` when asked.
    """

    def __init__(self, root: Optional[str] = None, tokenizer: Optional[ByteTokenizer] = None,
                 max_files: Optional[int] = None, unit: str = "file"):
        root = default_corpus_dir() if root is None else root
        if not isinstance(root, (str, os.PathLike)):
            raise ValueError(f"corpus directory must be a path, got {type(root).__name__}")
        root = os.fspath(root)
        if not os.path.isdir(root):
            raise ValueError(f"corpus directory {root!r} does not exist or is not a directory")
        if max_files is not None and (isinstance(max_files, bool) or not isinstance(max_files, int)
                                      or max_files < 1):
            raise ValueError(f"max_files must be a positive int or None, got {max_files!r}")
        if unit not in DOCUMENT_UNITS:
            raise ValueError(f"document unit {unit!r} is not one of {', '.join(DOCUMENT_UNITS)}")
        self.root = root
        self.unit = unit
        self.tokenizer = tokenizer or ByteTokenizer()
        self.paths: List[str] = []
        self.spans: List[tuple] = []  # (path index, first byte, end byte) per document
        self.lengths: List[int] = []
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                try:
                    with open(path, "rb") as f:
                        data = f.read()
                except OSError:
                    continue
                if not data or not _is_text(data):
                    continue
                spans = [(0, len(data))] if unit == "file" else _blocks(data)
                for a, b in spans:
                    self.spans.append((len(self.paths), a, b))
                    self.lengths.append(len(self.tokenizer.encode(data[a:b].decode("utf-8"))))
                self.paths.append(path)
                if max_files is not None and len(self.paths) >= max_files:
                    break
            if max_files is not None and len(self.paths) >= max_files:
                break
        if not self.paths:
            raise ValueError(f"corpus directory {root!r} holds no UTF-8 text files")

    def __len__(self) -> int:
        return len(self.spans)

    def tokens(self, index: int) -> List[int]:
        """Token ids of document ``index`` (BOS + bytes + EOS)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.spans):
            raise ValueError(f"document index {index!r} outside [0, {len(self.spans)})")
        path, a, b = self.spans[index]
        with open(self.paths[path], "rb") as f:
            data = f.read()
        # A block's bytes may end inside a multi-byte character only if the file changed.
        return self.tokenizer.encode(data[a:b].decode("utf-8", errors="replace"))


def load_lengths(path: str) -> List[int]:
    """Reads one positive integer per line; ValueError naming the file and line otherwise."""
    try:
        with open(path) as f:
            text = f.read().split("\n")
    except OSError as e:
        raise ValueError(f"cannot read lengths file {path!r}: {e.strerror}") from None
    out = []
    for number, line in enumerate(text, 1):
        line = line.strip()
        if not line:
            continue
        if not line.isdigit() or int(line) < 1:
            raise ValueError(f"{path}:{number}: expected a positive integer length, got {line!r}")
        out.append(int(line))
    if not out:
        raise ValueError(f"lengths file {path!r} holds no lengths")
    return out


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


@dataclasses.dataclass
class _State:
    epoch: int = 0
    position: int = 0  # documents of this epoch's order already drawn


class LengthAwareSampler:
    """Draws global batches of documents from a corpus, the same on every rank.

    Each epoch visits every document once in an order shuffled by ``(seed, epoch)``. A global
    batch takes documents in that order until it holds ``global_batch_size`` sequences or,
    when ``global_batch_tokens`` is set, until adding the next document would exceed that
    many tokens (at least one document per batch): with long-tailed lengths, a fixed token
    count keeps the work per step steady where a fixed sequence count would not. Documents
    longer than ``max_length`` are truncated or split (``long_sequences``); with a fixed
    sequence count, pieces of a split document beyond the batch's last slot are dropped.

    ``state_dict()`` / ``load_state_dict()`` save and restore the position in the data.
    """

    def __init__(self, corpus: Corpus, max_length: int, global_batch_size: Optional[int] = None,
                 global_batch_tokens: Optional[int] = None, seed: int = 0, long_sequences: str = "truncate"):
        if not isinstance(corpus, Corpus):
            raise ValueError(f"corpus must be a hotswitch.data.Corpus, got {type(corpus).__name__}")
        for name, value in (("global_batch_size", global_batch_size), ("global_batch_tokens", global_batch_tokens)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be a positive int or None, got {value!r}")
        if (global_batch_size is None) == (global_batch_tokens is None):
            raise ValueError("give exactly one of global_batch_size and global_batch_tokens, got "
                             f"{global_batch_size!r} and {global_batch_tokens!r}")
        fit_length([], max_length, long_sequences)  # validates both
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.corpus = corpus
        self.max_length = max_length
        self.global_batch_size = global_batch_size
        self.global_batch_tokens = global_batch_tokens
        self.seed = seed
        self.long_sequences = long_sequences
        self._state = _State()
        self._order = self._shuffle(0)

    def _shuffle(self, epoch: int) -> List[int]:
        order = list(range(len(self.corpus)))
        random.Random(f"{self.seed}:{epoch}").shuffle(order)
        return order

    def _next_document(self) -> int:
        if self._state.position >= len(self._order):
            self._state = _State(self._state.epoch + 1, 0)
            self._order = self._shuffle(self._state.epoch)
        doc = self._order[self._state.position]
        self._state.position += 1
        return doc

    def _peek_length(self) -> int:
        if self._state.position >= len(self._order):
            doc = self._shuffle(self._state.epoch + 1)[0]
        else:
            doc = self._order[self._state.position]
        length = self.corpus.lengths[doc]
        return length if self.long_sequences == "split" else min(length, self.max_length)

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
            pieces = fit_length(self.corpus.tokens(self._next_document()), self.max_length, self.long_sequences)
            if self.global_batch_size is not None:
                pieces = pieces[:self.global_batch_size - len(batch)]
            batch.extend(pieces)
            tokens += sum(len(p) for p in pieces)
        return batch

    def __iter__(self) -> Iterator[List[List[int]]]:
        while True:
            yield self.next_batch()

    def state_dict(self) -> Dict[str, int]:
        """The position in the data: ``{"seed", "epoch", "position"}``."""
        return {"seed": self.seed, "epoch": self._state.epoch, "position": self._state.position}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        """Restores a position saved by ``state_dict``; ValueError for a bad or foreign state."""
        if not isinstance(state, dict) or set(state) != {"seed", "epoch", "position"}:
            raise ValueError(f"sampler state must be a dict with seed, epoch and position, got {state!r}")
        if state["seed"] != self.seed:
            raise ValueError(f"sampler state has seed {state['seed']!r}, this sampler has {self.seed}")
        epoch, position = state["epoch"], state["position"]
        if not (isinstance(epoch, int) and epoch >= 0 and isinstance(position, int)
                and 0 <= position <= len(self.corpus)):
            raise ValueError(f"sampler state epoch {epoch!r} / position {position!r} outside "
                             f"[0, inf) / [0, {len(self.corpus)}]")
        self._state = _State(epoch, position)
        self._order = self._shuffle(epoch)
