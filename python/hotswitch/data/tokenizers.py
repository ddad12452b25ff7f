"""Tokenizers: the byte-level default and SentencePiece models with Megatron-LM's semantics.

Every tokenizer has the same small interface:

- ``vocab_size``: the number of token ids (before any padding of the model's vocabulary);
- ``tokenize(text)``: token ids as Megatron-LM's tokenizer of the same name gives them (what
  ``preprocess_data`` writes, before ``--append-eod``);
- ``eod``: the end-of-document id that ``--append-eod`` appends;
- ``encode(text)``: a training document, ``tokenize(text) + [eod]`` (what a directory of text
  files yields per document, and what ``preprocess_data --append-eod`` writes);
- ``detokenize(ids)``: the text of token ids.

``SentencePieceTokenizer`` and ``Llama2Tokenizer`` need the ``sentencepiece`` package;
``HuggingFaceTokenizer`` (a directory with ``tokenizer.json``, e.g. LLaMA-3's) and
``GPT2BPETokenizer`` (``vocab.json`` and ``merges.txt``) the ``tokenizers`` package.
"""

import io
import json
import os
from typing import Dict, Iterable, Iterator, List, Optional, Sequence

__all__ = [
    "ByteTokenizer",
    "GPT2BPETokenizer",
    "HuggingFaceTokenizer",
    "Llama2Tokenizer",
    "SentencePieceTokenizer",
    "TOKENIZER_TYPES",
    "build_tokenizer",
    "load_sentencepiece",
    "train_sentencepiece",
]

TOKENIZER_TYPES = ("ByteTokenizer", "SentencePieceTokenizer", "Llama2Tokenizer", "HuggingFaceTokenizer",
                   "GPT2BPETokenizer")


class ByteTokenizer:
    """Byte-level tokenizer: token ``b`` for byte ``b`` (0..255), then BOS (256) and EOS (257).

    ``vocab_size`` is 258; a model may use a larger, padded vocabulary (e.g. divisible by tp).
    ``tokenize`` gives BOS and the UTF-8 bytes (as Llama2Tokenizer gives BOS and pieces);
    ``eod`` is EOS, so a document is BOS, bytes, EOS.
    """

    bos_id = 256
    eos_id = 257
    vocab_size = 258
    eod = eos_id

    def encode(self, text: str, bos: bool = True, eos: bool = True) -> List[int]:
        """Token ids of ``text`` (UTF-8 bytes), with BOS and EOS around it when asked."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def tokenize(self, text: str) -> List[int]:
        """BOS and the UTF-8 bytes of ``text``."""
        return self.encode(text, bos=True, eos=False)

    def decode(self, ids: Sequence[int]) -> str:
        """The text of token ids; BOS and EOS are dropped, bad UTF-8 is replaced."""
        out = bytearray()
        for i in ids:
            if not isinstance(i, int) or not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i!r} is outside [0, {self.vocab_size})")
            if i < 256:
                out.append(i)
        return out.decode("utf-8", errors="replace")

    detokenize = decode


def load_sentencepiece(path: str):
    """A ``sentencepiece.SentencePieceProcessor`` of the model file ``path``; ValueError naming
    the file when it is missing or not a SentencePiece model, or when the package is absent."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"tokenizer model must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    try:
        import sentencepiece
    except ImportError:
        raise ValueError(f"tokenizer model {path!r} needs the sentencepiece package "
                         "(Debian: apt-get install python3-sentencepiece)") from None
    if not os.path.isfile(path):
        raise ValueError(f"tokenizer model {path!r} does not exist or is not a file")
    processor = sentencepiece.SentencePieceProcessor()
    try:
        processor.load(path)
    except (RuntimeError, OSError) as e:
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(f"tokenizer model {path!r} is not a SentencePiece model ({reason})") from None
    if processor.get_piece_size() < 1:
        raise ValueError(f"tokenizer model {path!r} holds no pieces")
    return processor


