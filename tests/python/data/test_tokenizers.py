"""Tokenizers: the byte default, SentencePiece models with Megatron-LM's two wrappers'
semantics, training a model (library and command line), and models that do not load."""

import json
import os

import pytest

sentencepiece = pytest.importorskip("sentencepiece")

from hotswitch.cli import train_tokenizer  # noqa: E402
from hotswitch.data import tokenizers as tk  # noqa: E402
from hotswitch.data.text import Corpus  # noqa: E402

CODE = ["def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n", "import os\nprint(os.getcwd())  # héllo ∑\n",
        "for i in range(10):\n\tprint(i)\n"] * 4


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("tok") / "tok.model")
    info = tk.train_sentencepiece(iter(CODE), path, vocab_size=320)
    assert info["vocab_size"] == 320
    return path


def test_byte_tokenizer_document_is_tokenize_and_eod():
    t = tk.ByteTokenizer()
    assert t.tokenize("hé") == [256, 104, 195, 169] and t.eod == 257
    assert t.encode("hé") == t.tokenize("hé") + [t.eod]
    assert t.detokenize(t.encode("hé")) == "hé"


def test_training_is_deterministic_and_pieces_keep_text_exactly(model, tmp_path):
    again = str(tmp_path / "again.model")
    tk.train_sentencepiece(iter(CODE), again, vocab_size=320)
    assert open(again, "rb").read() == open(model, "rb").read()
    sp = tk.load_sentencepiece(model)
    for text in CODE[:3] + ["unseen ✓ chars\r\n\t  spaces  "]:
        assert sp.decode(sp.encode(text)) == text  # no normalization, whitespace kept, byte fallback
    with pytest.raises(ValueError, match="Vocabulary size is smaller than required"):
        tk.train_sentencepiece(iter(CODE), str(tmp_path / "small.model"), vocab_size=50)
    with pytest.raises(ValueError, match="no text"):
        tk.train_sentencepiece(iter([]), str(tmp_path / "empty.model"), vocab_size=300)


def test_sentencepiece_tokenizer_has_megatrons_vocabulary_and_special_tokens(model):
    t = tk.SentencePieceTokenizer(model)
    sp = tk.load_sentencepiece(model)
    n = sp.get_piece_size()
    # <CLS> <SEP> <EOD> <MASK> and <PAD> (the model has no pad id) are appended; <s> and </s> exist.
    assert t.vocab_size == n + 5
    assert (t.vocab["<CLS>"], t.vocab["<SEP>"], t.eod, t.vocab["<MASK>"], t.pad_id) == (n, n + 1, n + 2, n + 3, n + 4)
    assert (t.bos_id, t.eos_id) == (sp.bos_id(), sp.eos_id()) == (1, 2)
    assert t.tokenize("x = 1") == sp.encode("x = 1")  # no BOS, no EOS
    assert t.tokenize("a<EOD>b</s>") == sp.encode("a") + [t.eod] + sp.encode("b") + [2]
    assert t.encode("x") == sp.encode("x") + [t.eod]
    assert t.detokenize(t.tokenize("a<EOD>b")) == "a <EOD> b"


def test_llama2_tokenizer_puts_bos_in_front_and_ends_documents_with_eos(model):
    t = tk.Llama2Tokenizer(model)
    sp = tk.load_sentencepiece(model)
    assert t.vocab_size == sp.get_piece_size() and t.eod == t.eos_id == 2
    assert t.tokenize("x = 1") == [1] + sp.encode("x = 1")
    assert t.encode("x = 1") == [1] + sp.encode("x = 1") + [2]
    assert t.detokenize(t.encode("x = 1")) == "x = 1"


def test_a_corpus_tokenizes_with_the_given_tokenizer(model, tmp_path):
    (tmp_path / "a.py").write_text(CODE[0])
    t = tk.Llama2Tokenizer(model)
    corpus = Corpus(str(tmp_path), tokenizer=t)
    assert corpus.tokens(0) == t.encode(CODE[0]) and corpus.lengths == [len(t.encode(CODE[0]))]


def test_tokenizers_that_do_not_load_are_refused_naming_the_file(tmp_path):
    garbage = tmp_path / "garbage.model"
    garbage.write_bytes(b"\x00not a model" * 10)
    for kind in ("SentencePieceTokenizer", "Llama2Tokenizer"):
        with pytest.raises(ValueError, match=f"'{garbage}' is not a SentencePiece model"):
            tk.build_tokenizer(kind, str(garbage))
        with pytest.raises(ValueError, match="does not exist"):
            tk.build_tokenizer(kind, str(tmp_path / "missing.model"))
        with pytest.raises(ValueError, match="needs a tokenizer model file"):
            tk.build_tokenizer(kind)
    with pytest.raises(ValueError, match="'BertWordPieceTokenizer' is not one of"):
        tk.build_tokenizer("BertWordPieceTokenizer")
    with pytest.raises(ValueError, match="GPT2BPETokenizer needs --vocab-file: None is not a file"):
        tk.build_tokenizer("GPT2BPETokenizer")
    with pytest.raises(ValueError, match="ByteTokenizer takes no tokenizer model"):
        tk.build_tokenizer("ByteTokenizer", str(garbage))


def test_train_tokenizer_cli_on_a_directory_and_on_jsonl(tmp_path, capsys):
    texts = tmp_path / "texts"
    texts.mkdir()
    for i, text in enumerate(CODE[:3]):
        (texts / f"{i}.py").write_text(text * 3)
    assert train_tokenizer.main(["--input", str(texts), "--output-prefix", str(tmp_path / "d"),
                                 "--vocab-size", "300"]) == 0
    assert "300 pieces" in capsys.readouterr().out
    assert tk.Llama2Tokenizer(str(tmp_path / "d.model")).vocab_size == 300
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text("".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(CODE)))
    assert train_tokenizer.main(["--input", str(jsonl), "--output-prefix", str(tmp_path / "j"),
                                 "--vocab-size", "300", "--model-type", "unigram"]) == 0
    assert os.path.getsize(tmp_path / "j.model") > 0
    jsonl.write_text('{"text": "a"}\n{"text": 5}\n')
    with pytest.raises(SystemExit):
        train_tokenizer.main(["--input", str(jsonl), "--output-prefix", str(tmp_path / "x"), "--vocab-size", "300"])
    assert f"{jsonl}:2: 'text' must be a string" in capsys.readouterr().err
