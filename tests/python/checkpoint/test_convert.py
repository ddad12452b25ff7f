"""Conversion to and from the Hugging Face LLaMA layout: names and config, the rotary layout
checked against a Hugging Face-convention forward written here, a bitwise round trip
through ``python -m hotswitch.convert``, and training from the round trip equal to training
without it."""

import dataclasses
import json
import math
import os
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.python.checkpoint import convert_workers as w
from hotswitch import huggingface as hf
from hotswitch.checkpoint import read_tensors
from hotswitch.cli import convert
from hotswitch.model.config import TransformerConfig
from hotswitch.model.layers import apply_rotary, rotary_tables
from hotswitch.testing.harness import run_world


def _random_tensors(config, seed=0):
    g = torch.Generator().manual_seed(seed)
    return {s.name: torch.randn(list(s.shape), generator=g) for s in config.tensor_set().specs}


@pytest.mark.parametrize("tied", [False, True])
def test_names_and_config_round_trip_bitwise(tied):
    config = TransformerConfig(**w.CONFIG, tied_embedding=tied)
    ours = _random_tensors(config)
    theirs = hf.to_hf(ours, config)
    assert ("lm_head.weight" in theirs) == (not tied)
    q, kv = config.hidden_size, config.num_query_groups * config.head_dim
    assert theirs["model.layers.1.self_attn.k_proj.weight"].shape == (kv, config.hidden_size)
    assert torch.equal(theirs["model.layers.1.self_attn.v_proj.weight"], ours["layers.1.qkv.weight"][q + kv:])
    assert torch.equal(theirs["model.layers.0.mlp.up_proj.weight"], ours["layers.0.gate_up.weight"][64:])
    back = hf.from_hf(theirs, hf.config_from_hf(hf.config_to_hf(config)))
    assert back.keys() == ours.keys() and all(torch.equal(back[k], ours[k]) for k in ours)
    assert hf.config_from_hf(json.loads(json.dumps(hf.config_to_hf(config)))) == config
    assert hf.config_from_tensors(ours, 4, 64, 500.0, 1e-6) == config


