"""This runtime's fixed cost per micro-batch, measured: the cost model's
``layer_overhead_seconds``.

``measure_micro_batch(config, token_counts, layer_counts)`` times forward and backward of the
real ``ParallelTransformer`` (one process, layout ``dp1``, on the CUDA device when there is
one, else one CPU thread) on micro-batches of one sequence of each token count, with the
model cut to each layer count. The time per layer of a micro-batch is the difference
between two layer counts divided by their difference: the embedding, the head, the loss
and the Python work per micro-batch outside the layers cancel. Fitted to it, by
non-negative least squares on relative errors (so the small micro-batches, where the fixed
cost shows, weigh as much as the large ones)::

    layer_seconds(T) = layer_overhead_seconds + per_token_seconds * T + per_score_seconds * T^2

where ``T^2`` is the causal attention's score count of a one-sequence pack. The intercept is
what the cost model charges per layer and micro-batch, forward and backward
(``HardwareProfile.layer_overhead_seconds``, see csrc/planner/HardwareProfile.h): kernel
launches and Python dispatch, and, under bf16 autocast, the cast of the fp32 weights.
``with_layer_overhead(profile, costs)`` returns a profile that plans with it.
"""

import dataclasses
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from hotswitch import _C
from hotswitch._checks import check_bool, check_int, check_positive
from hotswitch.calibration.offline import _nnls
from hotswitch.distributed import spawn
from hotswitch.logging import get_logger
from hotswitch.model.config import TransformerConfig
from hotswitch.model.fused import KERNELS, LAUNCHES

__all__ = ["MicroBatchCosts", "agreed_layer_overhead", "count_layer_ops", "default_token_counts", "fit_layer_seconds",
           "measure_micro_batch", "with_layer_overhead"]

_log = get_logger("calibrate")

# Factory operators that only allocate: no kernel runs.
_ALLOCATIONS = frozenset({"aten.empty", "aten.empty_like", "aten.empty_strided"})


@dataclasses.dataclass
class MicroBatchCosts:
    """What ``measure_micro_batch`` measured and fitted.

    ``device``: ``"cuda"`` or ``"cpu"``; ``device_name``: the CUDA device's name or the
    CPU's. ``token_counts``: tokens of the timed micro-batches. ``micro_batch_seconds``:
    ``{layers: [seconds per micro-batch, per token count]}``, forward and backward of the
    whole model cut to that many layers (the fastest repetition: on a shared host
    interference only adds time).
    ``layer_seconds``: per token count, seconds per layer and micro-batch (the difference
    of the largest and smallest layer count over their difference). The fit:
    ``layer_overhead_seconds``, ``per_token_seconds``, ``per_score_seconds``, and
    ``fit_error_max`` (largest |fit - measured| / measured over the token counts).
    ``attention``: the attention kernel the model chose; ``compute_dtype``; ``seconds``:
    the measurement's wall time.
    """

    device: str
    device_name: str
    token_counts: List[int]
    micro_batch_seconds: Dict[int, List[float]]
    layer_seconds: List[float]
    layer_overhead_seconds: float
    per_token_seconds: float
    per_score_seconds: float
    fit_error_max: float
    attention: str
    compute_dtype: str
    seconds: float


def _cut(config: TransformerConfig, layers: int) -> TransformerConfig:
    return dataclasses.replace(config, num_layers=layers)


def _time_rank(rank: int, world: int, spec: dict) -> dict:
    """Rank 0 of a world of 1: the timings (runs in the spawned process)."""
    import torch

    from hotswitch._C import Layout
    from hotswitch.model.batch import MicroBatch
    from hotswitch.model.groups import ParallelGroups
    from hotswitch.model.transformer import ParallelTransformer

    cuda = torch.cuda.is_available() and spec["backend"] == "nccl"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    layout = Layout.parse("dp1")
    groups = ParallelGroups(layout)
    gen = torch.Generator().manual_seed(11)
    out = {"device": groups.device.type, "seconds": {},
           "device_name": torch.cuda.get_device_name(groups.device) if cuda else "cpu"}

    def sync():
        if cuda:
            torch.cuda.synchronize()

    for layers in spec["layer_counts"]:
        cfg = _cut(spec["config"], layers)
        # With graphs every token count is a bucket: each micro-batch fills one, padded by nothing.
        model = ParallelTransformer(cfg, layout, groups, seed=0,
                                    graph_buckets=spec["token_counts"] if spec["graphs"] else None)
        out["attention"] = model.attention_kernel
        times = []
        # Graphs: the first call compiles, the next ones capture (CUDA graph trees warm up, then record).
        warmup = max(spec["warmup"], 3) if spec["graphs"] else spec["warmup"]
        for tokens in spec["token_counts"]:
            mb = MicroBatch.from_sequences([torch.randint(0, cfg.vocab_size, (tokens,), generator=gen)])
            reps = []
            for k in range(spec["repeats"] + warmup):
                model.zero_grad()
                sync()
                t0 = time.perf_counter()
                model.forward_backward([mb], 1.0)
                sync()
                if k >= warmup:
                    reps.append(time.perf_counter() - t0)
            times.append(min(reps))
        out["seconds"][layers] = times
        del model
        if cuda:
            torch.cuda.empty_cache()
    return out


