"""The compute terms of a hardware profile, fitted to this runtime's own layers on one device.

``measure_shards(config, tps, token_counts)`` times forward and backward of the model's
layers at the shapes one rank holds under each tensor-parallel size — attention heads,
K/V heads and FFN width divided by tp (K/V heads kept at one when there are fewer than tp,
as Megatron-LM replicates them), the hidden size whole — on one process and one device, one
sequence of each token count a micro-batch. Each time is per layer: the model cut to 1 and
to 3 layers, the difference halved (``measure_micro_batch``), so the embedding, the head and
what runs once per micro-batch cancel. The collectives of tp are not timed: the multi-rank
calibration (``calibrate``) and the measured-runs fit (``calibration.runs``) own the links.

``fit_shards(times, base)`` fits the profile's compute fields — ``efficiency`` (linear
layers), ``attention_efficiency`` and ``attention_half_length`` (attention by sequence
length), ``memory_efficiency`` (elementwise traffic, when ``base`` models memory) and
``layer_overhead_seconds`` — so that the cost model's own per-layer time (``CostModel.phase``
of the shard-shaped model on one rank, 3 layers minus 1, halved) matches the measurements,
by the same bounded least squares on log time as the measured-runs fit. Every other field is
``base``'s: peak FLOP/s and memory bandwidth name the device the efficiencies are fractions of.

Command line: ``python -m hotswitch.calibration --device cuda|cpu`` (see ``cli.calibration``).
"""

import dataclasses
import time
from typing import List, Optional, Sequence, Tuple

import numpy as np

from hotswitch import _C
from hotswitch._checks import check_int
from hotswitch.calibration.overhead import measure_micro_batch
from hotswitch.calibration.runs import FITTED, fit_fields
from hotswitch.model.config import TransformerConfig

__all__ = ["COMPUTE_FIELDS", "ShardTimes", "fit_shards", "measure_shards", "shard_config"]

COMPUTE_FIELDS = ("efficiency", "attention_efficiency", "attention_half_length", "memory_efficiency",
                  "layer_overhead_seconds")
LAYERS = (1, 3)


@dataclasses.dataclass
class ShardTimes:
    """What ``measure_shards`` measured: ``samples`` are ``(tp, tokens, seconds per layer)``,
    forward and backward of one sequence of ``tokens`` through one layer shard of that tp.
    ``config``: the whole model the shards are cut from; ``device``/``device_name``/
    ``attention``/``compute_dtype``: where and how they ran; ``seconds``: the measurement's
    wall time."""

    config: TransformerConfig
    samples: List[Tuple[int, int, float]]
    device: str
    device_name: str
    attention: str
    compute_dtype: str
    seconds: float