def test_permute_rotary_turns_interleaved_pairs_into_our_rotated_halves():
    heads, head_dim, hidden, T = 2, 8, 16, 5
    g = torch.Generator().manual_seed(1)
    wq, wk, x = torch.randn(heads * head_dim, hidden, generator=g), torch.randn(heads * head_dim, hidden,
                                                                               generator=g), torch.randn(T, hidden,
                                                                                                         generator=g)
    cos, sin = rotary_tables(torch.arange(T), head_dim, 10000.0, torch.float32)

    def interleaved(v):  # Meta's layout: pairs (2j, 2j + 1) rotate by angle j
        v = v.view(T, heads, head_dim // 2, 2)
        a, b = v[..., 0], v[..., 1]
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.stack((a * c - b * s, a * s + b * c), -1).reshape(T, heads, head_dim)

    meta = torch.einsum("thd,shd->hts", interleaved(x @ wq.T), interleaved(x @ wk.T))
    ours = torch.einsum("thd,shd->hts", apply_rotary((x @ hf.permute_rotary(wq, heads).T).view(T, heads, head_dim),
                                                     cos, sin),
                        apply_rotary((x @ hf.permute_rotary(wk, heads).T).view(T, heads, head_dim), cos, sin))
    assert torch.allclose(meta, ours, atol=1e-5)
    unpermuted = torch.einsum("thd,shd->hts", apply_rotary((x @ wq.T).view(T, heads, head_dim), cos, sin),
                              apply_rotary((x @ wk.T).view(T, heads, head_dim), cos, sin))
    assert not torch.allclose(meta, unpermuted, atol=1e-2)


def _read_safetensors(path):
    """float32 tensors of a safetensors file, read from the specification alone."""
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    out = {}
    for name, e in json.loads(raw[8:8 + n]).items():
        if name != "__metadata__":
            assert e["dtype"] == "F32"
            a, b = e["data_offsets"]
            out[name] = torch.from_numpy(np.frombuffer(raw[8 + n + a:8 + n + b], dtype="<f4").copy()).view(e["shape"])
    return out


def hf_reference_loss(directory, sequences, permute=False):
    """Mean next-token cross-entropy of a Hugging Face LLaMA directory, computed in float64
    the way Hugging Face's modeling_llama computes it (rotate_half, repeat_kv, RMSNorm)."""
    c = json.load(open(os.path.join(directory, "config.json")))
    W = {k: v.double() for k, v in _read_safetensors(os.path.join(directory, "model.safetensors")).items()}
    H, nh, nkv, eps = c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], c["rms_norm_eps"]
    hd = H // nh
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def rotate_half(x):
        return torch.cat((-x[..., hd // 2:], x[..., :hd // 2]), -1)

    total, count = 0.0, 0
    for seq in sequences:
        ids = torch.tensor(seq)
        T = len(seq)
        freqs = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None]
        cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
        x = W["model.embed_tokens.weight"][ids]
        for layer in range(c["num_hidden_layers"]):
            p = f"model.layers.{layer}."
            h = rms(x, W[p + "input_layernorm.weight"])
            wq, wk = W[p + "self_attn.q_proj.weight"], W[p + "self_attn.k_proj.weight"]
            if permute:  # what a Meta-to-Hugging Face permutation would do to these rows
                wq, wk = hf.permute_rotary(wq, nh), hf.permute_rotary(wk, nkv)
            q = (h @ wq.T).view(T, nh, hd).transpose(0, 1)
            k = (h @ wk.T).view(T, nkv, hd).transpose(0, 1)
            v = (h @ W[p + "self_attn.v_proj.weight"].T).view(T, nkv, hd).transpose(0, 1)
            q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
            k, v = k.repeat_interleave(nh // nkv, 0), v.repeat_interleave(nh // nkv, 0)  # repeat_kv
            scores = q @ k.transpose(1, 2) / math.sqrt(hd)
            scores = scores.masked_fill(torch.triu(torch.ones(T, T, dtype=torch.bool), 1), float("-inf"))
            o = (scores.softmax(-1) @ v).transpose(0, 1).reshape(T, H)
            x = x + o @ W[p + "self_attn.o_proj.weight"].T
            h = rms(x, W[p + "post_attention_layernorm.weight"])
            x = x + (F.silu(h @ W[p + "mlp.gate_proj.weight"].T) * (h @ W[p + "mlp.up_proj.weight"].T)) \
                @ W[p + "mlp.down_proj.weight"].T
        head = W.get("lm_head.weight", W["model.embed_tokens.weight"])
        logits = rms(x, W["model.norm.weight"]) @ head.T
        total += float(F.cross_entropy(logits[:-1], ids[1:], reduction="sum"))
        count += T - 1
    return total / count


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_through_hugging_face_is_bitwise_and_trains_the_same(tmp_path, tied):
    original = run_world(1, w.save_initial, str(tmp_path / "ckpt"), tied, timeout=300)[0]
    out, back = str(tmp_path / "hf"), str(tmp_path / "back")
    assert convert.main(["--load", original, "--save", out]) == 0
    assert sorted(os.listdir(out)) == ["config.json", "generation_config.json", "model.safetensors"]
    assert convert.main(["--load", out, "--save", back]) == 0
    a, meta = read_tensors(original)
    b, _ = read_tensors(back)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    config = TransformerConfig(**meta["extra"]["model"])
    assert hf.load_hf(out)[1] == config

    losses, weights = run_world(1, w.train_from, original, tied, timeout=300)[0]
    losses_rt, weights_rt = run_world(1, w.train_from, os.path.join(back, "step_00000000"), tied, timeout=300)[0]
    assert losses_rt == losses  # bit for bit
    assert all(np.array_equal(weights[k], weights_rt[k]) for k in weights)
    if not tied:  # a weights-only checkpoint loads under another layout and world too
        losses_tp, _ = run_world(2, w.train_from, back, tied, "tp2", timeout=300)[0]
        assert np.allclose(losses_tp, losses, rtol=1e-5, atol=0)


def test_our_model_computes_what_hugging_face_computes_from_the_same_files(tmp_path):
    # Weights large enough for attention to matter (the initial ones attend almost uniformly).
    config = TransformerConfig(**w.CONFIG)
    g = torch.Generator().manual_seed(5)
    tensors = {s.name: (1 + 0.1 * torch.randn(list(s.shape), generator=g)) if s.name.endswith("norm.weight")
               else 0.3 * torch.randn(list(s.shape), generator=g) for s in config.tensor_set().specs}
    out = str(tmp_path / "hf")
    hf.save_hf(out, tensors, config)
    assert convert.main(["--load", out, "--save", str(tmp_path / "ckpt")]) == 0
    losses, _ = run_world(1, w.train_from, str(tmp_path / "ckpt"), False, timeout=300)[0]
    reference = hf_reference_loss(out, w.BATCHES[0])
    assert abs(reference - losses[0]) <= 1e-5 * reference, (reference, losses[0])
    # q/k rows permuted as for Meta's interleaved rotary give another model: the test can tell.
    assert abs(hf_reference_loss(out, w.BATCHES[0], permute=True) - reference) > 1e-3 * reference


def test_bf16_export_and_import_cast_exactly(tmp_path):
    config = TransformerConfig(**w.CONFIG)
    tensors = _random_tensors(config, seed=3)
    hf.save_hf(str(tmp_path / "hf"), {k: v.bfloat16() for k, v in tensors.items()},
               dataclasses.replace(config, dtype="bfloat16"))
    loaded, cfg = hf.load_hf(str(tmp_path / "hf"))
    assert cfg.dtype == "bfloat16" and all(torch.equal(loaded[k], tensors[k].bfloat16()) for k in tensors)
    as_f32, cfg32 = hf.load_hf(str(tmp_path / "hf"), "float32")
    assert cfg32.dtype == "float32" and all(torch.equal(as_f32[k], tensors[k].bfloat16().float()) for k in tensors)


def _hf_dir(tmp_path, **config_changes):
    config = TransformerConfig(**w.CONFIG)
    d = str(tmp_path / "hf")
    hf.save_hf(d, _random_tensors(config), config)
    if config_changes:
        c = json.load(open(os.path.join(d, "config.json")))
        c.update(config_changes)
        json.dump(c, open(os.path.join(d, "config.json"), "w"))
    return d


@pytest.mark.parametrize("setup,needle", [
    (lambda d: None, None),
    (lambda d: os.remove(os.path.join(d, "model.safetensors")), "no model.safetensors"),
    (lambda d: open(os.path.join(d, "model.safetensors"), "r+b").truncate(1000), "model.safetensors"),
    (lambda d: json.dump({**json.load(open(os.path.join(d, "config.json"))), "rope_scaling": {"type": "yarn"}},
                         open(os.path.join(d, "config.json"), "w")), "rope_scaling: rope type 'yarn'"),
    (lambda d: json.dump({**json.load(open(os.path.join(d, "config.json"))), "num_hidden_layers": 3},
                         open(os.path.join(d, "config.json"), "w")), "no tensor 'model.layers.2"),
    (lambda d: json.dump({**json.load(open(os.path.join(d, "config.json"))), "num_key_value_heads": 4},
                         open(os.path.join(d, "config.json"), "w")), "layers.0.qkv.weight would be [64, 32]"),
])
def test_bad_hugging_face_models_are_refused_naming_the_file(tmp_path, capsys, setup, needle):
    d = _hf_dir(tmp_path)
    setup(d)
    args = ["--load", d, "--save", str(tmp_path / "out")]
    if needle is None:
        assert convert.main(args) == 0
        return
    with pytest.raises(SystemExit) as e:
        convert.main(args)
    err = capsys.readouterr().err
    assert e.value.code == 2 and needle in err and str(tmp_path) in err, err


def test_a_checkpoint_without_its_config_needs_the_model_arguments(tmp_path, capsys):
    from hotswitch.checkpoint import write_tensors
    config = TransformerConfig(**w.CONFIG)
    path = write_tensors(str(tmp_path / "ckpt"), _random_tensors(config))
    with pytest.raises(SystemExit):
        convert.main(["--load", path, "--save", str(tmp_path / "hf")])
    assert "does not record its model config: give --num-attention-heads" in capsys.readouterr().err
    assert convert.main(["--load", path, "--save", str(tmp_path / "hf"), "--num-attention-heads", "4",
                         "--max-position-embeddings", "64", "--rotary-base", "500", "--norm-epsilon", "1e-6"]) == 0
    assert hf.load_hf(str(tmp_path / "hf"))[1] == config
    with pytest.raises(SystemExit):
        convert.main(["--load", str(tmp_path), "--save", str(tmp_path / "x")])
    assert "holds neither config.json" in capsys.readouterr().err
