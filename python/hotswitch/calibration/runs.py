"""Measured training runs: reading them, rebuilding their steps, predicting their iteration
time with the cost model, fitting a hardware profile to them and checking one against them.

A runs file is a CSV with one row per training run and the columns of
``data/megatron_runs/runs.csv`` (its README says what each means): the model's shape and
family, the layout (``dp``, ``tp``, ``pp``), the batch (``global_batch_size``,
``micro_batch_size``, ``seq_length``, ``packing``), the measured ``iter_ms_median`` and the
histogram of the sequence lengths the run fed (``real_seq_len_hist``: key ``K`` counts lengths
above the next smaller key up to ``K``, the smallest key counts 1..K, ``">Kk"`` counts lengths
above K * 1024; ``{}`` or empty: not recorded). Extra columns are ignored.

How a run's step is rebuilt (``Megatron-LM``'s schedule): each of the ``dp`` replicas takes
``global_batch_size / dp`` sequences and cuts them, in order, into micro-batches of
``micro_batch_size`` sequences. Packed, a micro-batch is its sequences concatenated (each
attends to itself); padded, every sequence costs ``seq_length`` tokens. The lengths of a
packed run are drawn from its histogram with a fixed seed:

- within a bucket, lengths follow a power law whose slope (log count per log length) is that
  of the bucket's neighbours, so that a long tail keeps its shape inside each bucket (the
  first bucket, from 1, is uniform);
- the bucket that holds ``seq_length`` mixes documents of that length with longer ones cut
  to it: it gets as many lengths below ``seq_length`` as the slope of the buckets below
  extrapolates, and the rest are exactly ``seq_length``.

A run's predicted iteration time is the mean over ``steps`` drawn steps of the cost model's
phase time for the step (``CostModel.phase``: the slowest replica through the 1F1B pipeline,
then the gradients' reduce-scatter under the distributed optimizer, else their all-reduce)
plus ``CostModel.step_seconds`` (parameter all-gather, optimizer, fixed step overhead). A
packed run without a histogram cannot be rebuilt and is skipped; a padded one needs none.

``fit`` finds the hardware profile's free fields (``FITTED``) by bounded least squares on log
time (Levenberg-Marquardt on the fields' normalised logarithms, deterministic); ``check``
reports per-run ratios, the median and largest relative error and the share of pairs of runs
of one (model, GPUs, seq_length, packing) group, measured 5% or more apart, that the
prediction orders as measured.
"""

import csv
import dataclasses
import json
import math
import re
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hotswitch import _C

__all__ = ["COLUMNS", "FITTED", "Check", "Run", "check", "fit", "fit_fields", "pairwise_order_agreement", "predict",
           "read_runs", "sample_lengths"]

COLUMNS = ("run", "family", "world", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
           "num_query_groups", "seq_length", "global_batch_size", "micro_batch_size", "dp", "tp", "pp", "packing",
           "sequence_parallel", "recompute", "distributed_optimizer", "padded_vocab", "untie_embeddings",
           "normalization", "position_embedding", "iter_ms_median", "real_seq_len_hist")
_INT_COLUMNS = ("world", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups",
                "seq_length", "global_batch_size", "micro_batch_size", "dp", "tp", "pp", "padded_vocab")
_BOOL_COLUMNS = ("packing", "sequence_parallel", "distributed_optimizer", "untie_embeddings")
_NORMALIZATIONS = ("LayerNorm", "RMSNorm")
_POSITIONS = ("learned_absolute", "rope")
# Megatron-LM's --recompute-granularity, as the cost model's recompute modes.
_RECOMPUTE = {"none": "none", "": "none", "selective": "selective", "full": "full"}