class SentencePieceTokenizer:
    """Megatron-LM's ``SentencePieceTokenizer``: the model's pieces, then the special tokens
    ``<CLS> <SEP> <EOD> <MASK>`` and the model's pad, BOS and EOS pieces (each appended to the
    vocabulary when the model lacks it; ``<PAD>``, ``<BOS>``, ``<EOS>`` when the model has no
    such id). ``tokenize`` adds no BOS or EOS; special tokens written in the text are their
    ids. ``eod`` is ``<EOD>``.
    """

    def __init__(self, model_file: str):
        self.model_file = os.fspath(model_file) if isinstance(model_file, (str, os.PathLike)) else model_file
        self.processor = load_sentencepiece(model_file)
        sp = self.processor
        self.vocab: Dict[str, int] = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
        self.special: Dict[str, int] = {}

        def add(token: str) -> int:
            if token not in self.vocab:
                self.vocab[token] = len(self.vocab)
            self.special[token] = self.vocab[token]
            return self.vocab[token]

        for token in ("<CLS>", "<SEP>", "<EOD>", "<MASK>"):
            add(token)
        self.eod = self.vocab["<EOD>"]
        self.pad_id = add(self._piece(sp.pad_id(), "<PAD>"))
        self.bos_id = add(self._piece(sp.bos_id(), "<BOS>"))
        self.eos_id = add(self._piece(sp.eos_id(), "<EOS>"))
        self.inverse = {i: t for t, i in self.special.items()}

    def _piece(self, index: int, default: str) -> str:
        return self.processor.id_to_piece(index) if 0 <= index < self.processor.get_piece_size() else default

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)

    def tokenize(self, text: str) -> List[int]:
        """Pieces of ``text``; each special token written in it (e.g. ``<EOD>``) is its id."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids: List[int] = []
        start = 0
        while True:
            found = [(text.find(t, start), t) for t in self.special]
            found = [(i, t) for i, t in found if i >= 0]
            if not found:
                break
            # The earliest match; among equal positions, the first registered (dict order).
            index, token = min(found, key=lambda f: f[0])
            ids.extend(self.processor.encode(text[start:index]))
            ids.append(self.special[token])
            start = index + len(token)
        ids.extend(self.processor.encode(text[start:]))
        return ids

    def encode(self, text: str) -> List[int]:
        """A training document: the pieces and ``<EOD>``."""
        return self.tokenize(text) + [self.eod]

    def detokenize(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; special tokens are written out between spaces (as Megatron-LM)."""
        out, last = "", 0
        ids = [int(i) for i in ids]
        for k, i in enumerate(ids):
            if i in self.inverse:
                out += self.processor.decode(ids[last:k]) + " " + self.inverse[i] + " "
                last = k + 1
        return out + self.processor.decode(ids[last:])


class Llama2Tokenizer:
    """Megatron-LM's ``Llama2Tokenizer``: the SentencePiece model as it is (vocabulary = its
    pieces); ``tokenize`` puts BOS in front and no EOS; ``eod`` is the model's EOS."""

    def __init__(self, model_file: str):
        self.model_file = os.fspath(model_file) if isinstance(model_file, (str, os.PathLike)) else model_file
        self.processor = load_sentencepiece(model_file)
        sp = self.processor
        self.bos_id, self.eos_id, self.pad_id = sp.bos_id(), sp.eos_id(), sp.pad_id()
        for name, value in (("BOS", self.bos_id), ("EOS", self.eos_id)):
            if not 0 <= value < sp.get_piece_size():
                raise ValueError(f"tokenizer model {self.model_file!r} has no {name} piece (id {value}); "
                                 "Llama2Tokenizer needs both BOS and EOS")
        self.eod = self.eos_id

    @property
    def vocab_size(self) -> int:
        return self.processor.get_piece_size()

    def tokenize(self, text: str, bos: bool = True, eos: bool = False) -> List[int]:
        """BOS (when asked), the pieces of ``text``, EOS (when asked)."""
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        ids = self.processor.encode(text)
        return ([self.bos_id] if bos else []) + ids + ([self.eos_id] if eos else [])

    def encode(self, text: str) -> List[int]:
        """A training document: BOS, the pieces, EOS."""
        return self.tokenize(text, bos=True, eos=True)

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.processor.decode([int(i) for i in ids])


def _special_token(config: dict, key: str) -> Optional[str]:
    """A special token of ``tokenizer_config.json``: a string or ``{"content": ...}``."""
    value = config.get(key)
    return value.get("content") if isinstance(value, dict) else value