def measure_micro_batch(config: TransformerConfig, token_counts: Sequence[int], layer_counts: Sequence[int] = (1, 3),
                        repeats: int = 5, warmup: int = 2, cuda: Optional[bool] = None,
                        timeout: float = 600.0, graphs: bool = False) -> MicroBatchCosts:
    """Measures this runtime's time per micro-batch and per layer of a micro-batch, and fits
    the fixed part (see the module docstring).

    ``config``: the model whose layers are timed (its ``num_layers`` is replaced by each of
    ``layer_counts``; its ``compute_dtype`` applies). ``token_counts``: tokens of the
    one-sequence micro-batches (at least three distinct ints >= 1, each <= the model's
    ``max_position_embeddings``). ``layer_counts``: at least two distinct layer counts.
    ``repeats``: timed repetitions per sample (the fastest counts) after ``warmup`` untimed
    ones. ``cuda``: time on the CUDA device (default: when one is available). Runs in one
    spawned process; ``graphs``: the layers run from CUDA graphs (``ParallelTransformer``'s
    ``graph_buckets``, one per token count, so nothing is padded; compiled and, on the CPU,
    not captured): the fitted overhead is then ``graph_layer_overhead_seconds``, the fixed
    cost the planner weighs against padding. ``TimeoutError`` past ``timeout`` seconds, ``RuntimeError`` when it
    fails, ``ValueError`` for bad arguments before anything runs.
    """
    import torch

    start = time.perf_counter()
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"config must be a hotswitch.TransformerConfig, got {type(config).__name__}")
    for name, values in (("token_counts", token_counts), ("layer_counts", layer_counts)):
        if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
            raise ValueError(f"{name} must be a list of ints, got {values!r}")
    tokens = [check_int(f"token_counts[{i}]", t, 1, config.max_position_embeddings)
              for i, t in enumerate(token_counts)]
    layers = sorted({check_int(f"layer_counts[{i}]", n, 1) for i, n in enumerate(layer_counts)})
    if len(set(tokens)) < 3:
        raise ValueError(f"token_counts must hold at least three distinct values (three terms are fitted), "
                         f"got {list(token_counts)!r}")
    if len(layers) < 2:
        raise ValueError(f"layer_counts must hold at least two distinct values, got {list(layer_counts)!r}")
    repeats = check_int("repeats", repeats, 1)
    warmup = check_int("warmup", warmup, 0)
    timeout = check_positive("timeout", timeout)
    if cuda is None:
        cuda = torch.cuda.is_available()
    elif cuda and not torch.cuda.is_available():
        raise ValueError("cuda=True, but no CUDA device is available")
    check_bool("graphs", graphs)
    spec = {"config": config, "token_counts": tokens, "layer_counts": layers, "repeats": repeats,
            "warmup": warmup, "backend": "nccl" if cuda else "gloo", "graphs": graphs}
    _log.info("timing micro-batches of %s tokens with %s layers on %s", tokens, layers, "cuda" if cuda else "cpu")
    try:
        result = spawn(1, _time_rank, spec, timeout=timeout, pg_timeout=timeout, backend=spec["backend"])[0]
    except RuntimeError as e:
        raise RuntimeError(f"micro-batch measurement failed: {e}") from None
    seconds = {int(k): v for k, v in result["seconds"].items()}
    low, high = layers[0], layers[-1]
    per_layer = [(b - a) / (high - low) for a, b in zip(seconds[low], seconds[high])]
    overhead, per_token, per_score, error = fit_layer_seconds(tokens, per_layer)
    costs = MicroBatchCosts(
        device=result["device"], device_name=result["device_name"], token_counts=tokens,
        micro_batch_seconds=seconds, layer_seconds=per_layer, layer_overhead_seconds=overhead,
        per_token_seconds=per_token, per_score_seconds=per_score, fit_error_max=error,
        attention=result["attention"], compute_dtype=config.compute_dtype or config.dtype,
        seconds=time.perf_counter() - start)
    _log.info("layer overhead %.3g s per micro-batch on %s (fit error max %.1f%%)", overhead, costs.device,
              100 * error)
    return costs


