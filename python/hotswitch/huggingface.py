"""The Hugging Face LLaMA layout of a model's weights, and its ``config.json``.

hotswitch's tensors (``hotswitch.specs.llama_tensor_set``) map onto Hugging Face's
``LlamaForCausalLM`` names:

    embedding.weight              model.embed_tokens.weight
    layers.N.input_norm.weight    model.layers.N.input_layernorm.weight
    layers.N.qkv.weight           model.layers.N.self_attn.{q,k,v}_proj.weight (rows: q, then k, then v)
    layers.N.proj.weight          model.layers.N.self_attn.o_proj.weight
    layers.N.post_norm.weight     model.layers.N.post_attention_layernorm.weight
    layers.N.gate_up.weight       model.layers.N.mlp.{gate,up}_proj.weight (rows: gate, then up)
    layers.N.down.weight          model.layers.N.mlp.down_proj.weight
    final_norm.weight             model.norm.weight
    head.weight                   lm_head.weight (absent when tie_word_embeddings)

Rotary embeddings: Hugging Face's LLaMA rotates the halves of each head (element ``j`` with
``j + head_dim / 2``, ``rotate_half``); Meta's original checkpoints rotate interleaved pairs
(``2j`` with ``2j + 1``), which is why Hugging Face's conversion script permutes the rows of
``q_proj`` and ``k_proj`` within each head (``permute_rotary`` here). hotswitch's attention
rotates halves too (``hotswitch.model.layers.apply_rotary``), so its q and k rows are Hugging
Face's rows as they are: converting between the two permutes nothing, and a permutation
would change the model. ``permute_rotary`` converts Meta-layout q/k rows for the rare input
that needs it. Query head ``i`` reads key/value head ``i // (heads / kv_heads)`` in both.
"""

import dataclasses
import json
import os
import shutil
from typing import Dict, List, Optional, Tuple

import torch

from hotswitch._checks import read_json_object
from hotswitch.model.config import TransformerConfig

__all__ = ["config_from_hf", "config_from_tensors", "config_to_hf", "from_hf", "load_hf", "permute_rotary",
           "save_hf", "to_hf", "TOKENIZER_FILES"]

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
GENERATION = "generation_config.json"
# The tokenizer files a Hugging Face model directory ships with, copied on export when present.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt")
DEFAULT_SHARD_BYTES = 5 * 10**9  # transformers' "5GB"