class HuggingFaceTokenizer:
    """Megatron-LM's ``HuggingFaceTokenizer`` over a Hugging Face tokenizer directory (LLaMA-3's
    and most others'): ``tokenizer.json`` through the ``tokenizers`` library, with the special
    tokens of ``tokenizer_config.json``. ``tokenize`` gives what ``AutoTokenizer(text).input_ids``
    gives (the post-processor's BOS included); ``vocab_size`` counts the added tokens (the
    ``len(tokenizer)`` Megatron-LM uses); ``eod`` is the EOS token."""

    def __init__(self, directory: str):
        import tokenizers

        path = os.path.join(directory, "tokenizer.json") if os.path.isdir(directory) else directory
        if not os.path.isfile(path):
            raise ValueError(f"tokenizer model {directory!r}: no tokenizer.json (HuggingFaceTokenizer reads a Hugging "
                             "Face tokenizer directory)")
        try:
            self.tokenizer = tokenizers.Tokenizer.from_file(path)
        except Exception as e:  # the library raises its own Exception type for a bad file
            raise ValueError(f"tokenizer model {path!r} is not a tokenizers JSON file ({e})") from None
        config_path = os.path.join(os.path.dirname(path), "tokenizer_config.json")
        config = {}
        if os.path.isfile(config_path):
            with open(config_path) as f:
                config = json.load(f)
        self.model_file = path
        eos = _special_token(config, "eos_token")
        self.eos_id = self.tokenizer.token_to_id(eos) if eos else None
        if self.eos_id is None:
            raise ValueError(f"tokenizer model {directory!r}: no EOS token (eos_token of tokenizer_config.json); "
                             "HuggingFaceTokenizer needs one for the end of documents")
        bos = _special_token(config, "bos_token")
        self.bos_id = self.tokenizer.token_to_id(bos) if bos else None
        self.eod = self.eos_id

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def tokenize(self, text: str) -> List[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.encode(text).ids

    def encode(self, text: str) -> List[int]:
        """A training document: ``tokenize(text)`` and EOS."""
        return self.tokenize(text) + [self.eod]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids], skip_special_tokens=False)


class GPT2BPETokenizer:
    """Megatron-LM's ``GPT2BPETokenizer``: GPT-2's byte-level BPE of ``vocab.json`` and
    ``merges.txt`` (``--vocab-file``, ``--merge-file``) through the ``tokenizers`` library;
    ``tokenize`` adds no special token; ``eod`` is ``<|endoftext|>``."""

    def __init__(self, vocab_file: str, merge_file: str):
        import tokenizers

        for name, path in (("--vocab-file", vocab_file), ("--merge-file", merge_file)):
            if not path or not os.path.isfile(path):
                raise ValueError(f"GPT2BPETokenizer needs {name}: {path!r} is not a file")
        try:
            model = tokenizers.models.BPE.from_file(vocab_file, merge_file)
        except Exception as e:
            raise ValueError(f"--vocab-file {vocab_file!r} / --merge-file {merge_file!r} are not GPT-2 BPE files "
                             f"({e})") from None
        tok = tokenizers.Tokenizer(model)
        tok.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = tokenizers.decoders.ByteLevel()
        self.tokenizer = tok
        self.model_file = vocab_file
        self.eod = tok.token_to_id("<|endoftext|>")
        if self.eod is None:
            raise ValueError(f"--vocab-file {vocab_file!r} has no <|endoftext|> token")

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def tokenize(self, text: str) -> List[int]:
        if not isinstance(text, str):
            raise ValueError(f"text must be a str, got {type(text).__name__}")
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode(self, text: str) -> List[int]:
        return self.tokenize(text) + [self.eod]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


def build_tokenizer(tokenizer_type: str = "ByteTokenizer", tokenizer_model: Optional[str] = None,
                    vocab_file: Optional[str] = None, merge_file: Optional[str] = None):
    """The tokenizer named by Megatron-LM's ``--tokenizer-type`` and ``--tokenizer-model`` (or
    ``--vocab-file``/``--merge-file`` for GPT2BPETokenizer). ValueError when the type is
    unknown, a file is missing or given where none is used, or does not load."""
    if tokenizer_type not in TOKENIZER_TYPES:
        raise ValueError(f"tokenizer type {tokenizer_type!r} is not one of {', '.join(TOKENIZER_TYPES)}")
    if tokenizer_type != "GPT2BPETokenizer" and (vocab_file or merge_file):
        raise ValueError(f"{tokenizer_type} takes no --vocab-file or --merge-file (GPT2BPETokenizer does)")
    if tokenizer_type == "GPT2BPETokenizer":
        if tokenizer_model is not None:
            raise ValueError(f"GPT2BPETokenizer takes --vocab-file and --merge-file, not a tokenizer model "
                             f"({tokenizer_model!r})")
        return GPT2BPETokenizer(vocab_file, merge_file)
    if tokenizer_type == "ByteTokenizer":
        if tokenizer_model is not None:
            raise ValueError(f"ByteTokenizer takes no tokenizer model, got {tokenizer_model!r}")
        return ByteTokenizer()
    if tokenizer_model is None:
        raise ValueError(f"{tokenizer_type} needs a tokenizer model file or directory (--tokenizer-model)")
    cls = {"SentencePieceTokenizer": SentencePieceTokenizer, "Llama2Tokenizer": Llama2Tokenizer,
           "HuggingFaceTokenizer": HuggingFaceTokenizer}[tokenizer_type]
    return cls(tokenizer_model)


