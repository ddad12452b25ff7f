"""HuggingFaceTokenizer and GPT2BPETokenizer through the ``tokenizers`` library, checked
against ``transformers``' own tokenizers on the same files (``AutoTokenizer`` for a LLaMA-3
style ``tokenizer.json`` directory, ``GPT2Tokenizer`` for
``vocab.json``/``merges.txt``); preprocessing and training with them; bad files refused."""

import json
import os
import subprocess
import sys

import pytest

tokenizers = pytest.importorskip("tokenizers")
pytest.importorskip("transformers")

from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import AutoTokenizer, GPT2Tokenizer  # noqa: E402

from hotswitch.cli import preprocess_data  # noqa: E402
from hotswitch.data import tokenizers as tk  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CODE = ["def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n", "import os\nprint(os.getcwd())  # héllo ∑\n",
        "for i in range(10):\n\tprint(i)  <|end_of_text|> not special here\n"] * 8
TEXTS = ["def g(y): return y * 2", "  leading spaces and ünïcödé ∑ 🙂", "", "print('a')\n\n\nx = 1"]


@pytest.fixture(scope="module")
def llama3_dir(tmp_path_factory):
    """A byte-level BPE ``tokenizer.json`` with LLaMA-3's special tokens and its BOS
    post-processor, and a ``tokenizer_config.json`` naming BOS and EOS."""
    d = tmp_path_factory.mktemp("llama3")
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(CODE, trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
        "eos_token": "<|end_of_text|>"}))
    return str(d)


@pytest.fixture(scope="module")
def gpt2_files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gpt2")
    tok = tokenizers.ByteLevelBPETokenizer()
    tok.train_from_iterator(CODE, vocab_size=320, special_tokens=["<|endoftext|>"])
    tok.save_model(str(d))
    return str(d / "vocab.json"), str(d / "merges.txt")


def test_huggingface_tokenizer_equals_autotokenizer(llama3_dir):
    ours = tk.build_tokenizer("HuggingFaceTokenizer", llama3_dir)
    theirs = AutoTokenizer.from_pretrained(llama3_dir)
    assert ours.vocab_size == len(theirs)
    assert ours.eod == theirs.eos_token_id and ours.bos_id == theirs.bos_token_id
    for text in TEXTS + CODE[:3]:
        ids = ours.tokenize(text)
        assert ids == theirs(text).input_ids, text
        assert ids[0] == theirs.bos_token_id
        assert ours.encode(text) == ids + [theirs.eos_token_id]
        assert ours.detokenize(ids) == theirs.decode(ids)


def test_gpt2_bpe_tokenizer_equals_transformers_gpt2_tokenizer(gpt2_files):
    vocab, merges = gpt2_files
    ours = tk.build_tokenizer("GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    theirs = GPT2Tokenizer.from_pretrained(os.path.dirname(vocab))
    assert ours.vocab_size == len(theirs.get_vocab()) and ours.eod == theirs.convert_tokens_to_ids("<|endoftext|>")
    for text in TEXTS + CODE[:3]:
        ids = ours.tokenize(text)
        assert ids == theirs.encode(text), text
        assert ours.detokenize(ids) == text


def test_bad_tokenizer_files_are_refused_naming_them(tmp_path, gpt2_files, llama3_dir):
    vocab, merges = gpt2_files
    with pytest.raises(ValueError, match="no tokenizer.json"):
        tk.build_tokenizer("HuggingFaceTokenizer", str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="is not a tokenizers JSON file"):
        tk.build_tokenizer("HuggingFaceTokenizer", str(tmp_path))
    with pytest.raises(ValueError, match="needs --merge-file"):
        tk.build_tokenizer("GPT2BPETokenizer", vocab_file=vocab)
    with pytest.raises(ValueError, match="takes no --vocab-file"):
        tk.build_tokenizer("Llama2Tokenizer", "x.model", vocab_file=vocab)
    no_eos = tmp_path / "noeos"
    no_eos.mkdir()
    (no_eos / "tokenizer.json").write_text(open(os.path.join(llama3_dir, "tokenizer.json")).read())
    with pytest.raises(ValueError, match="no EOS token"):
        tk.build_tokenizer("HuggingFaceTokenizer", str(no_eos))


def test_preprocess_and_train_with_a_huggingface_tokenizer_and_with_gpt2_bpe(tmp_path, llama3_dir, gpt2_files):
    docs = tmp_path / "docs.jsonl"
    with open(docs, "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": CODE[i % 3] * (1 + i % 5)}) + "\n")
    vocab, merges = gpt2_files
    for name, tok_args in (("hf", ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", llama3_dir]),
                           ("gpt2", ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", vocab,
                                     "--merge-file", merges])):
        prefix = str(tmp_path / name)
        assert preprocess_data.main(["--input", str(docs), "--output-prefix", prefix, *tok_args, "--append-eod"]) == 0
        out = subprocess.run([sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", "1", "-m",
                              "hotswitch.train", "--lr", "1e-3", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads",
                              "4", "--seq-length", "128", "--global-batch-size", "4", "--train-iters", "2",
                              "--no-progress", "--data-path", prefix + "_text_document", *tok_args],
                             cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-3000:]
        assert "summary: 2 steps" in out.stdout