def shard_config(config: TransformerConfig, tp: int) -> TransformerConfig:
    """``config`` at the shapes one rank of tensor-parallel size ``tp`` holds, as a whole
    model on one rank; ValueError when tp does not divide the heads or the FFN width."""
    tp = check_int("tp", tp, 1)
    if config.num_attention_heads % tp or config.ffn_hidden_size % tp:
        raise ValueError(f"tp({tp}) must divide num_attention_heads({config.num_attention_heads}) and "
                         f"ffn_hidden_size({config.ffn_hidden_size})")
    groups = config.num_query_groups
    return dataclasses.replace(config, num_attention_heads=config.num_attention_heads // tp,
                               num_query_groups=max(1, groups // tp) if groups % tp == 0 or groups < tp else groups,
                               ffn_hidden_size=config.ffn_hidden_size // tp)


def measure_shards(config: TransformerConfig, tps: Sequence[int] = (1, 2, 4, 8),
                   token_counts: Sequence[int] = (256, 1024, 4096, 16384, 32768), repeats: int = 3,
                   cuda: Optional[bool] = None, timeout: float = 1800.0) -> ShardTimes:
    """Times one layer shard per tp in ``tps`` at each of ``token_counts`` (module docstring).
    ``config.max_position_embeddings`` must hold the longest token count; its ``compute_dtype``
    applies (bf16 on GPUs, as training runs). ``cuda``: default when a device is available.
    One spawned process per tp; errors as ``measure_micro_batch``'s."""
    if not isinstance(config, TransformerConfig):
        raise ValueError(f"config must be a hotswitch.TransformerConfig, got {type(config).__name__}")
    if isinstance(tps, (str, bytes)) or not isinstance(tps, (list, tuple)) or not tps:
        raise ValueError(f"tps must be a non-empty list of ints, got {tps!r}")
    shapes = {tp: shard_config(config, tp) for tp in sorted({check_int(f"tps[{i}]", t, 1)
                                                             for i, t in enumerate(tps)})}
    start = time.perf_counter()
    samples, last = [], None
    for tp, shard in shapes.items():
        last = measure_micro_batch(shard, token_counts, LAYERS, repeats=repeats, cuda=cuda, timeout=timeout)
        samples += [(tp, t, s) for t, s in zip(last.token_counts, last.layer_seconds)]
    return ShardTimes(config=config, samples=samples, device=last.device, device_name=last.device_name,
                      attention=last.attention, compute_dtype=last.compute_dtype,
                      seconds=time.perf_counter() - start)


def _cost_config(config: TransformerConfig, layers: int) -> "_C.ModelConfig":
    sixteen = (config.compute_dtype or config.dtype) in ("bfloat16", "float16")
    return _C.ModelConfig(num_layers=layers, hidden_size=config.hidden_size,
                          num_attention_heads=config.num_attention_heads, num_query_groups=config.num_query_groups,
                          ffn_hidden_size=config.ffn_hidden_size, vocab_size=config.vocab_size,
                          param_bytes=2 if sixteen else 4, name="shard")


def predicted_layer_seconds(times: ShardTimes, profile: "_C.HardwareProfile") -> np.ndarray:
    """The cost model's seconds per layer of every sample of ``times`` under ``profile``."""
    layout, topology = _C.Layout.parse("dp1"), _C.Topology(1, 1)
    low, high = LAYERS[0], LAYERS[-1]
    models = {}
    out = np.empty(len(times.samples))
    for i, (tp, tokens, _) in enumerate(times.samples):
        if tp not in models:
            shard = shard_config(times.config, tp)
            models[tp] = [_C.CostModel(_cost_config(shard, n), profile, topology) for n in (low, high)]
        a, b = (m.phase(layout, [[[tokens]]]).total_seconds for m in models[tp])
        out[i] = (b - a) / (high - low)
    return out


def fit_shards(times: ShardTimes, base: "_C.HardwareProfile", fields: Optional[Sequence[str]] = None,
               name: str = "calibrated") -> Tuple["_C.HardwareProfile", dict]:
    """``base`` with its compute fields (``COMPUTE_FIELDS``, or ``fields``) fitted to ``times``.
    ``memory_efficiency`` is left out when ``base`` does not model memory traffic. Returns
    ``(profile, report)``: report ``fitted``, ``bounds``, ``at_bound`` (fields the fit pressed
    against a bound), ``iterations``, ``rms_log_error``, and per sample ``tp``, ``tokens``,
    ``measured_s``, ``predicted_s``, ``error``; ``median_abs_rel_error``, ``max_abs_rel_error``."""
    if not isinstance(times, ShardTimes):
        raise ValueError(f"times must be a ShardTimes from measure_shards, got {type(times).__name__}")
    names = list(COMPUTE_FIELDS if fields is None else fields)
    allowed = {f[0] for f in FITTED}
    if not names or any(n not in allowed for n in names):
        raise ValueError(f"fields must be a non-empty subset of {', '.join(sorted(allowed))}, got {names!r}")
    if not base.memory_bandwidth > 0 and "memory_efficiency" in names:
        names.remove("memory_efficiency")
    measured = [s for _, _, s in times.samples]
    if any(not s > 0 for s in measured):
        raise ValueError(f"every measured layer time must be > 0 (a 3-layer model slower than a 1-layer one), "
                         f"got {measured!r}")
    if len(measured) < len(names):
        raise ValueError(f"{len(measured)} samples cannot fit {len(names)} fields")
    profile, report = fit_fields(lambda p: predicted_layer_seconds(times, p), measured, base, names, name=name)
    predicted = predicted_layer_seconds(times, profile)
    errors = [p / m - 1 for p, m in zip(predicted, measured)]
    report["samples"] = [{"tp": tp, "tokens": t, "measured_s": m, "predicted_s": float(p), "error": float(e)}
                         for (tp, t, m), p, e in zip(times.samples, predicted, errors)]
    report["median_abs_rel_error"] = float(np.median(np.abs(errors)))
    report["max_abs_rel_error"] = float(np.max(np.abs(errors)))
    report["at_bound"] = sorted(n for n in report["fitted"]
                                if min(abs(report["fitted"][n] - b) for b in report["bounds"][n])
                                <= 1e-6 * max(1e-12, abs(report["bounds"][n][1])))
    return profile, report