# The profile fields the fit moves, with their bounds. Bandwidth bounds are fractions of the
# base profile's (its data sheet's): a fit cannot exceed the links it runs on.
FITTED: Tuple[Tuple[str, float, float, bool], ...] = (
    # (field, low, high, relative to the base's value)
    ("efficiency", 0.1, 0.9, False),
    ("attention_efficiency", 0.05, 0.9, False),
    ("attention_half_length", 0.0, 16384.0, False),
    ("memory_efficiency", 0.05, 1.0, False),
    ("intra_node_bandwidth", 0.05, 1.0, True),
    ("intra_node_latency", 0.0, 100e-6, False),
    ("inter_node_bandwidth", 0.02, 1.0, True),
    ("inter_node_latency", 0.0, 1e-3, False),
    ("layer_overhead_seconds", 0.0, 5e-3, False),
    ("step_overhead_seconds", 0.0, 2.0, False),
)
# Where the fit starts, the same for every base (a fraction of the upper bound for relative
# fields): it does not depend on an earlier fit.
_START = {"efficiency": 0.5, "attention_efficiency": 0.3, "attention_half_length": 256.0, "memory_efficiency": 0.5,
          "intra_node_bandwidth": 0.5, "intra_node_latency": 5e-6, "inter_node_bandwidth": 0.5,
          "inter_node_latency": 20e-6, "layer_overhead_seconds": 500e-6, "step_overhead_seconds": 0.1}
# Offsets that let fields whose bound is 0 move on a log scale.
_LOG_OFFSET = {"attention_half_length": 1.0, "intra_node_latency": 1e-7, "inter_node_latency": 1e-7,
               "layer_overhead_seconds": 1e-6, "step_overhead_seconds": 1e-3}
GPUS_PER_NODE = 8
PAIR_MARGIN = 0.05
# The fit stops when an iteration lowers the sum of squares by less than this share.
_TOLERANCE = 1e-4


@dataclasses.dataclass(frozen=True)
class Run:
    """One measured run (one row of a runs file)."""

    row: int                     # 1-based data row of the file
    name: str
    family: str                  # "gpt" or "llama"
    world: int
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    seq_length: int
    global_batch_size: int
    micro_batch_size: int
    dp: int
    tp: int
    pp: int
    packing: bool
    sequence_parallel: bool
    recompute: str               # "none", "selective" or "full"
    distributed_optimizer: bool
    padded_vocab: int
    untie_embeddings: bool
    position_embedding: str
    measured_s: float            # iter_ms_median / 1000
    histogram: Optional[Tuple[Tuple[int, int, int], ...]]  # (low, high, count): lengths in (low, high]

    @property
    def label(self) -> str:
        return f"row {self.row} ({self.name})"

    @property
    def model_key(self) -> tuple:
        """The model's identity: family and shape."""
        return (self.family, self.num_layers, self.hidden_size, self.ffn_hidden_size, self.num_attention_heads,
                self.num_query_groups)

    @property
    def group_key(self) -> tuple:
        """Runs compared pairwise: one model on one number of GPUs, one seq_length and packing."""
        return self.model_key + (self.world, self.seq_length, self.packing)

    @property
    def predictable(self) -> bool:
        """Padded runs need no histogram; packed ones are rebuilt from it."""
        return not self.packing or self.histogram is not None

    def model_config(self) -> "_C.ModelConfig":
        # Megatron's GPT runs keep the default num_query_groups (1) without grouped-query
        # attention: multi-head attention.
        groups = self.num_attention_heads if self.family == "gpt" and self.num_query_groups == 1 \
            else self.num_query_groups
        return _C.ModelConfig(num_layers=self.num_layers, hidden_size=self.hidden_size,
                              num_attention_heads=self.num_attention_heads, num_query_groups=groups,
                              ffn_hidden_size=self.ffn_hidden_size, vocab_size=self.padded_vocab,
                              recompute=self.recompute, name=self.name, family=self.family,
                              tied_embeddings=not self.untie_embeddings,
                              max_positions=self.seq_length if self.position_embedding == "learned_absolute" else 0)

    def layout(self) -> "_C.Layout":
        return _C.Layout(dp=self.dp, tp=self.tp, pp=self.pp)

    def topology(self, gpus_per_node: int = GPUS_PER_NODE) -> "_C.Topology":
        return _C.Topology(self.world, min(self.world, gpus_per_node))