SENTENCEPIECE_MODEL_TYPES = ("bpe", "unigram")
_CHUNK_CHARS = 2000  # SentencePiece trains on "sentences" of at most max_sentence_length bytes


def _chunks(texts: Iterable[str]) -> Iterator[str]:
    """Each text cut at line ends into pieces of about ``_CHUNK_CHARS`` characters, newlines
    kept inside a piece (so that pieces may span them, as code needs)."""
    for text in texts:
        current: List[str] = []
        size = 0
        for line in text.split("\n"):
            if current and size + len(line) > _CHUNK_CHARS:
                yield "\n".join(current)
                current, size = [], 0
            current.append(line[:4 * _CHUNK_CHARS])
            size += len(line) + 1
        if current and any(c.strip() for c in current):
            yield "\n".join(current)


def train_sentencepiece(texts: Iterable[str], model_file: str, vocab_size: int, model_type: str = "bpe",
                        max_sentences: int = 0, threads: int = 1, seed: int = 0) -> dict:
    """Trains a SentencePiece model on ``texts`` (strings: documents) and writes it to
    ``model_file``. The pieces keep text as it is (no Unicode normalization, whitespace and
    newlines preserved, bytes as fallback pieces ``<0x..>`` so any text round-trips), with
    ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2 as LLaMA's tokenizer. ``max_sentences``: train on at
    most that many chunks (drawn with ``seed``; 0: all). Returns ``{"vocab_size",
    "chunks"}``. ValueError for bad arguments or when SentencePiece refuses the input (e.g.
    a vocabulary too small for the characters seen)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
        raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
    if model_type not in SENTENCEPIECE_MODEL_TYPES:
        raise ValueError(f"model type {model_type!r} is not one of {', '.join(SENTENCEPIECE_MODEL_TYPES)}")
    for name, value, low in (("max_sentences", max_sentences, 0), ("threads", threads, 1), ("seed", seed, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    try:
        import sentencepiece
    except ImportError:
        raise ValueError("training a tokenizer needs the sentencepiece package "
                         "(Debian: apt-get install python3-sentencepiece)") from None
    counted = [0]
    failed: List[BaseException] = []

    def sentences():
        # SentencePiece ends its input at an exception of the iterator and trains on what it
        # got: keep the error to raise it after.
        try:
            for chunk in _chunks(texts):
                counted[0] += 1
                yield chunk
        except Exception as e:
            failed.append(e)

    buffer = io.BytesIO()
    sentencepiece.set_random_generator_seed(seed)
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=sentences(), model_writer=buffer, vocab_size=vocab_size, model_type=model_type,
            normalization_rule_name="identity", remove_extra_whitespaces=False, byte_fallback=True,
            allow_whitespace_only_pieces=True, split_by_whitespace=True, max_sentence_length=16 * _CHUNK_CHARS,
            input_sentence_size=max_sentences, shuffle_input_sentence=max_sentences > 0, num_threads=threads,
            minloglevel=2)
    except RuntimeError as e:
        if failed:
            raise failed[0] from None
        if not counted[0]:
            raise ValueError("no text to train a tokenizer on") from None
        reason = str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__
        raise ValueError(f"SentencePiece refused to train a {model_type} model of {vocab_size} pieces on "
                         f"{counted[0]} chunks: {reason}") from None
    if failed:
        raise failed[0]
    if not counted[0]:
        raise ValueError("no text to train a tokenizer on")
    with open(model_file, "wb") as f:
        f.write(buffer.getvalue())
    return {"vocab_size": load_sentencepiece(model_file).get_piece_size(), "chunks": counted[0]}
