"""Against the real Hugging Face ``transformers`` ``LlamaForCausalLM``, LLaMA-2 style (one
K/V head per query head, no rope scaling) and LLaMA-3 style (grouped K/V heads, theta 500000,
LLaMA 3.1's rope scaling): a model saved by ``save_pretrained`` and imported by us computes
HF's losses, sequence by sequence, within 1e-5 in fp32; our export loads in HF and computes
ours; sharded exports, bf16 exports, the padded vocabulary and the tokenizer files; training
after a round trip equals training without it bit for bit."""

import copy
import json
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

safetensors_torch = pytest.importorskip("safetensors.torch")
transformers = pytest.importorskip("transformers")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from hotswitch import huggingface as hf  # noqa: E402
from hotswitch.checkpoint import read_tensors  # noqa: E402
from hotswitch.cli import convert  # noqa: E402
from hotswitch.model.config import TransformerConfig  # noqa: E402
from hotswitch.model.layers import llama3_frequencies  # noqa: E402
from hotswitch.testing.harness import run_world  # noqa: E402
from tests.python.checkpoint import convert_workers as w  # noqa: E402

BASE = dict(hidden_size=32, intermediate_size=64, num_attention_heads=4, num_hidden_layers=2, vocab_size=128,
            max_position_embeddings=256, rms_norm_eps=1e-5, hidden_act="silu")
# original_max_position_embeddings 200 puts one of head_dim 8's four frequencies (wavelength
# 167) in the blended band, one below it and two beyond: every branch of the scaling is used.
LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 200}
STYLES = {
    "llama2": dict(BASE, num_key_value_heads=4, rope_theta=10000.0, tie_word_embeddings=False),
    "llama3": dict(BASE, num_key_value_heads=2, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
                   tie_word_embeddings=False),
    "llama3-tied": dict(BASE, num_key_value_heads=2, rope_theta=500000.0, rope_scaling=LLAMA3_SCALING,
                        tie_word_embeddings=True),
}


def _hf_model(style, seed=3):
    """A random ``LlamaForCausalLM`` whose weights are large enough for attention to matter."""
    torch.manual_seed(seed)
    # transformers completes a rope_scaling dict in place: hand it a copy.
    model = LlamaForCausalLM(LlamaConfig(**copy.deepcopy(STYLES[style]), attn_implementation="eager")).float().eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _hf_losses(model, sequences):
    """HF's mean next-token cross entropy of each sequence on its own, float64 sums."""
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq])
            logits = model(input_ids=ids).logits[0]
            out.append(float(F.cross_entropy(logits[:-1].double(), ids[0, 1:])))
    return out


def _batch_loss(singles, sequences):
    return sum(l * (len(s) - 1) for l, s in zip(singles, sequences)) / sum(len(s) - 1 for s in sequences)


def _close(a, b, rtol=1e-5):
    assert np.allclose(a, b, rtol=rtol, atol=0), (a, b)


@pytest.mark.parametrize("style", list(STYLES))
def test_a_model_saved_by_transformers_computes_the_same_losses_in_ours(tmp_path, style):
    model = _hf_model(style)
    src = str(tmp_path / "hf")
    model.save_pretrained(src)
    assert convert.main(["--load", src, "--save", str(tmp_path / "ckpt")]) == 0
    config = TransformerConfig(**read_tensors(str(tmp_path / "ckpt"))[1]["extra"]["model"])
    assert config.rope_theta == STYLES[style]["rope_theta"]
    assert config.rope_scaling_dict == STYLES[style].get("rope_scaling")
    assert config.num_query_groups == STYLES[style]["num_key_value_heads"]
    singles, losses, _ = run_world(1, w.evaluate_and_train, str(tmp_path / "ckpt"), timeout=300)[0]
    reference = _hf_losses(model, w.BATCHES[0])
    _close(singles, reference)
    _close(losses[0], _batch_loss(reference, w.BATCHES[0]))


