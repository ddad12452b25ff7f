"""Training data: documents from a directory of text files or from Megatron-LM's indexed
datasets, tokenizers, Megatron's ``--data-path`` blends and ``--split``, and the length-aware
sampler that draws the same global batches of whole documents on every rank.

Modules: ``text`` (text corpora, lengths files), ``indexed`` (the ``.bin``/``.idx`` reader
and writer), ``blend`` (blends and splits), ``tokenizers``, ``sampler``, ``documents`` (what
a sampler draws from).
"""

from hotswitch.data.blend import Blend, DataSplits, open_documents, open_splits, parse_data_path, parse_split
from hotswitch.data.documents import Documents, Subset
from hotswitch.data.indexed import IndexedDataset, IndexedDatasetBuilder
from hotswitch.data.sampler import LONG_SEQUENCE_POLICIES, LengthAwareSampler, fit_length
from hotswitch.data.text import DOCUMENT_UNITS, Corpus, default_corpus_dir, load_lengths
from hotswitch.data.tokenizers import (ByteTokenizer, Llama2Tokenizer, SentencePieceTokenizer, TOKENIZER_TYPES,
                                       build_tokenizer)

__all__ = [
    "Blend",
    "ByteTokenizer",
    "Corpus",
    "DOCUMENT_UNITS",
    "DataSplits",
    "Documents",
    "IndexedDataset",
    "IndexedDatasetBuilder",
    "LONG_SEQUENCE_POLICIES",
    "LengthAwareSampler",
    "Llama2Tokenizer",
    "SentencePieceTokenizer",
    "Subset",
    "TOKENIZER_TYPES",
    "build_tokenizer",
    "default_corpus_dir",
    "fit_length",
    "load_lengths",
    "open_documents",
    "open_splits",
    "parse_data_path",
    "parse_split",
]
