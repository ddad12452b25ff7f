"""A Hugging Face LLaMA-3.1 fine-tuning start as a Megatron-LM user runs it: a model written by
``save_pretrained`` with its ``tokenizer.json``, imported by ``hotswitch.convert``, data
tokenized with ``--tokenizer-type HuggingFaceTokenizer``, two steps of ``hotswitch.train
--load ... --finetune --use-rope-scaling`` on 2 ranks, and the result exported and loaded
back by ``transformers``."""

import copy
import json
import os
import subprocess
import sys

import pytest
import torch

tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from tokenizers import decoders, models, pre_tokenizers, processors, trainers  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from hotswitch.cli import convert, preprocess_data  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
TEXT = ["def f(x):\n    return x + 1\n", "import os\nprint(os.getcwd())\n", "for i in range(10):\n\tprint(i)\n"]
# Megatron-LM's --use-rope-scaling is LLaMA 3.1's scaling with these factors.
SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 8192}
HF = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
          vocab_size=384, max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=500000.0,
          rope_scaling=SCALING, tie_word_embeddings=False, hidden_act="silu")
# The same model in Megatron-LM's arguments.
MODEL = ["--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4",
         "--group-query-attention", "--num-query-groups", "2", "--seq-length", "128",
         "--max-position-embeddings", "256", "--rotary-base", "500000", "--use-rope-scaling",
         "--norm-epsilon", "1e-5", "--untie-embeddings-and-output-weights", "--make-vocab-size-divisible-by", "128"]


def _tokenizer(path):
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<|begin_of_text|>", "<|end_of_text|>"]
    tok.train_from_iterator(TEXT * 8, trainers.BpeTrainer(vocab_size=300, special_tokens=special,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                                       special_tokens=[("<|begin_of_text|>", bos)])
    tok.save(os.path.join(path, "tokenizer.json"))
    with open(os.path.join(path, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>",
                   "eos_token": "<|end_of_text|>"}, f)
    return tok.get_vocab_size()


def test_a_huggingface_llama31_model_fine_tunes_and_goes_back(tmp_path):
    hf_dir, ckpt, tuned, back = (str(tmp_path / n) for n in ("hf", "from_hf", "tuned", "back"))
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**copy.deepcopy(HF)))
    model.save_pretrained(hf_dir)
    vocab = _tokenizer(hf_dir)
    assert vocab <= HF["vocab_size"]
    assert convert.main(["--load", hf_dir, "--save", ckpt, "--dtype", "float32"]) == 0
    docs = tmp_path / "docs.jsonl"
    with open(docs, "w") as f:
        for i in range(40):
            f.write(json.dumps({"text": TEXT[i % 3] * (1 + i % 5)}) + "\n")
    prefix = str(tmp_path / "docs")
    tok_args = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", hf_dir]
    assert preprocess_data.main(["--input", str(docs), "--output-prefix", prefix, *tok_args, "--append-eod"]) == 0
    out = subprocess.run([sys.executable, "-m", "hotswitch.launch", "--nproc-per-node", "2", "-m", "hotswitch.train",
                          *MODEL, *tok_args, "--data-path", prefix + "_text_document", "--lr", "1e-4",
                          "--global-batch-size", "4", "--train-iters", "2", "--load", ckpt, "--finetune",
                          "--save", tuned, "--no-progress", "--tensor-model-parallel-size", "2"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "at step 0" in out.stdout and "summary: 2 steps on 2 ranks" in out.stdout
    steps = sorted(d for d in os.listdir(tuned) if d.startswith("step_"))
    assert convert.main(["--load", os.path.join(tuned, steps[-1]), "--save", back, "--vocab-size", str(vocab),
                         "--tokenizer-model", hf_dir]) == 0
    again = LlamaForCausalLM.from_pretrained(back)
    assert again.config.rope_scaling["rope_type"] == "llama3" and again.config.rope_scaling["factor"] == 8.0
    assert again.config.vocab_size == vocab and os.path.exists(os.path.join(back, "tokenizer.json"))
    with torch.no_grad():
        changed = [n for n, p in again.named_parameters()
                   if not torch.equal(p, dict(model.named_parameters())[n][:p.shape[0]])]
    assert changed, "fine-tuning changed no weight"
