"""Calibration: fits a ``HardwareProfile`` to this machine from measurements on real processes.

``calibrate(config, world=2)`` spawns ``world`` gloo processes (they meet through a
temporary file store, one thread each) and times, on every rank:

- forward and backward of the real ``ParallelTransformer`` under the ``dp{world}`` layout
  (each rank a replica: pure compute) on packed micro-batches of each requested length: one
  sequence of ``s`` tokens, and ``s`` tokens cut into four sequences (which separates the
  per-token, per-token-squared and per-sequence terms);
- the collectives the layouts use: the model's tensor-parallel all-gather and
  reduce-scatter (``hotswitch.model.comm``), the data-parallel all-reduce, and the pipeline's
  batched point-to-point exchange between rank pairs, over a range of message sizes;
- as a check that is not fitted, forward and backward under ``tp{world}`` and ``pp{world}``
  (where the model divides), which the fitted profile must then predict.

A sample's time is the median over ``repeats`` of the slowest rank. The fit is a
non-negative least squares on relative errors over the cost model's own formulas
(``CostModel.terms`` and ``CostModel.collective_seconds``; see csrc/planner/CostModel.h),
which are linear in ``1 / efficiency``, ``1 / attention_efficiency``,
``sequence_overhead_seconds``, ``layer_overhead_seconds`` (compute) and
``1 / intra_node_bandwidth``, ``intra_node_latency`` (communication). ``peak_flops`` is a
nominal value: the argument, or else the rate of a large fp32 matrix product on one rank
(raised to a fitted rate that exceeds it, so efficiencies stay in (0, 1]). The processes
share one host, so the inter-node fields are set equal to the intra-node ones. The memory
budget is ``memory_bytes``, else ``base``'s, else this host's memory divided by ``world``.

The profile plans exactly like a preset: ``save_profile(profile, "hw.json")``, then
``python -m hotswitch.cli.plan --hardware hw.json`` or ``hotswitch.Runtime(..., hardware=profile)``.
Command line: ``python -m hotswitch.calibration --out hw.json [--quick]``.
"""

import os
import time
from typing import Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from hotswitch import _C
from hotswitch._C import Layout
from hotswitch._checks import check_int, check_positive
from hotswitch.distributed import spawn
from hotswitch.logging import get_logger
from hotswitch.model.batch import MicroBatch
from hotswitch.model.config import TransformerConfig
from hotswitch.model.groups import ParallelGroups
from hotswitch.model.transformer import ParallelTransformer
from hotswitch.planner import check_candidates

__all__ = ["DEFAULT_LENGTHS", "DEFAULT_MESSAGE_BYTES", "calibrate", "tiny_config"]

_log = get_logger("calibrate")

DEFAULT_LENGTHS = (32, 96, 256, 512)
DEFAULT_MESSAGE_BYTES = (16 << 10, 128 << 10, 1 << 20, 4 << 20)
MAX_WORLD = 8
MIN_LENGTH = 8
COMM_MIN_REPEATS = 9
# Side of the square fp32 matrices whose product sets the nominal peak.
PEAK_MATMUL_SIZE = 512


def tiny_config(max_length: int = max(DEFAULT_LENGTHS)) -> TransformerConfig:
    """The small fp32 model the command line calibrates with by default (0.5 M parameters)."""
    return TransformerConfig(num_layers=2, hidden_size=128, num_attention_heads=8, num_query_groups=4,
                             ffn_hidden_size=352, vocab_size=512, max_position_embeddings=max_length)


# ----------------------------------------------------------------------------- checks


def _transformer_config(config, longest: int) -> TransformerConfig:
    """The model to time: a TransformerConfig as given, or one built from a cost config."""
    if isinstance(config, TransformerConfig):
        if longest > config.max_position_embeddings:
            raise ValueError(f"length {longest} exceeds the model's max_position_embeddings"
                             f"({config.max_position_embeddings})")
        return config
    if isinstance(config, _C.ModelConfig):
        if config.recompute != "none":
            raise ValueError(f"config.recompute is {config.recompute!r}; calibration runs the parallel model "
                             f"without activation recomputation, so calibrate with recompute='none'")
        return TransformerConfig(num_layers=config.num_layers, hidden_size=config.hidden_size,
                                 num_attention_heads=config.num_attention_heads,
                                 num_query_groups=config.num_query_groups, ffn_hidden_size=config.ffn_hidden_size,
                                 vocab_size=config.vocab_size, max_position_embeddings=longest,
                                 dtype="float32" if config.param_bytes == 4 else "bfloat16")
    raise ValueError(f"config must be a hotswitch.TransformerConfig or hotswitch.ModelConfig, "
                     f"got {type(config).__name__}")


