"""Training data: tokenizer, corpus, sampler and the lengths-file generator."""

import pytest

from hotswitch import data
from hotswitch.cli import lengths


@pytest.fixture
def corpus_dir(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("def f():\n    return 1\n\n\ndef g():\n\n    return 2\n")
    (tmp_path / "sub" / "b.txt").write_text("héllo wörld\n")
    (tmp_path / "sub" / "c.txt").write_text("x" * 500)
    (tmp_path / "blob.bin").write_bytes(b"\x00\x01\x02binary")
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (tmp_path / "empty.txt").write_text("")
    return tmp_path


def test_byte_tokenizer_round_trips_unicode():
    tok = data.ByteTokenizer()
    ids = tok.encode("héllo ∑")
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert len(ids) == len("héllo ∑".encode()) + 2
    assert tok.decode(ids) == "héllo ∑"
    with pytest.raises(ValueError, match="258"):
        tok.decode([1, 258])
    with pytest.raises(ValueError, match="bytes"):
        tok.encode(b"raw")


def test_corpus_reads_text_files_in_order_and_skips_the_rest(corpus_dir):
    corpus = data.Corpus(str(corpus_dir))
    names = [p.rsplit("/", 1)[1] for p in corpus.paths]
    assert names == ["a.py", "b.txt", "c.txt"]
    assert corpus.lengths == [len(open(p, "rb").read()) + 2 for p in corpus.paths]
    assert data.ByteTokenizer().decode(corpus.tokens(1)) == "héllo wörld\n"
    with pytest.raises(ValueError, match="outside"):
        corpus.tokens(3)


def test_block_unit_cuts_at_top_level_blank_lines(corpus_dir):
    corpus = data.Corpus(str(corpus_dir), unit="block", max_files=1)
    tok = data.ByteTokenizer()
    # The blank line inside g() is followed by an indented line: no cut there.
    assert [tok.decode(corpus.tokens(i)) for i in range(len(corpus))] == [
        "def f():\n    return 1\n", "def g():\n\n    return 2\n"]


@pytest.mark.parametrize("kwargs,needle", [
    (dict(root="/nonexistent/dir"), "does not exist"),
    (dict(max_files=0), "max_files must be a positive int"),
    (dict(unit="line"), "'line' is not one of file, block"),
])
def test_corpus_rejects_bad_arguments(corpus_dir, kwargs, needle):
    kwargs.setdefault("root", str(corpus_dir))
    with pytest.raises(ValueError, match=needle):
        data.Corpus(**kwargs)


def test_corpus_without_text_files_is_refused(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"\x00")
    with pytest.raises(ValueError, match="no UTF-8 text files"):
        data.Corpus(str(tmp_path))


def test_default_corpus_is_the_standard_library():
    corpus = data.Corpus(max_files=20, unit="block")
    assert corpus.root == data.default_corpus_dir()
    assert len(corpus) >= 20 and min(corpus.lengths) >= 3


def test_fit_length_truncates_or_splits():
    assert data.fit_length(list(range(10)), 4) == [[0, 1, 2, 3]]
    assert data.fit_length(list(range(10)), 4, "split") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert data.fit_length([1, 2], 4, "split") == [[1, 2]]
    with pytest.raises(ValueError, match="'pad' is not one of"):
        data.fit_length([1], 4, "pad")
    with pytest.raises(ValueError, match="max_length must be a positive int, got 0"):
        data.fit_length([1], 0)


def test_sampler_is_deterministic_covers_every_document_and_resumes(corpus_dir):
    corpus = data.Corpus(str(corpus_dir))
    a = data.LengthAwareSampler(corpus, max_length=64, global_batch_size=2, seed=3)
    b = data.LengthAwareSampler(corpus, max_length=64, global_batch_size=2, seed=3)
    first = [a.next_batch() for _ in range(3)]
    assert first == [b.next_batch() for _ in range(3)]
    # One epoch (3 documents) is the first three sequences drawn.
    seen = [tuple(s) for batch in first for s in batch][:3]
    assert sorted(seen) == sorted(tuple(corpus.tokens(i)[:64]) for i in range(3))
    assert all(1 <= len(s) <= 64 for batch in first for s in batch)
    state = a.state_dict()
    expected = [a.next_batch() for _ in range(2)]
    c = data.LengthAwareSampler(corpus, max_length=64, global_batch_size=2, seed=3)
    c.load_state_dict(state)
    assert [c.next_batch() for _ in range(2)] == expected


def test_sampler_token_budget_and_split(corpus_dir):
    corpus = data.Corpus(str(corpus_dir))
    s = data.LengthAwareSampler(corpus, max_length=100, global_batch_tokens=150, long_sequences="split")
    long_doc = data.fit_length(corpus.tokens(2), 100, "split")
    assert [len(x) for x in long_doc] == [100] * 5 + [2]
    batches = []
    for i in range(6):
        if i == 2:
            state = s.state_dict()
        batches.append(s.next_batch())
    # Exactly the budget every step, in pieces of at most max_length; documents run on into the
    # next batch, so the batches' tokens are the drawn documents' pieces, in order, none lost.
    assert all(sum(len(x) for x in batch) == 150 for batch in batches)
    assert all(1 <= len(x) <= 100 for batch in batches for x in batch)
    flat = [t for batch in batches for x in batch for t in x]
    fresh = data.LengthAwareSampler(corpus, max_length=100, global_batch_tokens=150, long_sequences="split")
    drawn = []
    while len(drawn) < len(flat):
        k = fresh._choose()
        doc = fresh._streams[k].take()
        drawn += [t for piece in data.fit_length(corpus.tokens(doc), 100, "split") for t in piece]
    assert flat == drawn[:len(flat)]
    # A resume from the middle of a document continues it.
    assert "carry" in state, state
    resumed = data.LengthAwareSampler(corpus, max_length=100, global_batch_tokens=150, long_sequences="split")
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(4)] == batches[2:]
    with pytest.raises(ValueError, match="carry must be"):
        resumed.load_state_dict({**state, "carry": [0, 10 ** 6, 1]})


