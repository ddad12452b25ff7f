"""Megatron-LM's indexed datasets: the reader against files written here from the format's
specification (an independent writer), preprocess_data byte for byte against the same
writer, blends and splits, the sampler over them, and every bad file refused by name."""

import json
import struct

import numpy as np
import pytest

from hotswitch.cli import preprocess_data
from hotswitch.data import blend, indexed
from hotswitch.data.documents import Subset
from hotswitch.data.sampler import LengthAwareSampler
from hotswitch.data.text import Corpus
from hotswitch.data.tokenizers import ByteTokenizer

# The specification (megatron/core/datasets/indexed_dataset.py): dtype codes and layout.
CODES = {"uint8": 1, "int8": 2, "int16": 3, "int32": 4, "int64": 5, "float64": 6, "float32": 7, "uint16": 8}
FORMATS = {"uint8": "B", "int8": "b", "int16": "h", "int32": "i", "int64": "q", "uint16": "H"}


def spec_write(prefix, documents, dtype="uint16", version=1, trailer=b""):
    """Writes PREFIX.bin/.idx with struct alone: ``documents`` is a list of documents, each a
    list of sequences (lists of token ids)."""
    fmt = FORMATS[dtype]
    size = struct.calcsize(fmt)
    lengths, pointers, doc_index, data, offset = [], [], [0], b"", 0
    for doc in documents:
        for seq in doc:
            data += struct.pack(f"<{len(seq)}{fmt}", *seq)
            lengths.append(len(seq))
            pointers.append(offset)
            offset += len(seq) * size
        doc_index.append(len(lengths))
    with open(f"{prefix}.bin", "wb") as f:
        f.write(data)
    idx = b"MMIDIDX\x00\x00" + struct.pack("<Q", version) + struct.pack("<B", CODES[dtype])
    idx += struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_index))
    idx += struct.pack(f"<{len(lengths)}i", *lengths) + struct.pack(f"<{len(pointers)}q", *pointers)
    idx += struct.pack(f"<{len(doc_index)}q", *doc_index) + trailer
    with open(f"{prefix}.idx", "wb") as f:
        f.write(idx)
    return f"{prefix}.idx", f"{prefix}.bin"


DOCS = [[[256, 104, 105, 257]], [[256, 1, 2], [3, 4, 257]], [], [[7] * 300], [[256, 65535 % 258, 257]]]


@pytest.mark.parametrize("dtype", ["uint16", "int32", "int64", "uint8"])
def test_reader_reads_what_the_specification_writes(tmp_path, dtype):
    docs = [[[t % 256 if dtype == "uint8" else t for t in s] for s in d] for d in DOCS]
    spec_write(str(tmp_path / "d"), docs, dtype)
    ds = indexed.IndexedDataset(str(tmp_path / "d"))
    assert ds.dtype == np.dtype(dtype) and len(ds) == len(docs) and ds.num_sequences == 5
    assert list(ds.lengths) == [sum(len(s) for s in d) for d in docs]
    for i, d in enumerate(docs):
        assert ds.tokens(i) == [t for s in d for t in s]
    # Read by memory map: a sequence is a view of the mapped file, not a copy.
    seq = ds.sequence(3)
    assert isinstance(ds._bin, np.memmap) and not seq.flags.owndata and not seq.flags.writeable
    assert seq.tolist() == docs[3][0]
    with pytest.raises(ValueError, match=r"document index 5 outside \[0, 5\)"):
        ds.tokens(5)


def test_builder_writes_the_specification_byte_for_byte(tmp_path):
    spec_write(str(tmp_path / "spec"), DOCS, "uint16")
    b = indexed.IndexedDatasetBuilder(str(tmp_path / "ours"), np.uint16)
    for d in DOCS:
        b.add_document([t for s in d for t in s], [len(s) for s in d])
    b.finalize()
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"ours{ext}").read_bytes() == (tmp_path / f"spec{ext}").read_bytes()
    b = indexed.IndexedDatasetBuilder(str(tmp_path / "big"), np.uint8)
    with pytest.raises(ValueError, match=r"token ids \[0, 300\] do not fit uint8"):
        b.add_document([0, 300])
    with pytest.raises(ValueError, match="do not add up"):
        b.add_document([1, 2, 3], [2])
    b.abort()
    assert not (tmp_path / "big.bin").exists()


