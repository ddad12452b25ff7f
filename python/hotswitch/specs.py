"""Tensor sets of common models, and local shards cut from full tensors."""

from typing import Dict, Optional, Union

import torch

from hotswitch import _C

__all__ = ["llama_tensor_set", "shard_tensors"]


def llama_tensor_set(
    num_layers: int = 32,
    hidden_size: int = 4096,
    ffn_hidden_size: int = 11008,
    num_attention_heads: int = 32,
    num_query_groups: int = 32,
    vocab_size: int = 32000,
    tied_embedding: bool = False,
    dtype: str = "bfloat16",
    matrix_dtype: Optional[str] = None,
) -> "_C.TensorSet":
    """The parameters of a LLaMA-style decoder with Megatron's sharding rules.

    Per layer: input norm (replicated), fused QKV ``[(heads + 2 * groups) * head_dim, hidden]``
    (fused column groups q, k, v), attention projection (row), post-attention norm, fused
    gate/up ``[2 * ffn, hidden]`` (fused column), down projection (row). Then final norm and
    head (vocab-split), or a tied embedding held by the first and last stages. Defaults: 7B.
    ``matrix_dtype``: the dtype of the layers' four matrices and an untied head, where it
    differs from ``dtype`` (default ``dtype``): the tensors a model computing in that dtype
    uses only in it.
    """
    matrix = matrix_dtype or dtype
    if num_attention_heads <= 0 or hidden_size % num_attention_heads:
        raise ValueError(f"hidden_size({hidden_size}) must be a positive multiple of "
                         f"num_attention_heads({num_attention_heads})")
    if num_query_groups <= 0 or num_attention_heads % num_query_groups:
        raise ValueError(f"num_attention_heads({num_attention_heads}) must be a multiple of "
                         f"num_query_groups({num_query_groups})")
    head_dim = hidden_size // num_attention_heads
    q, kv = hidden_size, num_query_groups * head_dim
    P = _C.ParamSpec
    specs = [P("embedding.weight", [vocab_size, hidden_size], dtype, "vocab",
               stage="first_and_last" if tied_embedding else "first")]
    for layer in range(num_layers):
        p = f"layers.{layer}."
        specs += [
            P(p + "input_norm.weight", [hidden_size], dtype, "replicated", layer=layer),
            P(p + "qkv.weight", [q + 2 * kv, hidden_size], matrix, "fused_column", groups=[q, kv, kv],
              layer=layer),
            P(p + "proj.weight", [hidden_size, hidden_size], matrix, "row", layer=layer),
            P(p + "post_norm.weight", [hidden_size], dtype, "replicated", layer=layer),
            P(p + "gate_up.weight", [2 * ffn_hidden_size, hidden_size], matrix, "fused_column",
              groups=[ffn_hidden_size, ffn_hidden_size], layer=layer),
            P(p + "down.weight", [hidden_size, ffn_hidden_size], matrix, "row", layer=layer),
        ]
    specs.append(P("final_norm.weight", [hidden_size], dtype, "replicated", stage="last"))
    if not tied_embedding:
        specs.append(P("head.weight", [vocab_size, hidden_size], matrix, "vocab", stage="last"))
    return _C.TensorSet(specs, num_layers)


def shard_tensors(
    full: Dict[str, torch.Tensor],
    tensor_set: "_C.TensorSet",
    layout: "_C.Layout",
    rank: int,
    kind: str = "sharded",
) -> Union[Dict[str, torch.Tensor], torch.Tensor]:
    """This rank's local shards under ``layout``, cut from the full tensors (name -> tensor of
    the spec's full shape and dtype): the input format of ``hotswitch.switch``. A ``"zero"``
    placement gives one flat 1-D tensor, zero-padded."""
    placement = _C.Placement(tensor_set, layout, kind)
    buffers = [torch.zeros(torch.Size(shape).numel(), dtype=getattr(torch, dtype))
               for _, shape, dtype in placement.buffers(rank)]
    specs = tensor_set.specs  # (a new list of every spec at each access: read once)
    for tensor, lo, hi, buffer, offset, strides, _ in placement.pieces(rank):
        name = specs[tensor].name
        box = tuple(slice(a, b) for a, b in zip(lo, hi))
        sizes = [b - a for a, b in zip(lo, hi)]
        buffers[buffer].as_strided(sizes, strides, offset).copy_(full[name][box])
    if kind == "zero":
        return buffers[0]
    return {specs[t].name: buf.view(shape)
            for (t, shape, _), buf in zip(placement.buffers(rank), buffers)}
