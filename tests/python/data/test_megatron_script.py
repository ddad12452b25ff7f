"""examples/megatron_llama2.sh, a Megatron-LM LLaMA-2 pretraining script, run unchanged but
for its launcher line: under hotswitch's launcher it trains, logs Megatron's lines and
TensorBoard scalars, saves where it was told, and each step holds Megatron's
``global_batch_size x seq_length`` tokens."""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("sentencepiece")

# The SentencePiece-tokenized indexed dataset of the Megatron data tests.
from tests.python.data.test_train_data import data  # noqa: E402,F401

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SCRIPT = os.path.join(ROOT, "examples", "megatron_llama2.sh")


def test_the_megatron_llama2_script_runs_with_only_its_launcher_changed(data, tmp_path):
    root, model = data
    ckpt, tb, summary = tmp_path / "ckpt", tmp_path / "tb", tmp_path / "summary.json"
    launch = f"{sys.executable} -m hotswitch.launch --nproc-per-node 2 -m hotswitch.train"
    out = subprocess.run(["bash", SCRIPT, str(ckpt), str(tb), model, str(root / "json_text_document"),
                          "--no-progress", "--summary-json", str(summary)], cwd=ROOT,
                         env={**os.environ, "LAUNCH": launch}, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    s = json.load(open(summary))
    assert s["steps"] == 3 and s["world"] == 2
    # Megatron-LM's step: global_batch_size(4) x seq_length(128) tokens, exactly.
    assert s["tokens"] == 3 * 4 * 128, s
    assert os.listdir(ckpt) and os.listdir(tb)
    # --save X --load X on the first run: nothing to load yet, so it starts afresh, saying so.
    assert "(the --save folder) holds no checkpoint yet" in out.stderr
    # Megatron-LM's arguments this model has no use for are named as ignored, not refused.
    assert "ignoring Megatron-LM's --use-flash-attn" in out.stderr


def test_the_script_without_its_paths_says_what_it_needs():
    out = subprocess.run(["bash", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "usage:" in out.stderr and "DATA_PREFIX" in out.stderr