def read_safetensors(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """``(name -> tensor, metadata)`` of a safetensors file, through the ``safetensors``
    library (memory-mapped while read); ValueError naming the file for anything it refuses."""
    import safetensors

    try:
        with safetensors.safe_open(path, framework="pt") as f:
            return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata() or {})
    except (safetensors.SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise ValueError(f"{path}: not a readable safetensors file ({type(e).__name__}: {e})") from None


def write_safetensors(tensors: Dict[str, torch.Tensor], path: str, metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes ``tensors`` with the ``safetensors`` library to a temporary file, then renames
    it: a reader never sees half a file."""
    import safetensors
    import safetensors.torch

    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        safetensors.torch.save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, tmp, metadata)
    except (safetensors.SafetensorError, ValueError, TypeError) as e:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise ValueError(f"{path}: cannot write safetensors ({type(e).__name__}: {e})") from None
    os.replace(tmp, path)


def permute_rotary(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of a q or k projection ``[heads * head_dim, hidden]`` from interleaved rotary
    pairs (Meta) to rotated halves (Hugging Face, hotswitch): within each head, rows
    ``0, 2, 4, ...`` then ``1, 3, 5, ...`` (Hugging Face's ``permute`` in its conversion)."""
    rows, hidden = weight.shape
    if heads < 1 or rows % (2 * heads):
        raise ValueError(f"a q/k projection of {rows} rows does not hold {heads} heads of even head_dim")
    return weight.view(heads, rows // heads // 2, 2, hidden).transpose(1, 2).reshape(rows, hidden)


def config_to_hf(config: TransformerConfig) -> dict:
    """``config.json`` of Hugging Face's ``LlamaForCausalLM`` for ``config``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.ffn_hidden_size,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_query_groups,
        "num_hidden_layers": config.num_layers,
        "head_dim": config.head_dim,
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_position_embeddings,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "rope_scaling": config.rope_scaling_dict,
        # transformers 5 names both together; 4.x reads rope_theta and rope_scaling above.
        "rope_parameters": dict(config.rope_scaling_dict or {"rope_type": "default"}, rope_theta=config.rope_theta),
        "tie_word_embeddings": config.tied_embedding,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "torch_dtype": config.dtype,
        "dtype": config.dtype,
    }


def config_from_hf(hf: dict, where: str = "config.json", dtype: Optional[str] = None) -> TransformerConfig:
    """The ``TransformerConfig`` of a Hugging Face LLaMA ``config.json`` (a dict); ValueError
    naming ``where`` and the key for a missing value or a feature hotswitch's model lacks."""
    if hf.get("model_type", "llama") != "llama":
        raise ValueError(f"{where}: model_type {hf.get('model_type')!r} is not 'llama'")
    for key, ok in (("hidden_act", ("silu",)), ("attention_bias", (False,)), ("mlp_bias", (False,))):
        if key in hf and hf[key] not in ok:
            raise ValueError(f"{where}: {key} {hf[key]!r} is not supported (expected {ok[0]!r})")
    missing = [k for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_hidden_layers",
                           "vocab_size", "max_position_embeddings") if k not in hf]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    # transformers 4 writes rope_theta and rope_scaling; 5 writes rope_parameters (theta inside).
    theta = hf.get("rope_theta", 10000.0)
    found = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = hf.get(key)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise ValueError(f"{where}: {key} must be an object or null, got {value!r}")
        value = dict(value)
        theta = value.pop("rope_theta", theta)
        kind = value.get("rope_type", value.get("type"))
        if kind not in ("default", "llama3"):
            raise ValueError(f"{where}: {key}: rope type {kind!r} is not supported (expected 'default' or 'llama3')")
        found[key] = None if kind == "default" else value
    if len(found) == 2 and found["rope_scaling"] != found["rope_parameters"]:
        raise ValueError(f"{where}: rope_scaling {found['rope_scaling']!r} and rope_parameters "
                         f"{found['rope_parameters']!r} disagree")
    scaling = next(iter(found.values()), None)
    heads = hf["num_attention_heads"]
    if "head_dim" in hf and isinstance(heads, int) and heads > 0 and hf["head_dim"] != hf["hidden_size"] // heads:
        raise ValueError(f"{where}: head_dim {hf['head_dim']!r} differs from hidden_size({hf['hidden_size']}) / "
                         f"num_attention_heads({heads}); hotswitch's model needs them equal")
    try:
        return TransformerConfig(
            num_layers=hf["num_hidden_layers"], hidden_size=hf["hidden_size"], num_attention_heads=heads,
            num_query_groups=hf.get("num_key_value_heads") or heads, ffn_hidden_size=hf["intermediate_size"],
            vocab_size=hf["vocab_size"], max_position_embeddings=hf["max_position_embeddings"],
            tied_embedding=bool(hf.get("tie_word_embeddings", False)),
            rope_theta=float(theta), norm_eps=float(hf.get("rms_norm_eps", 1e-6)), rope_scaling=scaling,
            dtype=dtype or hf.get("dtype") or hf.get("torch_dtype") or "float32")
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None


def config_from_tensors(tensors: Dict[str, torch.Tensor], num_attention_heads: int,
                        max_position_embeddings: int, rope_theta: float = 10000.0, norm_eps: float = 1e-5,
                        where: str = "the checkpoint") -> TransformerConfig:
    """The ``TransformerConfig`` of hotswitch's full tensors: the shapes give every size but
    the number of heads and the context length, which the caller names."""
    try:
        vocab, hidden = tensors["embedding.weight"].shape
        layers = 1 + max(int(n.split(".")[1]) for n in tensors if n.startswith("layers."))
        qkv_rows = tensors["layers.0.qkv.weight"].shape[0]
        ffn = tensors["layers.0.gate_up.weight"].shape[0] // 2
    except (KeyError, ValueError, IndexError) as e:
        raise ValueError(f"{where}: not the tensors of hotswitch's LLaMA model ({type(e).__name__}: {e})") from None
    if not isinstance(num_attention_heads, int) or num_attention_heads < 1 or hidden % num_attention_heads:
        raise ValueError(f"{where}: num_attention_heads {num_attention_heads!r} must divide hidden_size({hidden})")
    head_dim = hidden // num_attention_heads
    groups, rest = divmod(qkv_rows - hidden, 2 * head_dim)
    if rest or groups < 1:
        raise ValueError(f"{where}: qkv has {qkv_rows} rows, which no number of kv heads of head_dim {head_dim} "
                         f"(hidden_size({hidden}) / num_attention_heads({num_attention_heads})) gives")
    dtype = str(tensors["embedding.weight"].dtype).replace("torch.", "")
    return TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=num_attention_heads,
                             num_query_groups=groups, ffn_hidden_size=ffn, vocab_size=vocab,
                             max_position_embeddings=max_position_embeddings,
                             tied_embedding="head.weight" not in tensors, rope_theta=rope_theta,
                             norm_eps=norm_eps, dtype=dtype)


def _layer_names(i: int) -> Dict[str, str]:
    p, q = f"layers.{i}.", f"model.layers.{i}."
    return {p + "input_norm.weight": q + "input_layernorm.weight", p + "proj.weight": q + "self_attn.o_proj.weight",
            p + "post_norm.weight": q + "post_attention_layernorm.weight",
            p + "down.weight": q + "mlp.down_proj.weight"}


def to_hf(tensors: Dict[str, torch.Tensor], config: TransformerConfig) -> Dict[str, torch.Tensor]:
    """Hugging Face LLaMA tensors (name -> tensor, the same values) of hotswitch's full
    tensors. ValueError when a tensor is missing or shaped otherwise than ``config`` says."""
    expected = {s.name: list(s.shape) for s in config.tensor_set().specs}
    missing = [n for n in expected if n not in tensors]
    extra = sorted(set(tensors) - set(expected))
    if missing or extra:
        raise ValueError(f"the tensors do not match the model: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, shape in expected.items():
        if list(tensors[name].shape) != shape:
            raise ValueError(f"tensor {name!r} is {list(tensors[name].shape)}, the model's is {shape}")
    q, kv = config.hidden_size, config.num_query_groups * config.head_dim
    f = config.ffn_hidden_size
    out = {"model.embed_tokens.weight": tensors["embedding.weight"]}
    for i in range(config.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        names = _layer_names(i)
        qkv, gate_up = tensors[p + "qkv.weight"], tensors[p + "gate_up.weight"]
        out[names[p + "input_norm.weight"]] = tensors[p + "input_norm.weight"]
        out[h + "self_attn.q_proj.weight"] = qkv[:q]
        out[h + "self_attn.k_proj.weight"] = qkv[q:q + kv]
        out[h + "self_attn.v_proj.weight"] = qkv[q + kv:]
        out[names[p + "proj.weight"]] = tensors[p + "proj.weight"]
        out[names[p + "post_norm.weight"]] = tensors[p + "post_norm.weight"]
        out[h + "mlp.gate_proj.weight"] = gate_up[:f]
        out[h + "mlp.up_proj.weight"] = gate_up[f:]
        out[names[p + "down.weight"]] = tensors[p + "down.weight"]
    out["model.norm.weight"] = tensors["final_norm.weight"]
    if not config.tied_embedding:
        out["lm_head.weight"] = tensors["head.weight"]
    return {k: v.contiguous() for k, v in out.items()}


def from_hf(hf: Dict[str, torch.Tensor], config: TransformerConfig, where: str = "the checkpoint") \
        -> Dict[str, torch.Tensor]:
    """hotswitch's full tensors of Hugging Face LLaMA tensors. ValueError naming ``where`` and
    the tensor when one is missing, unexpected, or shaped otherwise than ``config`` says. A
    tied model's ``lm_head.weight``, when present, must equal the embedding."""
    hf = dict(hf)
    if config.tied_embedding and "lm_head.weight" in hf:
        head = hf.pop("lm_head.weight")
        if not torch.equal(head, hf.get("model.embed_tokens.weight", head)):
            raise ValueError(f"{where}: tie_word_embeddings is true but lm_head.weight differs from "
                             "model.embed_tokens.weight")
    for k in [k for k in hf if k.endswith("self_attn.rotary_emb.inv_freq")]:
        hf.pop(k)  # a buffer that old exports carry; recomputed from rope_theta

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise ValueError(f"{where}: no tensor {name!r}")
        return hf.pop(name)

    out = {"embedding.weight": take("model.embed_tokens.weight")}
    for i in range(config.num_layers):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        names = _layer_names(i)
        out[p + "input_norm.weight"] = take(names[p + "input_norm.weight"])
        out[p + "qkv.weight"] = torch.cat([take(h + f"self_attn.{x}_proj.weight") for x in "qkv"])
        out[p + "proj.weight"] = take(names[p + "proj.weight"])
        out[p + "post_norm.weight"] = take(names[p + "post_norm.weight"])
        out[p + "gate_up.weight"] = torch.cat([take(h + "mlp.gate_proj.weight"), take(h + "mlp.up_proj.weight")])
        out[p + "down.weight"] = take(names[p + "down.weight"])
    out["final_norm.weight"] = take("model.norm.weight")
    if not config.tied_embedding:
        out["head.weight"] = take("lm_head.weight")
    if hf:
        raise ValueError(f"{where}: tensors the model lacks: {sorted(hf)[:5]}")
    for spec in config.tensor_set().specs:
        if list(out[spec.name].shape) != list(spec.shape):
            raise ValueError(f"{where}: {spec.name} would be {list(out[spec.name].shape)}, the model of its config "
                             f"needs {list(spec.shape)}")
    return out


def read_hf_config(directory: str, dtype: Optional[str] = None) -> Tuple[TransformerConfig, dict]:
    """``(TransformerConfig, the raw dict)`` of ``directory/config.json``."""
    path = os.path.join(directory, "config.json")
    raw = read_json_object(path, "Hugging Face config")
    return config_from_hf(raw, path, dtype), raw


def write_hf_config(directory: str, config: TransformerConfig) -> str:
    path = os.path.join(directory, "config.json")
    with open(path, "w") as f:
        json.dump(config_to_hf(config), f, indent=2)
        f.write("\n")
    return path


def load_hf(directory: str, dtype: Optional[str] = None) -> Tuple[Dict[str, torch.Tensor], TransformerConfig]:
    """hotswitch's full tensors and model config of a Hugging Face LLaMA directory:
    ``config.json`` and ``model.safetensors`` or the shards that ``model.safetensors.index.json``
    names. ``dtype`` casts the tensors (default: as stored). ValueError naming the file and
    the tensor for anything missing, malformed or unsupported."""
    if not os.path.isdir(directory):
        raise ValueError(f"Hugging Face model directory {directory!r} does not exist")
    index = os.path.join(directory, INDEX)
    single = os.path.join(directory, WEIGHTS)
    if os.path.exists(index):
        weight_map = read_json_object(index, "safetensors index").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise ValueError(f"{index}: weight_map must map tensor names to file names")
        files = sorted(set(weight_map.values()))
    elif os.path.exists(single):
        weight_map, files = None, [WEIGHTS]
    else:
        raise ValueError(f"{directory}: no {WEIGHTS} or {INDEX} (only safetensors weights are read)")
    hf: Dict[str, torch.Tensor] = {}
    for name in files:
        path = os.path.join(directory, name)
        tensors, _ = read_safetensors(path)
        for k, v in tensors.items():
            if k in hf:
                raise ValueError(f"{path}: tensor {k!r} is also in another shard")
            if weight_map is not None and weight_map.get(k) != name:
                raise ValueError(f"{path}: tensor {k!r} is not where {INDEX} puts it ({weight_map.get(k)!r})")
            hf[k] = v
    if dtype is None:
        dtypes = {str(t.dtype).replace("torch.", "") for t in hf.values()}
        if len(dtypes) != 1:
            raise ValueError(f"{directory}: tensors of several dtypes {sorted(dtypes)}; pass a dtype to cast them")
        dtype = dtypes.pop()
    config, _ = read_hf_config(directory, dtype)
    target = getattr(torch, config.dtype)
    tensors = from_hf(hf, config, where=directory)
    return {k: v.to(target) for k, v in tensors.items()}, config


def _shards(hf: Dict[str, torch.Tensor], max_shard_bytes: int) -> List[Dict[str, torch.Tensor]]:
    """The tensors in order, cut into shards of at most ``max_shard_bytes`` (a larger tensor
    gets a shard of its own), as ``transformers``' ``save_pretrained`` cuts them."""
    shards: List[Dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in hf.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    return shards


def save_hf(directory: str, tensors: Dict[str, torch.Tensor], config: TransformerConfig,
            max_shard_bytes: int = DEFAULT_SHARD_BYTES, vocab_size: Optional[int] = None,
            tokenizer: Optional[str] = None) -> list:
    """Writes a Hugging Face LLaMA model directory of hotswitch's full tensors, as
    ``save_pretrained`` does: ``config.json``, ``generation_config.json`` and the weights in
    safetensors (metadata ``{"format": "pt"}``): one ``model.safetensors``, or shards
    ``model-0000K-of-0000N.safetensors`` of at most ``max_shard_bytes`` each with
    ``model.safetensors.index.json``. ``vocab_size``: the tokenizer's own vocabulary, when the
    model's is padded (Megatron's ``--make-vocab-size-divisible-by``): the embedding and head
    rows beyond it are dropped. ``tokenizer``: a directory (or one file) whose tokenizer files
    (``TOKENIZER_FILES``) are copied alongside. Returns the paths written."""
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes < 1:
        raise ValueError(f"max_shard_bytes must be a positive int, got {max_shard_bytes!r}")
    if vocab_size is not None and (isinstance(vocab_size, bool) or not isinstance(vocab_size, int)
                                   or not 1 <= vocab_size <= config.vocab_size):
        raise ValueError(f"vocab_size must be an int in [1, {config.vocab_size}] (the model's padded vocabulary), "
                         f"got {vocab_size!r}")
    sources = []
    if tokenizer is not None:
        if os.path.isdir(tokenizer):
            sources = [os.path.join(tokenizer, n) for n in TOKENIZER_FILES
                       if os.path.isfile(os.path.join(tokenizer, n))]
        elif os.path.isfile(tokenizer):
            sources = [tokenizer]
        if not sources:
            raise ValueError(f"tokenizer {tokenizer!r} holds none of {', '.join(TOKENIZER_FILES)}")
    hf = to_hf(tensors, config)
    if vocab_size is not None and vocab_size < config.vocab_size:
        for name in ("model.embed_tokens.weight", "lm_head.weight"):
            if name in hf:
                hf[name] = hf[name][:vocab_size]
        config = dataclasses.replace(config, vocab_size=vocab_size)
    os.makedirs(directory, exist_ok=True)
    shards = _shards(hf, max_shard_bytes)
    written = [write_hf_config(directory, config)]
    generation = os.path.join(directory, GENERATION)
    with open(generation, "w") as f:
        json.dump({"_from_model_config": True}, f, indent=2)
        f.write("\n")
    written.append(generation)
    if len(shards) == 1:
        names = [WEIGHTS]
    else:
        names = [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    for name, shard in zip(names, shards):
        path = os.path.join(directory, name)
        write_safetensors(shard, path, metadata={"format": "pt"})
        written.append(path)
    stale = [n for n in os.listdir(directory) if n.endswith(".safetensors") and n not in names] + \
        ([INDEX] if len(shards) == 1 and os.path.exists(os.path.join(directory, INDEX)) else [])
    for n in stale:  # an earlier export's shards would mix with these
        os.remove(os.path.join(directory, n))
    if len(shards) > 1:
        index = os.path.join(directory, INDEX)
        total = sum(t.numel() * t.element_size() for t in hf.values())
        with open(index + ".tmp", "w") as f:
            json.dump({"metadata": {"total_size": total},
                       "weight_map": {k: n for n, shard in zip(names, shards) for k in shard}}, f, indent=2)
            f.write("\n")
        os.replace(index + ".tmp", index)
        written.append(index)
    for src in sources:
        dst = os.path.join(directory, os.path.basename(src))
        shutil.copyfile(src, dst)
        written.append(dst)
    return written