def _packs(lengths: Sequence[int]) -> List[List[int]]:
    """Per length s: one sequence of s tokens, and s tokens in four sequences."""
    out = []
    for s in lengths:
        out.append([s])
        q = s // 4
        out.append([q + 1, q, q - 1, s - 3 * q])
    return out


# ----------------------------------------------------------------------------- ranks


def _timed(fn, repeats: int, before=None) -> List[float]:
    """Seconds of ``fn()`` per repetition after one untimed warm-up; every repetition starts
    at a barrier, so the ranks start together. (Running a short collective several times back
    to back per repetition, to spread the ranks' skew leaving the barrier, measured slower
    and noisier with gloo on a loaded host, so each repetition runs it once.)"""
    import torch.distributed as dist

    out = []
    for k in range(repeats + 1):
        if before is not None:
            before()
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        if k:
            out.append(time.perf_counter() - t0)
    return out


def _measure(rank: int, world: int, spec: dict) -> dict:
    """One rank's timings: {"peak": [s], "samples": [(key, [s per repetition])]}."""
    import torch
    import torch.distributed as dist

    from hotswitch.model import comm

    cfg, repeats = spec["config"], spec["repeats"]
    gen = torch.Generator().manual_seed(1000 + rank)
    out = {"samples": []}
    if spec["measure_peak"]:
        n = PEAK_MATMUL_SIZE
        a, b = torch.randn(n, n, generator=gen), torch.randn(n, n, generator=gen)
        out["peak"] = _timed(lambda: torch.matmul(a, b), max(3, repeats))

    def forward_backward(name: str, packs: List[List[int]]) -> None:
        layout = Layout.parse(name)
        groups = ParallelGroups(layout, timeout=spec["timeout"])
        model = ParallelTransformer(cfg, layout, groups, seed=0)
        for pack in packs:
            mbs = [MicroBatch.from_sequences([torch.randint(0, cfg.vocab_size, (s,), generator=gen)
                                                 for s in micro]) for micro in pack]
            times = _timed(lambda: model.forward_backward(mbs, 1.0), repeats, before=model.zero_grad)
            out["samples"].append((("forward_backward", name, tuple(tuple(m) for m in pack)), times))
        del model, groups

    forward_backward(f"dp{world}", [[p] for p in spec["packs"]])
    for name, packs in spec["checks"]:
        forward_backward(name, packs)

    group = dist.group.WORLD
    peer = rank ^ 1
    # Collectives are short and their times spread widely on a shared host: more repetitions.
    comm_repeats = max(repeats, COMM_MIN_REPEATS)
    for size in spec["message_bytes"]:
        elements = size // 4
        full = torch.randn(elements - elements % world, generator=gen)
        part = full[: full.numel() // world].clone()
        recv, scratch = torch.empty_like(full), full.clone()
        ops = {
            "all_gather": lambda: comm.all_gather_rows(part, group, world),
            "reduce_scatter": lambda: comm.reduce_scatter_rows(full, group, world, rank),
            "all_reduce": lambda: dist.all_reduce(scratch, group=group),
        }
        if world > 1:
            pair = peer < world
            ops["p2p"] = lambda: comm.exchange([(full, peer)] if pair else [], [(recv, peer)] if pair else [],
                                               group, spec["timeout"])
        for kind, fn in ops.items():
            out["samples"].append(((kind, f"dp{world}", full.numel() * 4), _timed(fn, comm_repeats)))
    return out


def _run_ranks(world: int, spec: dict, timeout: float) -> List[dict]:
    try:
        return spawn(world, _measure, spec, timeout=timeout, pg_timeout=spec["timeout"])
    except RuntimeError as e:
        raise RuntimeError(f"calibration failed: {e}") from None


# ----------------------------------------------------------------------------- fit


def _nnls(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min |a x - b| over x >= 0 (``scipy.optimize.nnls``)."""
    from scipy.optimize import nnls

    x, _ = nnls(np.asarray(a, dtype=float), np.asarray(b, dtype=float))
    return x


def _profile(base: dict, **fields) -> "_C.HardwareProfile":
    values = dict(base)
    values.update(fields)
    return _C.HardwareProfile.from_dict(values)


def _unit_fields(name: str, peak: float, memory: int) -> dict:
    return {"name": name, "peak_flops": peak, "efficiency": 1.0, "attention_efficiency": 1.0,
            "memory_bytes": memory, "intra_node_bandwidth": 1.0, "inter_node_bandwidth": 1.0,
            "intra_node_latency": 1.0, "inter_node_latency": 1.0, "layer_overhead_seconds": 1.0,
            "sequence_overhead_seconds": 1.0}


def _compute_row(cost: "_C.CostModel", layout: "_C.Layout", pack: Sequence[int]) -> List[float]:
    """Coefficients of (1/eff, 1/attention eff, sequence overhead, layer overhead) for one
    micro-batch under a tp == 1, pp == 1 layout (the cost model with every unknown at 1)."""
    t = cost.terms(layout)
    n = float(sum(pack))
    squares = float(sum(s * s for s in pack))
    return [t.alpha_compute * n, t.beta * squares, t.gamma * len(pack),
            t.micro_batch_seconds - t.micro_batch_tp_seconds]


def _comm_row(cost_bw: "_C.CostModel", cost_both: "_C.CostModel", kind: str, layout: "_C.Layout",
              size: int) -> List[float]:
    """Coefficients of (1 / bandwidth, latency) for one collective of ``size`` bytes (the
    full buffer), from the cost model's ring formula; p2p: one transfer."""
    if kind == "p2p":
        return [float(size), 1.0]
    all_reduce = kind == "all_reduce"
    bw = cost_bw.collective_seconds(layout, "dp", float(size), all_reduce)
    return [bw, cost_both.collective_seconds(layout, "dp", float(size), all_reduce) - bw]


def _predict(cost: "_C.CostModel", key: tuple, world: int) -> float:
    kind, name, what = key
    layout = _C.Layout.parse(name)
    if kind == "forward_backward":
        # Every data replica runs the same micro-batches (each rank timed its own).
        batches = [[list(m) for m in what]] * layout.dp
        return cost.phase(layout, batches).run_seconds
    if kind == "p2p":
        hw = cost.hardware
        return what / hw.intra_node_bandwidth + hw.intra_node_latency
    return cost.collective_seconds(layout, "dp", float(what), kind == "all_reduce")


def _median(xs: Sequence[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def calibrate(config: Union[TransformerConfig, "_C.ModelConfig"], world: int = 2,
              lengths: Sequence[int] = DEFAULT_LENGTHS, repeats: int = 5, timeout: float = 300.0, *,
              message_bytes: Sequence[int] = DEFAULT_MESSAGE_BYTES, check_layouts: Optional[Sequence[str]] = None,
              peak_flops: Optional[float] = None, memory_bytes: Optional[int] = None,
              base: Union[None, str, "_C.HardwareProfile"] = None,
              name: str = "calibrated") -> Tuple["_C.HardwareProfile", dict]:
    """Measures this machine with ``world`` real gloo processes and fits a ``HardwareProfile``.

    ``config``: the model to time (``TransformerConfig``, or an ``ModelConfig`` turned
    into one: fp32 when ``param_bytes`` is 4, else bf16). ``lengths``: tokens of the packed
    micro-batches (ints >= 8, at least two distinct, each <= the model's max positions).
    ``repeats``: timed repetitions per sample (the median counts; collectives at least
    ``COMM_MIN_REPEATS``). ``timeout``: seconds for
    the whole measurement (``TimeoutError`` past it). ``message_bytes``: sizes of the timed
    collectives (bytes of the full buffer, ints >= 1024). ``check_layouts``: layouts timed
    only to check the fit (default ``tp{world}`` and ``pp{world}`` where the model divides;
    ``[]`` for none). ``peak_flops``: the nominal FLOP/s of a rank (default: measured, see the
    module docstring). ``memory_bytes`` / ``base`` (a preset name or profile): the memory
    budget kept in the profile. ``name``: the profile's name.

    Returns ``(profile, report)``. ``report``: ``fitted`` (the fitted fields), ``samples``
    (per sample: ``kind``, ``layout``, ``lengths`` or ``bytes``, ``role`` "fit" or "check",
    ``measured_s``, ``predicted_s`` by the profile, ``error`` = |pred - meas| / meas),
    ``fit_error_median`` / ``fit_error_max`` over the fitted samples (and
    ``fit_error_median_by_kind``: forward_backward, all_gather, reduce_scatter, all_reduce, p2p),
    ``check_error_median`` / ``check_error_max`` over the check samples (None without any),
    ``notes``, ``world``, ``lengths``, ``repeats``, ``seconds``. Raises ValueError naming a
    bad argument before any process starts; RuntimeError when a rank fails.
    """
    start = time.perf_counter()
    world = check_int("world", world, 2, MAX_WORLD)
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, (list, tuple)) or not lengths:
        raise ValueError(f"lengths must be a non-empty list of ints, got {lengths!r}")
    lengths = [check_int(f"lengths[{i}]", s, MIN_LENGTH) for i, s in enumerate(lengths)]
    if len(set(lengths)) < 2:
        raise ValueError(f"lengths must hold at least two distinct values (to separate the per-token and "
                         f"attention terms), got {lengths!r}")
    repeats = check_int("repeats", repeats, 1)
    timeout = check_positive("timeout", timeout)
    if isinstance(message_bytes, (str, bytes)) or not isinstance(message_bytes, (list, tuple)) or \
            len(message_bytes) < 2:
        raise ValueError(f"message_bytes must be a list of at least two sizes, got {message_bytes!r}")
    message_bytes = [check_int(f"message_bytes[{i}]", b, 1024) for i, b in enumerate(message_bytes)]
    if peak_flops is not None:
        peak_flops = check_positive("peak_flops", peak_flops)
    if memory_bytes is not None:
        check_int("memory_bytes", memory_bytes, 1)
    if isinstance(base, str):
        base = _C.HardwareProfile.preset(base)
    elif base is not None and not isinstance(base, _C.HardwareProfile):
        raise ValueError(f"base must be a preset name or a hotswitch.HardwareProfile, got {type(base).__name__}")
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    cfg = _transformer_config(config, max(lengths))
    dp = _C.Layout(dp=world, tp=1, pp=1)
    cfg.validate(dp)
    if check_layouts is None:
        check_layouts = []
        for layout in (_C.Layout(dp=1, tp=world, pp=1), _C.Layout(dp=1, tp=1, pp=world)):
            try:
                cfg.validate(layout)
            except ValueError:
                continue
            check_layouts.append(layout.name)
    elif isinstance(check_layouts, (str, bytes)) or not isinstance(check_layouts, (list, tuple)):
        raise ValueError(f"check_layouts must be a list of layout names, got {check_layouts!r}")
    try:
        layouts = check_candidates(cfg, world, list(check_layouts)) if check_layouts else []
    except ValueError as e:
        raise ValueError(f"check_layouts: {e}") from None
    checks = []
    for layout in layouts:
        # pp > 1: two micro-batches of each single-sequence pack, so the 1F1B bubble shows.
        per_pack = 2 if layout.pp > 1 else 1
        checks.append((layout.name, [[[s]] * per_pack for s in lengths]))
    if memory_bytes is None:
        memory_bytes = base.memory_bytes if base is not None else \
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // world

    packs = _packs(lengths)
    spec = {"config": cfg, "repeats": repeats, "timeout": timeout, "packs": packs, "checks": checks,
            "message_bytes": message_bytes, "measure_peak": peak_flops is None}
    _log.info("calibrating with %d ranks: %d compute samples, %d check layouts, %d message sizes", world,
              len(packs), len(checks), len(message_bytes))
    ranks = _run_ranks(world, spec, timeout)

    # Per sample: per repetition the slowest rank, then the median.
    measured: Dict[tuple, float] = {}
    for k, (key, _) in enumerate(ranks[0]["samples"]):
        per_rep = np.max(np.asarray([r["samples"][k][1] for r in ranks], dtype=float), axis=0)
        measured[key] = float(np.median(per_rep))
    notes = []
    if peak_flops is None:
        matmul = min(_median(r["peak"]) for r in ranks)
        peak_flops = 2.0 * PEAK_MATMUL_SIZE ** 3 / matmul
        peak_source = f"fp32 {PEAK_MATMUL_SIZE}x{PEAK_MATMUL_SIZE} matrix product on one rank"
    else:
        peak_source = "argument"

    model = cfg.cost_config()
    topology = _C.Topology(world, world)
    unit = _unit_fields(name, peak_flops, memory_bytes)
    cost_unit = _C.CostModel(model, _profile(unit), topology)
    cost_bw = _C.CostModel(model, _profile(unit, intra_node_latency=0.0, inter_node_latency=0.0), topology)

    fit_keys = [k for k in measured if k[0] != "forward_backward" or k[1] == dp.name]
    compute_keys = [k for k in fit_keys if k[0] == "forward_backward"]
    comm_keys = [k for k in fit_keys if k[0] != "forward_backward"]
    a = np.asarray([_compute_row(cost_unit, dp, k[2][0]) for k in compute_keys])
    y = np.asarray([measured[k] for k in compute_keys])
    x_compute = _nnls(a / y[:, None], np.ones(len(y)))
    a = np.asarray([_comm_row(cost_bw, cost_unit, k[0], dp, k[2]) for k in comm_keys])
    y = np.asarray([measured[k] for k in comm_keys])
    inv_bw, latency = _nnls(a / y[:, None], np.ones(len(y)))

    inv_eff, inv_att, seq_overhead, layer_overhead = (float(v) for v in x_compute)
    achieved = peak_flops / inv_eff if inv_eff > 0 else None
    achieved_att = peak_flops / inv_att if inv_att > 0 else None
    if achieved is None:
        notes.append("the per-token term did not resolve; efficiency set to 1")
    if achieved_att is None:
        notes.append("the attention term did not resolve (use longer lengths); attention_efficiency set to 1")
    top = max([peak_flops] + [r for r in (achieved, achieved_att) if r is not None])
    if top > peak_flops:
        notes.append(f"a fitted rate ({top:.3g} FLOP/s) exceeds the nominal peak ({peak_flops:.3g}); peak raised to it")
        peak_flops = top
    efficiency = achieved / peak_flops if achieved is not None else 1.0
    attention_efficiency = achieved_att / peak_flops if achieved_att is not None else 1.0
    if inv_bw > 0:
        bandwidth = 1.0 / inv_bw
    else:
        bandwidth = max(k[2] / measured[k] for k in comm_keys)
        notes.append("the bandwidth term did not resolve; set to the best observed bytes/s")
    notes.append("one host: inter-node bandwidth and latency set to the intra-node ones")
    fitted = {"peak_flops": peak_flops, "efficiency": min(1.0, efficiency),
              "attention_efficiency": min(1.0, attention_efficiency),
              "layer_overhead_seconds": layer_overhead, "sequence_overhead_seconds": seq_overhead,
              "intra_node_bandwidth": bandwidth, "inter_node_bandwidth": bandwidth,
              "intra_node_latency": float(latency), "inter_node_latency": float(latency)}
    profile = _profile(unit, **fitted)

    cost = _C.CostModel(model, profile, topology)
    samples = []
    for key, meas in measured.items():
        kind, layout, what = key
        pred = _predict(cost, key, world)
        row = {"kind": kind, "layout": layout, "role": "fit" if key in fit_keys else "check",
               "measured_s": meas, "predicted_s": pred, "error": abs(pred - meas) / meas}
        if kind == "forward_backward":
            row["lengths"] = [list(m) for m in what]
        else:
            row["bytes"] = what
        samples.append(row)

    def errors(role):
        e = [s["error"] for s in samples if s["role"] == role]
        return (_median(e), float(max(e))) if e else (None, None)

    by_kind = {}
    for row in samples:
        if row["role"] == "fit":
            by_kind.setdefault(row["kind"], []).append(row["error"])
    fit_median, fit_max = errors("fit")
    check_median, check_max = errors("check")
    report = {
        "fitted": fitted, "peak_flops_source": peak_source, "memory_bytes": memory_bytes, "samples": samples,
        "fit_error_median": fit_median, "fit_error_max": fit_max,
        "fit_error_median_by_kind": {k: _median(v) for k, v in by_kind.items()},
        "check_error_median": check_median, "check_error_max": check_max,
        "check_layouts": [c[0] for c in checks], "notes": notes, "world": world, "lengths": lengths,
        "repeats": repeats, "message_bytes": message_bytes, "seconds": time.perf_counter() - start,
    }
    _log.info("calibrated %s: fit error median %.1f%%, max %.1f%%", name, 100 * fit_median, 100 * fit_max)
    return profile, report
