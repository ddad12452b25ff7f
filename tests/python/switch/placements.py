"""Plain-PyTorch reference of the placements: the slices each rank should hold, written
independently of the C++ placement code."""

import torch

import hotswitch as hs


def model_set(num_layers=8, hidden=16, ffn=32, vocab=40, tied=False, dtype="float32"):
    """A tiny LLaMA-shaped tensor set whose split dims divide by 8."""
    specs = [hs.ParamSpec("embedding.weight", [vocab, hidden], dtype, "vocab",
                          stage="first_and_last" if tied else "first")]
    for layer in range(num_layers):
        p = f"layers.{layer}."
        specs += [
            hs.ParamSpec(p + "input_norm.weight", [hidden], dtype, "replicated", layer=layer),
            hs.ParamSpec(p + "qkv.weight", [2 * hidden, hidden], dtype, "fused_column",
                         groups=[hidden, hidden // 2, hidden // 2], layer=layer),
            hs.ParamSpec(p + "proj.weight", [hidden, hidden], dtype, "row", layer=layer),
            hs.ParamSpec(p + "post_norm.weight", [hidden], dtype, "replicated", layer=layer),
            hs.ParamSpec(p + "gate_up.weight", [2 * ffn, hidden], dtype, "fused_column",
                         groups=[ffn, ffn], layer=layer),
            hs.ParamSpec(p + "down.weight", [hidden, ffn], dtype, "row", layer=layer),
        ]
    specs.append(hs.ParamSpec("final_norm.weight", [hidden], dtype, "replicated", stage="last"))
    if not tied:
        specs.append(hs.ParamSpec("head.weight", [vocab, hidden], dtype, "vocab", stage="last"))
    return hs.TensorSet(specs, num_layers)


def full_tensors(tensor_set):
    """Integer-valued tensors (exact in fp32), distinct per tensor."""
    out = {}
    for i, spec in enumerate(tensor_set.specs):
        n = spec.numel
        out[spec.name] = (torch.arange(n, dtype=torch.float64) + 1000 * i).reshape(spec.shape).to(
            getattr(torch, spec.dtype))
    return out


def coords(layout, rank):
    """(dp, tp, pp, cp) of a rank; the first axis of ``layout.order`` varies fastest."""
    out = {}
    for axis in layout.order.split("-"):
        degree = getattr(layout, axis)
        out[axis] = rank % degree
        rank //= degree
    return out["dp"], out["tp"], out["pp"], out["cp"]


def stage_of_layer(layer, num_layers, pp):
    sizes = [num_layers // pp + (1 if s < num_layers % pp else 0) for s in range(pp)]
    start = 0
    for s, size in enumerate(sizes):
        if layer < start + size:
            return s
        start += size
    raise AssertionError(layer)


def owns(spec, stage, num_layers, pp):
    if spec.stage == "layer":
        return stage_of_layer(spec.layer, num_layers, pp) == stage
    if spec.stage == "first":
        return stage == 0
    if spec.stage == "last":
        return stage == pp - 1
    return stage in (0, pp - 1)


def tp_shard(full, spec, t, tp):
    if spec.rule == "replicated":
        return full
    if spec.rule in ("column", "vocab"):
        return full.chunk(tp, 0)[t]
    if spec.rule == "row":
        return full.chunk(tp, 1)[t]
    return torch.cat([g.chunk(tp, 0)[t] for g in full.split(list(spec.groups), 0)], 0)


def local_shards(tensor_set, fulls, layout, rank):
    dp, tp, pp, cp = coords(layout, rank)
    return {s.name: tp_shard(fulls[s.name], s, tp, layout.tp).clone()
            for s in tensor_set.specs if owns(s, pp, tensor_set.num_layers, layout.pp)}


def zero_shard(tensor_set, fulls, layout, rank):
    dp, tp, pp, cp = coords(layout, rank)
    flat = torch.cat([t.reshape(-1) for t in local_shards(tensor_set, fulls, layout, rank).values()])
    groups = layout.dp * layout.cp
    chunk = -(-flat.numel() // groups)
    padded = torch.zeros(chunk * groups, dtype=flat.dtype)
    padded[: flat.numel()] = flat
    return padded[(dp * layout.cp + cp) * chunk:][:chunk].clone()


def shards_for(tensor_set, fulls, layout, rank, kind):
    return zero_shard(tensor_set, fulls, layout, rank) if kind == "zero" else local_shards(
        tensor_set, fulls, layout, rank)