def _fail(path: str, row: int, name: str, column: str, expected: str, value) -> None:
    raise ValueError(f"{path}: row {row} (run {name!r}), column {column!r}: expected {expected}, got {value!r}")


def _parse_histogram(text: str, seq_length: int, fail) -> Optional[Tuple[Tuple[int, int, int], ...]]:
    text = text.strip()
    if not text:
        return None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        fail("a JSON object of bucket -> count")
    if not isinstance(raw, dict):
        fail("a JSON object of bucket -> count")
    if not raw:
        return None
    bounds, above = [], []
    for key, count in raw.items():
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            fail(f"a count >= 0 for bucket {key!r}")
        match = re.fullmatch(r">\s*(\d+)\s*([kK]?)", key)
        if match:
            above.append((int(match.group(1)) * (1024 if match.group(2) else 1), count))
        elif re.fullmatch(r"\d+", key) and int(key) >= 1:
            bounds.append((int(key), count))
        else:
            fail(f"bucket keys that are positive ints or '>N' / '>Nk', not {key!r}")
    if len(above) > 1:
        fail("at most one '>N' bucket")
    bounds.sort()
    if above and bounds and above[0][0] < bounds[-1][0]:
        fail(f"the '>N' bucket above the largest bucket ({bounds[-1][0]})")
    buckets, low = [], 0
    for high, count in bounds:
        buckets.append((low, high, count))
        low = high
    if above:
        buckets.append((above[0][0], max(above[0][0] + 1, seq_length), above[0][1]))
    if sum(c for _, _, c in buckets) == 0:
        return None
    # Lengths were cut to seq_length: buckets above it hold lengths of exactly seq_length.
    out: List[Tuple[int, int, int]] = []
    cut = 0
    for lo, hi, count in buckets:
        if lo >= seq_length:
            cut += count
        else:
            out.append((lo, min(hi, seq_length), count))
    if cut:
        if out and out[-1][1] == seq_length:
            lo, hi, count = out[-1]
            out[-1] = (lo, hi, count + cut)
        else:
            out.append((seq_length - 1, seq_length, cut))
    return tuple(out)


def read_runs(path: str) -> List[Run]:
    """The runs of a CSV file (see the module docstring). ValueError naming the file, the row
    and the column of the first malformed value, or the missing columns."""
    try:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            header = reader.fieldnames or []
            missing = [c for c in COLUMNS if c not in header]
            if missing:
                raise ValueError(f"{path}: missing columns {', '.join(missing)} (expected the columns of "
                                 f"data/megatron_runs/runs.csv)")
            rows = list(reader)
    except OSError as e:
        raise ValueError(f"cannot read runs file {path!r}: {e.strerror}") from None
    if not rows:
        raise ValueError(f"{path}: no runs (expected at least one data row)")
    return [_parse_row(path, i, r) for i, r in enumerate(rows, start=1)]