def _count_rank(rank: int, world: int, spec: dict) -> dict:
    """Every rank of a world of ``tp``: the operators dispatched per layer (runs spawned)."""
    import collections
    import os

    if spec["kernels"] == "triton":
        # Before the kernels' module is imported: it decides between compiling and interpreting.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from hotswitch._C import Layout
    from hotswitch.model.batch import MicroBatch
    from hotswitch.model.groups import ParallelGroups
    from hotswitch.model.transformer import ParallelTransformer

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            # Views (transpose, detach, slices, ...) and allocations launch nothing: counted apart.
            name = str(func.overloadpacket)
            kind = "view:" if func.is_view else "alloc:" if name in _ALLOCATIONS else ""
            self.ops[kind + name] += 1
            return func(*args, **(kwargs or {}))

    layout = Layout.parse(f"tp{world}")
    groups = ParallelGroups(layout)
    gen = torch.Generator().manual_seed(11)
    mbs = [MicroBatch.from_sequences([torch.randint(0, spec["config"].vocab_size, (spec["tokens"],), generator=gen)])
           for _ in range(spec["micro_batches"])]
    counts = {}
    for layers in spec["layer_counts"]:
        model = ParallelTransformer(_cut(spec["config"], layers), layout, groups, seed=0, kernels=spec["kernels"])
        model.forward_backward(mbs, 1.0)  # once outside the count: lazy set-up is not per layer
        model.zero_grad()
        launched = collections.Counter(LAUNCHES)
        with Count() as count:
            model.forward_backward(mbs, 1.0)
        for name, n in (LAUNCHES - launched).items():
            count.ops["triton:" + name] += n
        counts[layers] = count.ops
    return {"counts": {k: dict(v) for k, v in counts.items()}}


def count_layer_ops(config: TransformerConfig, tp: int = 1, tokens: int = 16,
                    layer_counts: Sequence[int] = (1, 3), timeout: float = 600.0,
                    kernels: str = "torch", micro_batches: int = 1) -> Dict[str, float]:
    """The ATen operators one layer dispatches per micro-batch, forward and backward, under
    tensor parallelism ``tp`` (``tp`` gloo ranks on the CPU, rank 0 counted): the count of a
    one-sequence micro-batch of ``tokens`` tokens through the model cut to the largest and
    the smallest of ``layer_counts``, their difference per layer. Every operator that is
    neither a view nor an allocation (``empty``, ``empty_like``, ``empty_strided``) is at
    least one kernel launch on a GPU, and so is every launch of a fused Triton kernel, so
    ``kernels`` is the CPU's proxy of the launches per layer.

    ``micro_batches``: the micro-batches of the counted call (each a sequence of ``tokens``);
    the counts are per micro-batch, so what happens once per call spreads over them. An
    uncounted call runs first, so the compute-dtype copies of the weights, kept while the
    weights do not change, are not cast in the counted one. At ``tp > 1`` gloo's
    reduce-scatter adds one ``copy_`` of its result per call (4 per layer), dispatched from
    inside the collective.

    ``kernels``: the model's fused steps (``hotswitch.model.fused``); ``"triton"`` runs its
    kernels under Triton's interpreter and counts their launches (names prefixed
    ``triton:``). Returns ``{"kernels": launches per layer, "views": view ops per layer,
    "allocations": ..., "kernels_outside_layers": launches per micro-batch outside the layers
    (embedding, final norm, loss head), op name: per layer, ...}`` (names with a nonzero count;
    views prefixed ``view:``, allocations ``alloc:``)."""
    tp = check_int("tp", tp, 1, 8)
    tokens = check_int("tokens", tokens, 1, config.max_position_embeddings)
    layers = sorted({check_int(f"layer_counts[{i}]", n, 1) for i, n in enumerate(layer_counts)})
    if len(layers) < 2:
        raise ValueError(f"layer_counts must hold two distinct values, got {list(layer_counts)!r}")
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {', '.join(KERNELS)}, got {kernels!r}")
    micro_batches = check_int("micro_batches", micro_batches, 1, 64)
    spec = {"config": config, "tokens": tokens, "layer_counts": layers, "kernels": kernels,
            "micro_batches": micro_batches}
    counts = spawn(tp, _count_rank, spec, timeout=timeout, pg_timeout=timeout)[0]["counts"]
    low, high = counts[layers[0]], counts[layers[-1]]
    per_layer = {name: (high.get(name, 0) - low.get(name, 0)) / (layers[-1] - layers[0]) / micro_batches
                 for name in set(low) | set(high)}
    def launches(ops):
        return sum(v for k, v in ops.items() if not k.startswith(("view:", "alloc:")))
    out = {"kernels": launches(per_layer),
           "views": sum(v for k, v in per_layer.items() if k.startswith("view:")),
           "allocations": sum(v for k, v in per_layer.items() if k.startswith("alloc:"))}
    # What is not per layer (embedding, final norm, loss head, gradient hooks), per micro-batch.
    out["kernels_outside_layers"] = launches(low) / micro_batches - layers[0] * out["kernels"]
    out.update(sorted(((k, v) for k, v in per_layer.items() if v), key=lambda kv: -kv[1]))
    return out