def _jsonl(path, records):
    with open(path, "w") as f:
        for r in records:
            f.write(json.dumps(r) + "\n")


RECORDS = [{"text": "héllo wörld", "meta": "a"}, {"text": ""}, {"text": ["first sentence. ", "second"]},
           {"text": "x" * 700}, {"text": "<EOD> inside"}]


@pytest.mark.parametrize("append_eod,workers", [(True, 1), (False, 2)])
def test_preprocess_data_matches_the_specification_byte_for_byte(tmp_path, append_eod, workers):
    src = tmp_path / "in.jsonl"
    _jsonl(src, RECORDS)
    with open(src, "a") as f:
        f.write("\n")  # a blank line is skipped
    args = ["--input", str(src), "--output-prefix", str(tmp_path / "out"), "--workers", str(workers)]
    assert preprocess_data.main(args + (["--append-eod"] if append_eod else [])) == 0
    # Independently: ByteTokenizer's tokenize is BOS and the UTF-8 bytes; EOD is 257.
    docs = []
    for r in RECORDS:
        sentences = r["text"] if isinstance(r["text"], list) else [r["text"]]
        seqs = [[256] + list(s.encode()) for s in sentences]
        if append_eod and seqs:
            seqs[-1].append(257)
        docs.append(seqs)
    spec_write(str(tmp_path / "spec"), docs, "uint16")
    for ext in (".bin", ".idx"):
        assert (tmp_path / f"out_text_document{ext}").read_bytes() == (tmp_path / f"spec{ext}").read_bytes(), ext
    ds = indexed.IndexedDataset(str(tmp_path / "out_text_document"))
    assert ds.tokens(0) == ByteTokenizer().encode("héllo wörld", eos=append_eod)


def test_preprocess_data_refuses_bad_input_and_leaves_no_dataset(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "ok"}\n{"text": broken}\n')
    with pytest.raises(SystemExit):
        preprocess_data.main(["--input", str(src), "--output-prefix", str(tmp_path / "o")])
    assert f"{src}:2: not valid JSON" in capsys.readouterr().err
    assert not list(tmp_path.glob("o_*"))
    src.write_text('{"body": "no text key"}\n')
    with pytest.raises(SystemExit):
        preprocess_data.main(["--input", str(src), "--output-prefix", str(tmp_path / "o")])
    assert f"{src}:1: no key 'text'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        preprocess_data.main(["--input", str(tmp_path / "missing.jsonl"), "--output-prefix", str(tmp_path / "o")])
    assert "missing.jsonl" in capsys.readouterr().err


def _bad(tmp_path, how):
    prefix = str(tmp_path / "bad")
    idx, binary = spec_write(prefix, DOCS, "uint16", trailer=b"\x00" * 5 if how == "modes" else b"")
    data = open(idx, "rb").read()
    if how == "magic":
        data = b"NOTANIDX\x00" + data[9:]
    elif how == "version":
        data = data[:9] + struct.pack("<Q", 2) + data[17:]
    elif how == "code":
        data = data[:17] + bytes([9]) + data[18:]
    elif how == "float":
        data = data[:17] + bytes([7]) + data[18:]
    elif how.startswith("cut"):
        data = data[:int(how[3:])]
    elif how == "extra":
        data += b"\x00" * 3
    elif how == "docindex":
        data = data[:-8] + struct.pack("<q", 4)
    elif how == "decreasing":  # the document index is [0, 1, 3, 3, 4, 5]
        data = data[:-48] + struct.pack("<6q", 0, 3, 1, 3, 4, 5)
    elif how == "bin":
        open(binary, "r+b").truncate(10)
    elif how == "nobin":
        import os
        os.remove(binary)
    open(idx, "wb").write(data)
    return prefix