@pytest.mark.parametrize("style", ["llama2", "llama3"])
def test_our_export_loads_in_transformers_and_computes_our_losses(tmp_path, style):
    model = _hf_model(style)
    src, ckpt, out = str(tmp_path / "hf"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    model.save_pretrained(src)
    assert convert.main(["--load", src, "--save", ckpt]) == 0
    # Shards of at most 20 kB: the 2-layer model spans several files and an index.
    assert convert.main(["--load", ckpt, "--save", out, "--max-shard-size", "20KB"]) == 0
    files = sorted(os.listdir(out))
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 1 and "model.safetensors.index.json" in files and "generation_config.json" in files
    with open(os.path.join(out, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    assert sorted(set(weight_map.values())) == shards
    assert all(set(safetensors_torch.load_file(os.path.join(out, n))) == {k for k, v in weight_map.items() if v == n}
               for n in shards)
    loaded = LlamaForCausalLM.from_pretrained(out, attn_implementation="eager").float().eval()
    ours = dict(loaded.state_dict())
    theirs = dict(model.state_dict())
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    singles, _, _ = run_world(1, w.evaluate_and_train, ckpt, timeout=300)[0]
    _close(_hf_losses(loaded, w.BATCHES[0]), singles)


def test_bf16_export_and_padded_vocabulary_and_tokenizer_files(tmp_path):
    model = _hf_model("llama3")
    src, ckpt, out = str(tmp_path / "hf"), str(tmp_path / "ckpt"), str(tmp_path / "out")
    model.save_pretrained(src)
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json").write_text('{"version": "1.0"}')
    (tok / "tokenizer_config.json").write_text("{}")
    assert convert.main(["--load", src, "--save", ckpt]) == 0
    assert convert.main(["--load", ckpt, "--save", out, "--dtype", "bfloat16", "--vocab-size", "120",
                         "--tokenizer-model", str(tok)]) == 0
    assert {"tokenizer.json", "tokenizer_config.json"} <= set(os.listdir(out))
    with open(os.path.join(out, "config.json")) as f:
        written = json.load(f)
    assert written["vocab_size"] == 120 and written["torch_dtype"] == "bfloat16"
    loaded = LlamaForCausalLM.from_pretrained(out)
    state = loaded.state_dict()
    assert state["model.embed_tokens.weight"].dtype == torch.bfloat16
    assert torch.equal(state["model.embed_tokens.weight"],
                       model.state_dict()["model.embed_tokens.weight"][:120].bfloat16())
    assert torch.equal(state["lm_head.weight"], model.state_dict()["lm_head.weight"][:120].bfloat16())


def test_training_after_a_round_trip_through_transformers_is_bitwise_the_same(tmp_path):
    model = _hf_model("llama3")
    src, ckpt, out, back = (str(tmp_path / n) for n in ("hf", "ckpt", "out", "back"))
    model.save_pretrained(src)
    assert convert.main(["--load", src, "--save", ckpt]) == 0
    assert convert.main(["--load", ckpt, "--save", out]) == 0
    # transformers reads our files and writes them again; we import what it wrote.
    LlamaForCausalLM.from_pretrained(out, attn_implementation="eager").save_pretrained(str(tmp_path / "again"))
    assert convert.main(["--load", str(tmp_path / "again"), "--save", back]) == 0
    a = run_world(1, w.evaluate_and_train, ckpt, timeout=300)[0]
    b = run_world(1, w.evaluate_and_train, back, timeout=300)[0]
    assert a[0] == b[0] and a[1] == b[1]
    assert all(np.array_equal(a[2][k], b[2][k]) for k in a[2])


def test_llama3_frequencies_equal_transformers_rope_init():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = LlamaConfig(**copy.deepcopy(STYLES["llama3"]))
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    head_dim = BASE["hidden_size"] // BASE["num_attention_heads"]
    base = 1.0 / (500000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ours = llama3_frequencies(base, LLAMA3_SCALING)
    assert torch.equal(ours, theirs.float()), (ours, theirs)
    assert not torch.equal(ours, base)


@pytest.mark.parametrize("change, needle", [
    ({"model_type": "mistral"}, "model_type 'mistral' is not 'llama'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not supported"),
    ({"rope_scaling": LLAMA3_SCALING, "rope_parameters": {"rope_type": "default"}}, "disagree"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}}, "rope type 'dynamic'"),
    ({"rope_scaling": dict(LLAMA3_SCALING, high_freq_factor=0.5)}, "high_freq_factor(0.5) must exceed"),
])
def test_unsupported_architectures_and_rope_types_are_refused_naming_the_file(tmp_path, change, needle):
    config = hf.config_to_hf(TransformerConfig(**w.CONFIG))
    config.pop("rope_parameters")
    config.update(change)
    with pytest.raises(ValueError) as e:
        hf.config_from_hf(config, "dir/config.json")
    assert needle in str(e.value) and "dir/config.json" in str(e.value), str(e.value)


def test_a_broken_safetensors_file_is_refused_naming_it(tmp_path):
    out = str(tmp_path / "hf")
    hf.save_hf(out, {s.name: torch.zeros(list(s.shape)) for s in TransformerConfig(**w.CONFIG).tensor_set().specs},
               TransformerConfig(**w.CONFIG))
    path = os.path.join(out, "model.safetensors")
    with open(path, "r+b") as f:
        f.truncate(100)
    with pytest.raises(ValueError, match="model.safetensors: not a readable safetensors file"):
        hf.load_hf(out)
