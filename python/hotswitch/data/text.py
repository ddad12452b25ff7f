"""Text corpora: a directory of text files as documents, and files of sequence lengths.

A *document* is one text file, or one top-level block of it (``unit="block"``: the file cut at
blank lines followed by an unindented line — a top-level definition in code, a paragraph in
prose); its tokens are the tokenizer's ``encode`` of its text (for the default byte tokenizer:
BOS, the UTF-8 bytes, EOS). The default corpus is the Python standard library's source tree
(found through ``sysconfig``): real code, present wherever Python is, with the long-tailed
lengths of real corpora (most files short, a few very long).
"""

import os
import re
import sysconfig
from typing import Iterator, List, Optional, Tuple

from hotswitch.data.documents import Documents
from hotswitch.data.tokenizers import ByteTokenizer

__all__ = ["Corpus", "DOCUMENT_UNITS", "default_corpus_dir", "load_lengths", "text_files"]

DOCUMENT_UNITS = ("file", "block")
_BLOCK_BREAK = re.compile(rb"\n[ \t]*\n(?=\S)")


def default_corpus_dir() -> str:
    """The Python standard library's source directory, e.g. ``/usr/lib/python3.11``."""
    return sysconfig.get_paths()["stdlib"]


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


def text_files(root: str, max_files: Optional[int] = None) -> Iterator[Tuple[str, bytes]]:
    """``(path, contents)`` of the UTF-8 text files under ``root``, recursively in sorted path
    order: links, unreadable, empty and binary files (NUL bytes, bad UTF-8) are skipped; at
    most ``max_files`` files."""
    count = 0
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
            yield path, data
            count += 1
            if max_files is not None and count >= max_files:
                return


class Corpus(Documents):
    """The text files under ``root`` (recursively, in sorted path order), as documents: one
    per file (``unit="file"``) or one per top-level block (``unit="block"``).

    Files that are not UTF-8 text (NUL bytes, bad encoding) and empty files are skipped;
    ``max_files`` reads only the first so many files. Only the lengths are kept in memory:
    ``tokens(i)`` reads and tokenizes document ``i`` when asked. ``tokenizer``: any tokenizer
    of ``hotswitch.data.tokenizers`` (default: ``ByteTokenizer``).
    """

    def __init__(self, root: Optional[str] = None, tokenizer=None,
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
        if tokenizer is not None and not callable(getattr(tokenizer, "encode", None)):
            raise ValueError(f"tokenizer must have an encode(text) method, got {type(tokenizer).__name__}")
        self.root = root
        self.name = f"corpus {root!r}"
        self.unit = unit
        self.tokenizer = tokenizer or ByteTokenizer()
        self.paths: List[str] = []
        self.spans: List[tuple] = []  # (path index, first byte, end byte) per document
        self.lengths: List[int] = []
        for path, data in text_files(root, max_files):
            spans = [(0, len(data))] if unit == "file" else _blocks(data)
            for a, b in spans:
                self.spans.append((len(self.paths), a, b))
                self.lengths.append(len(self.tokenizer.encode(data[a:b].decode("utf-8"))))
            self.paths.append(path)
        if not self.paths:
            raise ValueError(f"corpus directory {root!r} holds no UTF-8 text files")

    def __len__(self) -> int:
        return len(self.spans)

    def tokens(self, index: int) -> List[int]:
        """Token ids of document ``index`` (the tokenizer's ``encode``: BOS + bytes + EOS)."""
        path, a, b = self.spans[self._check_index(index)]
        with open(self.paths[path], "rb") as f:
            data = f.read()
        # A block's bytes may end inside a multi-byte character only if the file changed.
        return self.tokenizer.encode(data[a:b].decode("utf-8", errors="replace"))


def load_lengths(path: str) -> List[int]:
    """Document lengths: of a lengths file (one positive integer per line), or of an indexed
    dataset (``PREFIX`` of ``PREFIX.bin``/``PREFIX.idx``, or either file's path) as
    Megatron-LM's ``preprocess_data`` writes it. ValueError naming the file and line otherwise."""
    from hotswitch.data.indexed import IndexedDataset, idx_path

    prefix = path[:-4] if path.endswith((".idx", ".bin")) else path
    if os.path.isfile(idx_path(prefix)):
        lengths = [int(n) for n in IndexedDataset(prefix).lengths if n > 0]
        if not lengths:
            raise ValueError(f"indexed dataset {prefix!r} holds no documents")
        return lengths
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
