"""python -m hotswitch.train on Megatron-LM data: a blend of an indexed dataset and a text
directory with a SentencePiece tokenizer, resumed bit for bit; bad data refused before any
rank trains."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sentencepiece")

from hotswitch.cli import preprocess_data  # noqa: E402
from hotswitch.data.tokenizers import train_sentencepiece  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
MODEL = ["--lr", "1e-3", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "128",
         "--global-batch-size", "6", "--global-batch-documents", "--no-progress"]


def _train(nproc, *args, timeout=600):
    return subprocess.run([sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", str(nproc),
                           "-m", "hotswitch.train", *MODEL, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    stdlib = os.path.dirname(json.__file__)
    texts = [open(os.path.join(stdlib, f)).read() for f in sorted(os.listdir(stdlib)) if f.endswith(".py")]
    model = str(root / "tok.model")
    train_sentencepiece(iter(texts), model, vocab_size=400)
    with open(root / "docs.jsonl", "w") as f:
        for t in texts:
            for block in t.split("\n\n\n"):
                f.write(json.dumps({"text": block}) + "\n")
    assert preprocess_data.main(["--input", str(root / "docs.jsonl"), "--output-prefix", str(root / "json"),
                                 "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", model,
                                 "--append-eod"]) == 0
    return root, model


def test_blend_of_indexed_and_text_data_trains_and_resumes_bit_for_bit(data, tmp_path):
    root, model = data
    common = ["--data-path", "0.7", str(root / "json_text_document"), "0.3", os.path.dirname(json.__file__),
              "--split", "90,10", "--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", model,
              "--hot-switch", "--candidate-layouts", "dp2,tp2", "--no-recalibrate",
              "--lr-decay-iters", "3"]  # one learning-rate schedule whatever --train-iters
    full, part, rest, ckpt = (str(tmp_path / n) for n in ("full.json", "part.json", "rest.json", "ckpt"))
    out = _train(2, *common, "--train-iters", "3", "--summary-json", full)
    assert out.returncode == 0, out.stderr[-3000:]
    assert " train, " in out.stdout and "valid, 0 test documents" in out.stdout
    assert "of 18 documents drawn were longer than --seq-length 128" in out.stdout
    out = _train(2, *common, "--train-iters", "2", "--save", ckpt, "--summary-json", part)
    assert out.returncode == 0, out.stderr[-3000:]
    meta = json.load(open(os.path.join(ckpt, "step_00000002", "metadata.json")))
    assert set(meta["data_state"]) == {"seed", "streams"} and meta["extra"]["model"]["vocab_size"] == 512
    out = _train(2, *common, "--train-iters", "3", "--save", ckpt, "--resume", "--summary-json", rest)
    assert out.returncode == 0, out.stderr[-3000:]
    full, part, rest = (json.load(open(p)) for p in (full, part, rest))
    assert part["losses"] == full["losses"][:2] and rest["losses"] == full["losses"][2:]


def _truncated(root, tmp_path):
    for ext in (".bin", ".idx"):
        data = open(str(root / "json_text_document") + ext, "rb").read()
        open(str(tmp_path / "cut") + ext, "wb").write(data[:100] if ext == ".idx" else data)
    return str(tmp_path / "cut")


@pytest.mark.parametrize("case", ["truncated", "weight", "tokenizer", "vocab", "split", "mismatch", "bin"])
def test_bad_data_is_refused_before_training_naming_it(data, tmp_path, case):
    root, model = data
    prefix = str(root / "json_text_document")
    args, needle = {
        "truncated": (["--data-path", _truncated(root, tmp_path)], f"{tmp_path}/cut.idx: truncated: 100 bytes"),
        "weight": (["--data-path", "0", prefix], "--data-path blend weight '0'"),
        "tokenizer": (["--tokenizer-type", "Llama2Tokenizer", "--tokenizer-model", str(root / "docs.jsonl")],
                      f"tokenizer model '{root / 'docs.jsonl'}' is not a SentencePiece model"),
        "vocab": (["--tokenizer-type", "SentencePieceTokenizer", "--tokenizer-model", model, "--vocab-size", "256"],
                  "--vocab-size(256) must hold the SentencePieceTokenizer's 405 tokens"),
        "split": (["--data-path", prefix, "--split", "0,1"], "leaves no training documents"),
        # SentencePiece ids (up to 404) read with the byte tokenizer's vocabulary (384 padded).
        "mismatch": (["--data-path", prefix], "outside the model's vocabulary [0, 384): it was tokenized with "
                                              "another tokenizer than --tokenizer-type ByteTokenizer"),
        "bin": (["--data-path", prefix + ".bin"], f"give its prefix '{prefix}'"),
    }[case]
    out = _train(1, *args, "--train-iters", "1", timeout=300)
    assert out.returncode == 2, (out.returncode, out.stderr[-2000:])
    assert needle in out.stderr, out.stderr[-2000:]
    assert "step 1" not in out.stdout
