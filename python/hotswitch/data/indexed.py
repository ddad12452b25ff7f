"""Megatron-LM's memory-mapped indexed datasets: the ``PREFIX.bin``/``PREFIX.idx`` pairs that
its ``tools/preprocess_data.py`` writes (``megatron/core/datasets/indexed_dataset.py``).

``PREFIX.bin`` is the token ids of every sequence, back to back, little-endian, of one dtype.
``PREFIX.idx`` is, all little-endian::

    9 bytes   b"MMIDIDX\\x00\\x00"
    u64       version, 1
    u8        dtype code: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32, 8 uint16
    u64       S, the number of sequences
    u64       D, the number of document-index entries (documents + 1)
    i32[S]    sequence lengths, in tokens
    i64[S]    sequence pointers, byte offsets into PREFIX.bin
    i64[D]    document index: document d is sequences [index[d], index[d + 1]); 0 first, S last

Multimodal datasets append ``i8[S]`` sequence modes, which nothing in the header announces;
an index of exactly that size is refused by name. A document is one JSON line of the input
(sentence splitting makes it several sequences); here a document's tokens are its sequences'
tokens in order.
"""

import os
import struct
from typing import BinaryIO, List, Optional, Sequence

import numpy as np

from hotswitch.data.documents import Documents

__all__ = ["DTYPE_CODES", "IndexedDataset", "IndexedDatasetBuilder", "bin_path", "idx_path", "optimal_dtype"]

INDEX_HEADER = b"MMIDIDX\x00\x00"
INDEX_VERSION = 1
DTYPE_CODES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32,
               8: np.uint16}
_CODE_OF = {np.dtype(t): c for c, t in DTYPE_CODES.items()}
_FIXED = len(INDEX_HEADER) + 8 + 1 + 8 + 8  # header, version, dtype code, S, D: 34 bytes


def idx_path(prefix: str) -> str:
    return prefix + ".idx"


def bin_path(prefix: str) -> str:
    return prefix + ".bin"


def optimal_dtype(vocab_size: int) -> type:
    """The token dtype Megatron-LM's preprocessing picks for a vocabulary: uint16 below 65500
    ids, int32 otherwise."""
    return np.uint16 if vocab_size < 65500 else np.int32