@pytest.mark.parametrize("how,needle", [
    ("magic", "not a Megatron-LM indexed dataset index"),
    ("version", "index version 2, only version 1"),
    ("code", "dtype code 9 is not one of"),
    ("float", "dtype code 7 (float32) holds no token ids"),
    ("cut0", "truncated: 0 bytes"),
    ("cut5", "truncated: 5 bytes"),
    ("cut30", "truncated: 30 bytes, the header alone needs 34"),
    ("cut100", "truncated: 100 bytes, its header (5 sequences, 6 document-index entries) needs 142"),
    ("modes", "sequence-mode trailer of 5 bytes (a multimodal dataset)"),
    ("extra", "3 bytes beyond the 142"),
    ("docindex", "the document index runs from 0 to 4, expected 0 to the sequence count 5"),
    ("decreasing", "the document index decreases at entry 2 (3 -> 1)"),
    ("bin", "bad.bin: 10 bytes, shorter than its index says: it needs 626, and sequence 1 already ends at byte 14"),
    ("nobin", "bad.bin: no such file"),
])
def test_bad_indexed_datasets_are_refused_naming_the_file(tmp_path, how, needle):
    prefix = _bad(tmp_path, how)
    with pytest.raises(ValueError) as e:
        indexed.IndexedDataset(prefix)
    assert needle in str(e.value) and str(tmp_path) in str(e.value), str(e.value)


def test_data_path_parsing_and_bad_weights():
    assert blend.parse_data_path(["a"]) == [(None, "a")]
    assert blend.parse_data_path(["0.3", "a", "0.7", "b"]) == [(0.3, "a"), (0.7, "b")]
    assert blend.parse_data_path(["a", "b"]) == [(None, "a"), (None, "b")]
    assert blend.parse_data_path("2 a 1 b") == [(2.0, "a"), (1.0, "b")]
    for words, needle in [(["0", "a"], "weight '0'"), (["-1", "a"], "weight '-1'"), (["nan", "a"], "weight 'nan'"),
                          (["inf", "a"], "weight 'inf'"), (["0.3", "a", "x", "b"], "weight 'x'"),
                          (["0.3", "a", "b"], "mixes weights and paths"), (["0.5", "0.5"], "got the number '0.5'"),
                          ([], "needs a path")]:
        with pytest.raises(ValueError, match=needle):
            blend.parse_data_path(words)
    with pytest.raises(ValueError, match="must be a positive number"):
        blend.Blend([Subset.__new__(Subset)], [0])


def test_split_rounds_as_megatron():
    assert blend.parse_split("969,30,1") == pytest.approx([0.969, 0.03, 0.001])
    assert blend.split_ranges(blend.parse_split("969,30,1"), 1000) == [(0, 969), (969, 999), (999, 1000)]
    assert blend.split_ranges(blend.parse_split("1,1"), 3) == [(0, 1), (1, 3), (3, 3)]
    assert blend.split_ranges(blend.parse_split("969,30,1"), 10) == [(0, 10), (10, 10), (10, 10)]
    for bad in ("a,b", "1,-1", "0,0,0", "1,2,3,4"):
        with pytest.raises(ValueError, match="--split"):
            blend.parse_split(bad)


@pytest.fixture
def two_sources(tmp_path):
    rng = np.random.default_rng(0)
    a = [[[int(x) for x in rng.integers(0, 258, int(n))]] for n in rng.integers(1, 60, 100)]
    b = [[[int(x) for x in rng.integers(0, 258, int(n))]] for n in rng.integers(30, 200, 40)]
    spec_write(str(tmp_path / "a"), a)
    spec_write(str(tmp_path / "b"), b)
    texts = tmp_path / "texts"
    texts.mkdir()
    for i in range(20):
        (texts / f"f{i:02d}.txt").write_text("word " * (i + 1))
    return tmp_path, a, b