def _parse_row(path: str, row: int, r: Dict[str, str]) -> Run:
    name = (r.get("run") or "").strip() or f"#{row}"

    def fail(column: str):
        return lambda expected, value=None: _fail(path, row, name, column, expected,
                                                  r.get(column) if value is None else value)

    values = {}
    for c in _INT_COLUMNS:
        text = (r.get(c) or "").strip()
        try:
            v = int(text)
        except ValueError:
            v = 0
        if v < 1:
            fail(c)("a positive integer")
        values[c] = v
    for c in _BOOL_COLUMNS:
        text = (r.get(c) or "").strip().lower()
        if text not in ("true", "false", "1", "0"):
            fail(c)("True or False")
        values[c] = text in ("true", "1")
    family = (r.get("family") or "").strip().lower()
    if family not in ("gpt", "llama"):
        fail("family")("gpt or llama")
    recompute = (r.get("recompute") or "").strip().lower()
    if recompute not in _RECOMPUTE:
        fail("recompute")("None, selective or full")
    normalization = (r.get("normalization") or "").strip()
    if normalization not in _NORMALIZATIONS:
        fail("normalization")(" or ".join(_NORMALIZATIONS))
    position = (r.get("position_embedding") or "").strip()
    if position not in _POSITIONS:
        fail("position_embedding")(" or ".join(_POSITIONS))
    try:
        iter_ms = float((r.get("iter_ms_median") or "").strip())
    except ValueError:
        iter_ms = float("nan")
    if not (math.isfinite(iter_ms) and iter_ms > 0):
        fail("iter_ms_median")("a positive number of milliseconds")
    v = values
    if v["dp"] * v["tp"] * v["pp"] != v["world"]:
        fail("world")(f"dp * tp * pp = {v['dp']} * {v['tp']} * {v['pp']} = {v['dp'] * v['tp'] * v['pp']}")
    if v["world"] > GPUS_PER_NODE and v["world"] % GPUS_PER_NODE:
        fail("world")(f"a multiple of {GPUS_PER_NODE} GPUs per node above one node")
    per_replica, rest = divmod(v["global_batch_size"], v["dp"])
    if rest:
        fail("global_batch_size")(f"a multiple of dp({v['dp']})")
    if per_replica % v["micro_batch_size"]:
        fail("micro_batch_size")(f"a divisor of global_batch_size / dp = {per_replica}")
    histogram = _parse_histogram(r.get("real_seq_len_hist") or "", v["seq_length"], fail("real_seq_len_hist"))
    run = Run(row=row, name=name, family=family, recompute=_RECOMPUTE[recompute], position_embedding=position,
              measured_s=iter_ms / 1e3, histogram=histogram, **values)
    try:
        run.model_config().validate(run.layout())
    except ValueError as e:
        text = str(e)
        column = next((c for key, c in (("tp(", "tp"), ("pp(", "pp"), ("num_query_groups", "num_query_groups"),
                                        ("num_attention_heads", "num_attention_heads")) if key in text), "hidden_size")
        fail(column)(f"a layout the model divides ({e})")
    return run


# ----------------------------------------------------------------------------- lengths


def _slope(a: Tuple[int, int, int], b: Tuple[int, int, int]) -> Optional[float]:
    """Log count per log length between two buckets (by their upper bounds)."""
    if a[2] <= 0 or b[2] <= 0 or a[1] <= 1 or b[1] <= a[1]:
        return None
    return math.log(b[2] / a[2]) / math.log(b[1] / a[1])


def _mass(gamma: float, lo: float, hi: float) -> float:
    """The integral of s^(gamma - 1) over (lo, hi]."""
    if abs(gamma) < 1e-9:
        return math.log(hi / lo)
    return (hi ** gamma - lo ** gamma) / gamma


def _components(histogram, seq_length: int) -> List[Tuple[float, float, float, Optional[float]]]:
    """(weight, low, high, gamma) pieces: density s^(gamma - 1) on (low, high], or a point
    mass at high when gamma is None."""
    buckets = list(histogram)
    top = len(buckets) - 1
    truncated = buckets[top][1] == seq_length and top >= 1
    pieces = []
    for i, (lo, hi, count) in enumerate(buckets):
        if count == 0:
            continue
        if lo == 0:
            pieces.append((float(count), 0.0, float(hi), 1.0))
            continue
        neighbours = []
        if i >= 1:
            neighbours.append(_slope(buckets[i - 1], buckets[i]))
        if i + 1 <= top and not (truncated and i + 1 == top):
            neighbours.append(_slope(buckets[i], buckets[i + 1]))
        if truncated and i == top:
            # The top bucket's own count holds the cut documents: its slope is the one below.
            neighbours = [_slope(buckets[i - 2], buckets[i - 1])] if i >= 2 else []
        known = [s for s in neighbours if s is not None]
        gamma = float(np.mean(known)) if known else 1.0
        gamma = min(max(gamma, -4.0), 4.0)
        if truncated and i == top and buckets[i - 1][2] > 0 and buckets[i - 1][0] > 0:
            below_lo, below_hi, below = buckets[i - 1]
            genuine = below * _mass(gamma, lo, hi) / _mass(gamma, below_lo, below_hi)
            genuine = min(float(count), genuine)
            if genuine > 0:
                pieces.append((genuine, float(lo), float(hi), gamma))
            if count - genuine > 0:
                pieces.append((count - genuine, float(hi), float(hi), None))
            continue
        pieces.append((float(count), float(lo), float(hi), gamma))
    return pieces