@pytest.mark.parametrize("kwargs,needle", [
    (dict(), "exactly one of global_batch_size and global_batch_tokens"),
    (dict(global_batch_size=2, global_batch_tokens=10), "exactly one of"),
    (dict(global_batch_size=0), "global_batch_size must be a positive int"),
    (dict(global_batch_size=2, max_length=-1), "max_length must be a positive int, got -1"),
    (dict(global_batch_size=2, long_sequences="drop"), "'drop' is not one of"),
    (dict(global_batch_size=2, seed="x"), "seed must be an int"),
])
def test_sampler_rejects_bad_arguments(corpus_dir, kwargs, needle):
    kwargs.setdefault("max_length", 16)
    with pytest.raises(ValueError, match=needle):
        data.LengthAwareSampler(data.Corpus(str(corpus_dir)), **kwargs)


def test_sampler_refuses_foreign_state(corpus_dir):
    s = data.LengthAwareSampler(data.Corpus(str(corpus_dir)), max_length=16, global_batch_size=1, seed=1)
    before = s.state_dict()
    for bad, needle in [({"seed": 2, "epoch": 0, "position": 0}, "seed 2"),
                        ({"seed": 1, "epoch": 0, "position": 99}, "position 99"),
                        ({"epoch": 0}, "must be a dict")]:
        with pytest.raises(ValueError, match=needle):
            s.load_state_dict(bad)
        assert s.state_dict() == before


def test_lengths_cli_writes_one_length_per_line(corpus_dir, tmp_path_factory, capsys):
    tmp_path = tmp_path_factory.mktemp("out")
    out = tmp_path / "out.lengths"
    assert lengths.main([str(corpus_dir), "-o", str(out), "--unit", "block"]) == 0
    written = [int(x) for x in out.read_text().split()]
    assert written == data.Corpus(str(corpus_dir), unit="block").lengths
    assert "documents from" in capsys.readouterr().out
    before = out.read_text()
    with pytest.raises(SystemExit) as info:
        lengths.main([str(tmp_path / "missing"), "-o", str(out)])
    assert info.value.code == 2  # argparse's usage error
    assert str(tmp_path / "missing") in capsys.readouterr().err
    assert out.read_text() == before  # nothing written