class IndexedDataset(Documents):
    """A Megatron-LM indexed dataset, read by memory map: opening it reads the 34-byte header
    and maps both files; no token is copied until ``tokens(i)`` or ``sequence(i)`` asks.

    ``lengths`` are the documents' lengths in tokens (int64, one entry per document, computed
    from the index). Raises ``ValueError`` naming the file and what is wrong when a file is
    missing, the index is truncated, of another version or dtype code, inconsistent, carries
    a multimodal trailer, or points beyond the end of ``PREFIX.bin``.
    """

    def __init__(self, prefix: str):
        if not isinstance(prefix, (str, os.PathLike)):
            raise ValueError(f"indexed dataset prefix must be a path, got {type(prefix).__name__}")
        prefix = os.fspath(prefix)
        self.prefix = prefix
        self.name = f"indexed dataset {prefix!r}"
        self.idx_path, self.bin_path = idx_path(prefix), bin_path(prefix)
        for path in (self.idx_path, self.bin_path):
            if not os.path.isfile(path):
                raise ValueError(f"{path}: no such file (indexed dataset prefix {prefix!r} needs "
                                 f"{os.path.basename(self.idx_path)} and {os.path.basename(self.bin_path)})")
        idx_size = os.path.getsize(self.idx_path)
        with open(self.idx_path, "rb") as f:
            head = f.read(_FIXED)
        # A prefix of the magic bytes is a truncated index, anything else is another file.
        if head[:len(INDEX_HEADER)] != INDEX_HEADER[:len(head)]:
            raise ValueError(f"{self.idx_path}: not a Megatron-LM indexed dataset index (starts with "
                             f"{head[:len(INDEX_HEADER)]!r}, expected {INDEX_HEADER!r})")
        if len(head) < _FIXED:
            raise ValueError(f"{self.idx_path}: truncated: {idx_size} bytes, the header alone needs {_FIXED}")
        version, code, seqs, docs = struct.unpack("<QBQQ", head[len(INDEX_HEADER):])
        if version != INDEX_VERSION:
            raise ValueError(f"{self.idx_path}: index version {version}, only version {INDEX_VERSION} is supported")
        if code not in DTYPE_CODES:
            raise ValueError(f"{self.idx_path}: dtype code {code} is not one of {sorted(DTYPE_CODES)}")
        self.dtype = np.dtype(DTYPE_CODES[code])
        if self.dtype.kind == "f":
            raise ValueError(f"{self.idx_path}: dtype code {code} ({self.dtype}) holds no token ids; "
                             "token datasets are integer")
        expected = _FIXED + 12 * seqs + 8 * docs
        if idx_size < expected:
            raise ValueError(f"{self.idx_path}: truncated: {idx_size} bytes, its header ({seqs} sequences, "
                             f"{docs} document-index entries) needs {expected}")
        if idx_size == expected + seqs and seqs > 0:
            raise ValueError(f"{self.idx_path}: carries a sequence-mode trailer of {seqs} bytes (a multimodal "
                             "dataset); only text datasets are supported")
        if idx_size != expected:
            raise ValueError(f"{self.idx_path}: {idx_size - expected} bytes beyond the {expected} that its header "
                             f"({seqs} sequences, {docs} document-index entries) describes")
        self._idx = np.memmap(self.idx_path, dtype=np.uint8, mode="r")
        offset = _FIXED
        self.sequence_lengths = np.frombuffer(self._idx, dtype="<i4", count=seqs, offset=offset)
        offset += 4 * seqs
        self.sequence_pointers = np.frombuffer(self._idx, dtype="<i8", count=seqs, offset=offset)
        offset += 8 * seqs
        self.document_index = np.frombuffer(self._idx, dtype="<i8", count=docs, offset=offset)
        self._validate_index(seqs, docs)
        self.bin_size = os.path.getsize(self.bin_path)
        itemsize = self.dtype.itemsize
        if seqs:
            ends = self.sequence_pointers + self.sequence_lengths.astype(np.int64) * itemsize
            if int(ends.max()) > self.bin_size:
                first = int(np.flatnonzero(ends > self.bin_size)[0])
                raise ValueError(f"{self.bin_path}: {self.bin_size} bytes, shorter than its index says: it needs "
                                 f"{int(ends.max())}, and sequence {first} already ends at byte {int(ends[first])} "
                                 f"({self.idx_path})")
        # An empty file cannot be mapped; nothing points into it then.
        self._bin = np.memmap(self.bin_path, dtype=np.uint8, mode="r") if self.bin_size else np.zeros(0, np.uint8)
        cumulative = np.zeros(seqs + 1, dtype=np.int64)
        np.cumsum(self.sequence_lengths, out=cumulative[1:])
        self.lengths = cumulative[self.document_index[1:]] - cumulative[self.document_index[:-1]]

    def _validate_index(self, seqs: int, docs: int) -> None:
        where = self.idx_path
        if docs < 1:
            raise ValueError(f"{where}: the document index is empty; it must start with 0 and end with the "
                             f"sequence count {seqs}")
        index = self.document_index
        if int(index[0]) != 0 or int(index[-1]) != seqs:
            raise ValueError(f"{where}: the document index runs from {int(index[0])} to {int(index[-1])}, "
                             f"expected 0 to the sequence count {seqs}")
        if docs > 1:
            steps = np.diff(index)
            if int(steps.min()) < 0:
                bad = int(np.argmin(steps))
                raise ValueError(f"{where}: the document index decreases at entry {bad + 1} "
                                 f"({int(index[bad])} -> {int(index[bad + 1])})")
        if seqs:
            if int(self.sequence_lengths.min()) < 0:
                bad = int(np.argmin(self.sequence_lengths))
                raise ValueError(f"{where}: sequence {bad} has length {int(self.sequence_lengths[bad])}")
            if int(self.sequence_pointers.min()) < 0:
                bad = int(np.argmin(self.sequence_pointers))
                raise ValueError(f"{where}: sequence {bad} points to byte {int(self.sequence_pointers[bad])}")

    @property
    def num_sequences(self) -> int:
        return len(self.sequence_lengths)

    def sequence(self, index: int) -> np.ndarray:
        """The tokens of sequence ``index``: a read-only view of the mapped ``.bin`` (no copy)."""
        if isinstance(index, bool) or not isinstance(index, (int, np.integer)) or \
                not 0 <= index < self.num_sequences:
            raise ValueError(f"sequence index {index!r} outside [0, {self.num_sequences}) of {self.name}")
        return np.frombuffer(self._bin, dtype=self.dtype.newbyteorder("<"), count=int(self.sequence_lengths[index]),
                             offset=int(self.sequence_pointers[index]))

    def tokens(self, index: int) -> List[int]:
        """Token ids of document ``index``: its sequences' tokens in order."""
        index = self._check_index(index)
        a, b = int(self.document_index[index]), int(self.document_index[index + 1])
        if b - a == 1:
            return self.sequence(a).tolist()
        return [t for s in range(a, b) for t in self.sequence(s).tolist()]