def sample_lengths(run: Run, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` sequence lengths drawn from the run's histogram (module docstring); int64."""
    if run.histogram is None:
        raise ValueError(f"{run.label} has no length histogram (column 'real_seq_len_hist')")
    pieces = _components(run.histogram, run.seq_length)
    weights = np.array([p[0] for p in pieces])
    which = rng.choice(len(pieces), size=count, p=weights / weights.sum())
    u = rng.random(count)
    out = np.empty(count, dtype=np.int64)
    for j, (_, lo, hi, gamma) in enumerate(pieces):
        sel = which == j
        if not sel.any():
            continue
        if gamma is None:
            out[sel] = int(hi)
            continue
        # Continuous on (lo, hi + 1), floored: integers lo + 1 .. hi.
        a, b = lo + 1.0, hi + 1.0
        if lo == 0:
            x = a + u[sel] * (b - a)
        elif abs(gamma) < 1e-9:
            x = a * (b / a) ** u[sel]
        else:
            x = (a ** gamma + u[sel] * (b ** gamma - a ** gamma)) ** (1.0 / gamma)
        out[sel] = np.clip(np.floor(x), lo + 1, hi).astype(np.int64)
    return out


def _steps(run: Run, steps: int, seed: int) -> List[list]:
    """The run's rebuilt steps: per step, batches[replica][micro-batch] = lengths."""
    per_replica = run.global_batch_size // run.dp
    micro = per_replica // run.micro_batch_size
    if not run.packing:
        return [[[[run.seq_length] * run.micro_batch_size for _ in range(micro)] for _ in range(run.dp)]]
    rng = np.random.default_rng([seed, run.row])
    out = []
    for _ in range(steps):
        lengths = sample_lengths(run, run.dp * per_replica, rng).reshape(run.dp, micro, run.micro_batch_size)
        out.append(lengths.tolist())
    return out


# ----------------------------------------------------------------------------- predict


class _Prepared:
    """Runs with their steps rebuilt once, priced under any profile."""

    def __init__(self, runs: Sequence[Run], steps: int, seed: int, gpus_per_node: int):
        self.runs = list(runs)
        self.steps = [_steps(r, steps, seed) for r in self.runs]
        self.models = [r.model_config() for r in self.runs]
        self.layouts = [r.layout() for r in self.runs]
        self.topologies = [r.topology(gpus_per_node) for r in self.runs]

    def seconds(self, hardware: "_C.HardwareProfile") -> np.ndarray:
        out = np.empty(len(self.runs))
        for i, run in enumerate(self.runs):
            # Megatron-LM's linear layers run the column-parallel backward collectives beside
            # the products: tp_overlap 1, as the h100 preset was fitted.
            cost = _C.CostModel(self.models[i], hardware, self.topologies[i], zero=run.distributed_optimizer,
                                sequence_parallel=run.sequence_parallel, tp_overlap=1.0)
            layout = self.layouts[i]
            phase = np.mean([cost.phase(layout, batches).total_seconds for batches in self.steps[i]])
            out[i] = phase + cost.step_seconds(layout)
        return out


def predict(runs: Sequence[Run], hardware: "_C.HardwareProfile", steps: int = 8, seed: int = 0,
            gpus_per_node: int = GPUS_PER_NODE) -> np.ndarray:
    """Predicted iteration seconds of each run (module docstring); ValueError for a run that
    cannot be rebuilt (packed without a histogram)."""
    bad = [r.label for r in runs if not r.predictable]
    if bad:
        raise ValueError(f"packed runs without a length histogram cannot be rebuilt: {', '.join(bad)}")
    return _Prepared(runs, steps, seed, gpus_per_node).seconds(hardware)


def pairwise_order_agreement(runs: Sequence[Run], predicted: Sequence[float]) -> Tuple[Optional[float], int]:
    """(share of ordered pairs, pairs): pairs of runs of one group whose measured times differ
    by at least PAIR_MARGIN of the smaller, ordered alike by the prediction (a tie is not)."""
    groups: Dict[tuple, List[int]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(r.group_key, []).append(i)
    agree = total = 0
    for members in groups.values():
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                i, j = members[a], members[b]
                mi, mj = runs[i].measured_s, runs[j].measured_s
                if abs(mi - mj) < PAIR_MARGIN * min(mi, mj):
                    continue
                total += 1
                agree += (predicted[i] - predicted[j]) * (mi - mj) > 0
    return (agree / total if total else None), total


@dataclasses.dataclass
class Check:
    """A profile against measured runs."""

    runs: List[Run]               # the runs predicted
    skipped: List[Run]            # packed runs without a histogram
    predicted_s: np.ndarray
    measured_s: np.ndarray
    median_abs_rel_error: float
    max_abs_rel_error: float
    pairwise_order_agreement: Optional[float]
    pairs: int

    @property
    def ratios(self) -> np.ndarray:
        return self.predicted_s / self.measured_s

    def result(self) -> dict:
        return {"runs": len(self.runs), "skipped": len(self.skipped),
                "median_abs_rel_error": round(self.median_abs_rel_error, 4),
                "max_abs_rel_error": round(self.max_abs_rel_error, 4),
                "pairwise_order_agreement": None if self.pairwise_order_agreement is None
                else round(self.pairwise_order_agreement, 4), "pairs": self.pairs}


def check(runs: Sequence[Run], hardware: "_C.HardwareProfile", steps: int = 8, seed: int = 0,
          gpus_per_node: int = GPUS_PER_NODE) -> Check:
    """Predicts every run that can be rebuilt and compares (``Check``)."""
    usable = [r for r in runs if r.predictable]
    skipped = [r for r in runs if not r.predictable]
    if not usable:
        raise ValueError("no run can be rebuilt (packed runs need a length histogram)")
    predicted = predict(usable, hardware, steps, seed, gpus_per_node)
    measured = np.array([r.measured_s for r in usable])
    errors = np.abs(predicted / measured - 1.0)
    order, pairs = pairwise_order_agreement(usable, predicted)
    return Check(runs=usable, skipped=skipped, predicted_s=predicted, measured_s=measured,
                 median_abs_rel_error=float(np.median(errors)), max_abs_rel_error=float(errors.max()),
                 pairwise_order_agreement=order, pairs=pairs)


# ----------------------------------------------------------------------------- fit


def _bounds(base: dict) -> Dict[str, Tuple[float, float]]:
    out = {}
    for name, low, high, relative in FITTED:
        scale = base[name] if relative else 1.0
        out[name] = (low * scale, high * scale)
    return out


def fit(runs: Sequence[Run], base: "_C.HardwareProfile", steps: int = 8, seed: int = 0,
        gpus_per_node: int = GPUS_PER_NODE, iterations: int = 60, name: str = "fitted",
        fields: Optional[Sequence[str]] = None) -> Tuple["_C.HardwareProfile", dict]:
    """Fits the profile's ``FITTED`` fields (or ``fields``, a subset) to the runs.

    ``base`` gives every other field (peak FLOP/s, memory, memory bandwidth) and the data-sheet
    link bandwidths that bound the fitted ones; it must model memory traffic
    (``memory_bandwidth > 0``). Minimises sum (log predicted - log measured)^2 over the runs
    that can be rebuilt, each field moving on the log of its value within its bounds, from a
    fixed start (``_START``). Returns ``(profile, report)``; report: ``fitted`` (field ->
    value), ``bounds``, ``iterations``, ``rms_log_error``, ``runs``, ``skipped``.
    """
    base_fields = base.to_dict()
    if not base_fields["memory_bandwidth"] > 0:
        raise ValueError(f"base profile {base.name!r} has memory_bandwidth 0; the fit needs the device's "
                         f"memory bandwidth (use a data-sheet preset such as h100-datasheet)")
    names = [f[0] for f in FITTED] if fields is None else list(fields)
    unknown = [n for n in names if n not in {f[0] for f in FITTED}]
    if unknown or not names:
        raise ValueError(f"fields must be a non-empty subset of {', '.join(f[0] for f in FITTED)}, got {names!r}")
    usable = [r for r in runs if r.predictable]
    if len(usable) < len(names):
        raise ValueError(f"{len(usable)} runs can be rebuilt; fitting {len(names)} fields needs at least as many")
    prepared = _Prepared(usable, steps, seed, gpus_per_node)
    profile, report = fit_fields(prepared.seconds, [r.measured_s for r in usable], base, names, iterations, name)
    report.update(runs=len(usable), skipped=len(runs) - len(usable))
    return profile, report


def fit_fields(seconds: Callable[["_C.HardwareProfile"], np.ndarray], measured_s: Sequence[float],
               base: "_C.HardwareProfile", names: Sequence[str], iterations: int = 60,
               name: str = "fitted") -> Tuple["_C.HardwareProfile", dict]:
    """The profile whose fields ``names`` (of ``FITTED``; every other field is ``base``'s)
    minimise sum (log seconds(profile) - log measured_s)^2: ``scipy.optimize.least_squares``
    (trust-region reflective, bounded), each field moving on the log of its value within its
    bounds, from a fixed start (``_START``), for at most ``iterations`` Jacobians.
    ``seconds`` maps a profile to the predicted seconds of every measurement. Returns
    ``(profile, report)``; report: ``fitted`` (field -> value), ``bounds``, ``iterations``,
    ``rms_log_error``."""
    from scipy.optimize import least_squares

    base_fields = base.to_dict()
    measured = np.log(np.asarray(measured_s, dtype=float))
    bounds = _bounds(base_fields)
    offset = np.array([_LOG_OFFSET.get(n, 0.0) for n in names])
    lo = np.log(np.array([bounds[n][0] for n in names]) + offset)
    hi = np.log(np.array([bounds[n][1] for n in names]) + offset)
    start = dict(base_fields)
    for n in names:
        start[n] = _START[n] * (bounds[n][1] if dict((f[0], f[3]) for f in FITTED)[n] else 1.0)

    def decode(z: np.ndarray) -> dict:
        values = dict(start)
        for k, n in enumerate(names):
            v = math.exp(lo[k] + min(max(z[k], 0.0), 1.0) * (hi[k] - lo[k])) - offset[k]
            values[n] = min(max(v, bounds[n][0]), bounds[n][1])
        values["name"] = name
        return values

    def residuals(z: np.ndarray) -> np.ndarray:
        return np.log(seconds(_C.HardwareProfile.from_dict(decode(z)))) - measured

    z0 = np.clip((np.log(np.array([start[n] for n in names]) + offset) - lo) / (hi - lo), 0.0, 1.0)
    fit = least_squares(residuals, z0, bounds=(0.0, 1.0), method="trf", x_scale=1.0, diff_step=1e-4,
                        ftol=1e-10, xtol=1e-10, gtol=1e-10, max_nfev=iterations * (len(z0) + 1))
    z, r = fit.x, fit.fun
    cost = float(r @ r)
    done = int(fit.njev or 0)
    values = decode(z)
    profile = _C.HardwareProfile.from_dict(values)
    report = {"fitted": {n: values[n] for n in names}, "bounds": {n: list(bounds[n]) for n in names},
              "iterations": done, "rms_log_error": math.sqrt(cost / len(r))}
    return profile, report