def test_splits_and_blends_of_indexed_datasets_and_text(two_sources):
    root, a, b = two_sources
    splits = blend.open_splits(["0.25", str(root / "a"), "0.75", str(root / "b")], "80,15,5", max_length=100)
    assert splits.documents == [80 + 32, 15 + 6, 5 + 2]
    assert splits.cut[0] == sum(1 for d in a[:80] + b[:32] if len(d[0]) > 100)
    assert isinstance(splits.train, blend.Blend) and splits.train.weights == [0.25, 0.75]
    assert [s.lengths.tolist() for s in splits.train.sources] == \
        [[len(d[0]) for d in a[:80]], [len(d[0]) for d in b[:32]]]
    assert splits.valid.sources[1].tokens(0) == b[32][0]
    assert "112 train, 21 valid, 7 test documents" in splits.describe()
    # Unweighted sources: by document counts; a directory is a text corpus.
    mixed = blend.open_splits([str(root / "a"), str(root / "texts")], "1", tokenizer=ByteTokenizer())
    assert mixed.train.weights == pytest.approx([100 / 120, 20 / 120]) and mixed.valid is None
    assert isinstance(mixed.train.sources[1].parent, Corpus)
    with pytest.raises(ValueError, match="neither an indexed dataset prefix"):
        blend.open_splits([str(root / "nothing")])
    with pytest.raises(ValueError, match="leaves no training documents"):
        blend.open_splits([str(root / "a")], "0,1,0")


def test_sampler_blends_by_weight_resumes_and_counts_cut_documents(two_sources):
    root, a, b = two_sources
    splits = blend.open_splits(["1", str(root / "a"), "3", str(root / "b")], "1", max_length=100)
    s1 = LengthAwareSampler(splits.train, max_length=100, global_batch_size=8, seed=5)
    s2 = LengthAwareSampler(splits.train, max_length=100, global_batch_size=8, seed=5)
    batches = [s1.next_batch() for _ in range(25)]
    assert batches == [s2.next_batch() for _ in range(25)]  # the same on every rank
    from_a = set(map(tuple, (d[0] for d in a)))
    drawn_a = sum(1 for batch in batches for seq in batch if tuple(seq) in from_a)
    assert drawn_a == 50  # 200 draws, weight 1/4, Megatron's greedy choice: exactly a quarter
    assert all(1 <= len(seq) <= 100 for batch in batches for seq in batch)
    assert s1.documents_drawn == 200
    state = s1.state_dict()
    assert set(state) == {"seed", "streams"} and len(state["streams"]) == 2
    expected = [s1.next_batch() for _ in range(3)]
    s3 = LengthAwareSampler(splits.train, max_length=100, global_batch_size=8, seed=5)
    s3.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    assert [s3.next_batch() for _ in range(3)] == expected
    for bad, needle in [({"seed": 5, "streams": [[0, 0]]}, "blends 2 sources"),
                        ({"seed": 5, "streams": [[0, 0], [0, 999]]}, "position 999 of source 1"),
                        ({"seed": 5, "epoch": 0, "position": 0}, "must be a dict with seed, streams")]:
        with pytest.raises(ValueError, match=needle):
            s3.load_state_dict(bad)
    # One epoch of the single source `b` draws each non-empty document once; long ones are cut.
    sb = LengthAwareSampler(indexed.IndexedDataset(str(root / "b")), max_length=100, global_batch_size=40)
    epoch = sb.next_batch()
    assert sorted(map(tuple, epoch)) == sorted(tuple(d[0][:100]) for d in b)
    assert sb.cut_documents == sum(1 for d in b if len(d[0]) > 100)


def test_sampler_skips_empty_documents(tmp_path):
    spec_write(str(tmp_path / "e"), [[], [[1, 2]], [], [[3]]])
    s = LengthAwareSampler(indexed.IndexedDataset(str(tmp_path / "e")), max_length=8, global_batch_size=4)
    assert sorted(map(tuple, s.next_batch())) == [(1, 2), (1, 2), (3,), (3,)]
    spec_write(str(tmp_path / "z"), [[], []])
    with pytest.raises(ValueError, match="holds no non-empty document"):
        LengthAwareSampler(indexed.IndexedDataset(str(tmp_path / "z")), max_length=8, global_batch_size=4)