def fit_layer_seconds(token_counts: Sequence[int], layer_seconds: Sequence[float]):
    """Fits ``layer_seconds[i] = overhead + per_token * T_i + per_score * T_i^2`` with
    non-negative coefficients, minimising relative errors; returns ``(overhead, per_token,
    per_score, largest relative error)``. A non-positive sample (noise at tiny sizes) counts
    as 0 with the weight of the smallest positive one."""
    t = np.asarray(token_counts, dtype=float)
    y = np.asarray(layer_seconds, dtype=float)
    if t.shape != y.shape or t.size < 3:
        raise ValueError(f"need at least three (token count, seconds) samples of equal number, got "
                         f"{list(token_counts)!r} and {list(layer_seconds)!r}")
    basis = np.stack([np.ones_like(t), t, t * t], axis=1)
    scale = np.where(y > 0, y, np.min(y[y > 0]) if np.any(y > 0) else 1.0)
    coefficients = _nnls(basis / scale[:, None], np.maximum(y, 0) / scale)
    error = float(np.max(np.abs(basis @ coefficients - y) / scale))
    overhead, per_token, per_score = (float(v) for v in coefficients)
    return overhead, per_token, per_score, error


def with_layer_overhead(profile: "_C.HardwareProfile", costs: MicroBatchCosts,
                        name: Optional[str] = None) -> "_C.HardwareProfile":
    """A copy of ``profile`` whose ``layer_overhead_seconds`` is ``costs``' fitted overhead
    (and whose name is ``name`` when given); every other field is kept."""
    if not isinstance(profile, _C.HardwareProfile):
        raise ValueError(f"profile must be a hotswitch.HardwareProfile, got {type(profile).__name__}")
    if not isinstance(costs, MicroBatchCosts):
        raise ValueError(f"costs must be a MicroBatchCosts from measure_micro_batch, got {type(costs).__name__}")
    fields = profile.to_dict()
    fields["layer_overhead_seconds"] = costs.layer_overhead_seconds
    if name is not None:
        fields["name"] = name
    return _C.HardwareProfile.from_dict(fields)


def default_token_counts(config: TransformerConfig) -> List[int]:
    """Three token counts a micro-batch of ``config`` may hold, spread to separate the fixed,
    per-token and per-score terms: 128, 512 and 2048, or quarters of a shorter context."""
    longest = config.max_position_embeddings
    counts = [c for c in (128, 512, 2048) if c <= longest]
    if len(counts) < 3:
        counts = [max(1, longest // 4), max(2, longest // 2), longest]
    return sorted(set(counts))


def agreed_layer_overhead(config: TransformerConfig, profile: "_C.HardwareProfile",
                          token_counts: Optional[Sequence[int]] = None, repeats: int = 3,
                          timeout: float = 600.0):
    """The profile to plan with on every rank of the job: ``profile`` with the layer overhead
    that rank 0 measures on its device (``measure_micro_batch``) for this model, sent to every
    rank, so all ranks plan alike. Call it on every rank of the initialised default group
    (all ranks wait for rank 0). Returns ``(profile, costs)``: ``costs`` is the
    ``MicroBatchCosts`` on rank 0 and None elsewhere. A failed measurement raises on every rank.
    """
    import torch.distributed as dist

    tokens = default_token_counts(config) if token_counts is None else list(token_counts)
    box = [None]
    costs = None
    if dist.get_rank() == 0:
        try:
            costs = measure_micro_batch(config, tokens, repeats=repeats, warmup=1, timeout=timeout)
            box[0] = ("ok", costs.layer_overhead_seconds)
        except (RuntimeError, TimeoutError, ValueError) as e:
            box[0] = ("error", f"{type(e).__name__}: {e}")
    dist.broadcast_object_list(box, src=0)
    status, value = box[0]
    if status != "ok":
        raise RuntimeError(f"measuring the layer overhead on rank 0 failed: {value}")
    fields = profile.to_dict()
    fields["layer_overhead_seconds"] = float(value)
    return _C.HardwareProfile.from_dict(fields), costs