class IndexedDatasetBuilder:
    """Writes ``PREFIX.bin`` as documents arrive and ``PREFIX.idx`` at ``finalize``, exactly as
    Megatron-LM's ``IndexedDatasetBuilder`` (document index starting with 0, pointers in
    bytes, no sequence modes). Token ids must fit ``dtype``.
    """

    def __init__(self, prefix: str, dtype=np.int32):
        dtype = np.dtype(dtype)
        if dtype not in _CODE_OF or dtype.kind == "f":
            raise ValueError(f"token dtype {dtype} is not one of "
                             f"{', '.join(str(np.dtype(t)) for t in DTYPE_CODES.values() if np.dtype(t).kind != 'f')}")
        self.prefix = os.fspath(prefix)
        self.dtype = dtype
        self.sequence_lengths: List[int] = []
        self.document_index: List[int] = [0]
        self._info = np.iinfo(dtype)
        # A .bin being rewritten never sits beside the .idx of an earlier one.
        if os.path.exists(idx_path(self.prefix)):
            os.remove(idx_path(self.prefix))
        self._file: Optional[BinaryIO] = open(bin_path(self.prefix), "wb")

    def add_document(self, tokens: Sequence[int], lengths: Optional[Sequence[int]] = None) -> None:
        """Appends one document: ``tokens``, cut into sequences of ``lengths`` (default: one
        sequence, none for an empty document)."""
        if self._file is None:
            raise ValueError(f"indexed dataset {self.prefix!r} is already finalized")
        array = np.asarray(tokens)
        if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
            raise ValueError(f"a document must be a 1-D sequence of integer token ids, got shape {array.shape} "
                             f"of {array.dtype}")
        if lengths is None:
            lengths = [array.size] if array.size else []
        if any(int(n) < 0 for n in lengths) or sum(int(n) for n in lengths) != array.size:
            raise ValueError(f"sequence lengths {list(lengths)} do not add up to the document's {array.size} tokens")
        if array.size and (int(array.min()) < self._info.min or int(array.max()) > self._info.max):
            raise ValueError(f"token ids [{int(array.min())}, {int(array.max())}] do not fit {self.dtype} "
                             f"of {self.prefix}.bin")
        self._file.write(array.astype(self.dtype.newbyteorder("<"), copy=False).tobytes(order="C"))
        self.sequence_lengths.extend(int(n) for n in lengths)
        self.document_index.append(len(self.sequence_lengths))

    def abort(self) -> None:
        """Closes and removes the partial ``PREFIX.bin`` (no ``.idx`` is written)."""
        if self._file is not None:
            self._file.close()
            self._file = None
            os.remove(bin_path(self.prefix))

    def finalize(self) -> None:
        """Closes ``PREFIX.bin`` and writes ``PREFIX.idx``."""
        if self._file is None:
            raise ValueError(f"indexed dataset {self.prefix!r} is already finalized")
        self._file.close()
        self._file = None
        lengths = np.asarray(self.sequence_lengths, dtype="<i4")
        pointers = np.zeros(len(lengths), dtype="<i8")
        if len(lengths) > 1:
            np.cumsum(lengths[:-1].astype(np.int64) * self.dtype.itemsize, out=pointers[1:])
        with open(idx_path(self.prefix), "wb") as f:
            f.write(INDEX_HEADER)
            f.write(struct.pack("<Q", INDEX_VERSION))
            f.write(struct.pack("<B", _CODE_OF[self.dtype]))
            f.write(struct.pack("<Q", len(lengths)))
            f.write(struct.pack("<Q", len(self.document_index)))
            f.write(lengths.tobytes(order="C"))
            f.write(pointers.tobytes(order="C"))
            f.write(np.asarray(self.document_index, dtype="<i8").tobytes(order="C"))
