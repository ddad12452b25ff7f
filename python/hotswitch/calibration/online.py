"""Online re-calibration: the runtime's measured times refit the cost model as training runs.

Each step the runtime records, for every phase, the layout, the micro-batches of each data
replica and the slowest rank's forward/backward time; for every switch, the planned seconds
and the slowest rank's measured seconds; and what the step spent outside phases and switches
(batch agreement, loss reduction, the optimizer). ``OnlineCalibration.fit`` then

- refits the hardware profile's time coefficients — achieved FLOP/s of the linear layers
  and of attention, the per-layer overheads per micro-batch and per sequence, the link
  bandwidth and latency — by regularised least squares on the cost model's own phase
  formula: the phase time is (almost) linear in these coefficients, so each observation's
  sensitivity to each one is taken from the cost model itself and the measured times
  choose the mix (ridge towards the current values keeps unobserved terms where they are);
- then, per layout, keeps a factor on that layout's predicted times: the geometric mean of its
  measured over its refitted predicted phase times, shrunk towards 1 by half an observation
  (``LAYOUT_PRIOR``). The shared coefficients cannot say everything of one layout on one
  machine (how its collectives overlap, how its pipeline's stages share a host's cores);
  the factor carries what they miss, so that the home and the layouts already run are
  priced as they ran;
- under CUDA graph buckets, prices each phase with the graph buckets its micro-batches ran
  padded to, and takes the fixed cost per layer of a micro-batch run from the graphs as the
  refitted layer overhead less the saving measured in pairs of runs of the same micro-batch,
  as it is and from the graphs (``observe_graph_saving``; the runtime's start-up probe);
- scales the switch estimates by the ratio of measured to planned switch seconds;
- keeps a running mean of the fixed per-step time outside phases and switches, which the
  runtime adds to the planner's prediction.

Every input is a time reduced (MAX) over the ranks, so every rank fits the same profile
and plans the same steps.
"""

import collections
import dataclasses
from typing import Deque, Dict, List, Optional, Sequence, Tuple

import numpy as np

from hotswitch import _C
from hotswitch.model.attention import static_within
from hotswitch.model.config import runs_graphs

__all__ = ["Fit", "OnlineCalibration"]

# (field names scaled together, how: "inverse" fields are rates — the time goes as 1/field)
_TERMS: Tuple[Tuple[Tuple[str, ...], bool], ...] = (
    (("linear_flops",), True),
    (("attention_flops",), True),
    (("layer_overhead_seconds",), False),
    (("sequence_overhead_seconds",), False),
    (("intra_node_bandwidth", "inter_node_bandwidth"), True),
    (("intra_node_latency", "inter_node_latency"), False),
)
# A coefficient that is 0 gets this value to learn its sensitivity (and may be fitted to it).
_PROBE = {"layer_overhead_seconds": 1e-5, "sequence_overhead_seconds": 1e-6,
          "intra_node_latency": 1e-5, "inter_node_latency": 1e-5}


# The least pull towards its current value of a term the phases barely depend on, as a share
# of the average term's (``OnlineCalibration._fit_shared``).
RIDGE_FLOOR = 1e-2

# The pull of a layout's factor towards 1, in observations at 1: one phase at twice its
# prediction gives 2 ** (1 / 1.5) = 1.59, three give 2 ** (3 / 3.5) = 1.81.
LAYOUT_PRIOR = 0.5
# The factors stay within this range of 1.
LAYOUT_SCALE_RANGE = (0.2, 5.0)


@dataclasses.dataclass
class Fit:
    """The result of one re-calibration."""

    hardware: "_C.HardwareProfile"
    switch_scale: float
    overhead_s: float
    error_before: float          # median |predicted - measured| / measured of the phases
    error_after: float           # the same under the refitted profile and layout factors
    phases: int                  # observations used
    layout_scale: Dict[str, float] = dataclasses.field(default_factory=dict)  # per observed layout
    # Under graph buckets: the seconds per layer of a micro-batch run from the graphs, the
    # refitted layer overhead less the measured saving per layer (graph_saving_seconds, None
    # until a pair was observed: then the given overhead, or without one the layer overhead);
    # None without buckets.
    graph_layer_overhead_seconds: Optional[float] = None
    graph_saving_seconds: Optional[float] = None


def _fields(hw) -> dict:
    d = hw.to_dict()
    d["linear_flops"] = hw.peak_flops * hw.efficiency
    d["attention_flops"] = hw.peak_flops * hw.attention_efficiency
    return d


def _profile(fields: dict) -> "_C.HardwareProfile":
    d = dict(fields)
    linear, attention = d.pop("linear_flops"), d.pop("attention_flops")
    peak = max(d["peak_flops"], linear, attention)
    d.update(peak_flops=peak, efficiency=linear / peak, attention_efficiency=attention / peak)
    return _C.HardwareProfile.from_dict(d)


def _scaled(fields: dict, term: int, factor: float) -> dict:
    names, inverse = _TERMS[term]
    out = dict(fields)
    for n in names:
        out[n] = out[n] / factor if inverse else out[n] * factor
    return out


class OnlineCalibration:
    """Observations of recent steps and the refit of the cost model from them.

    ``window``: phases (and switches) kept; ``ridge``: weight of the pull towards the current
    coefficients, relative to each term's weight in the data (``RIDGE_FLOOR``). ``graphs``: the
    cost model's CUDA graph options the phases ran under: ``graph_buckets``, and
    ``graph_layer_overhead_seconds``, None when unknown (the graphs then save nothing until a
    saving is observed); a phase observed with its ``graph_tokens`` is priced padded and graphed
    as it ran. ``tp_overlap``: the cost model's share of the tp backward's column-parallel
    collectives hidden behind their products, as the layers ran (``RuntimeConfig.tp_overlap``);
    ``recompute_chunk_layers``: full recomputation's chunks as their reruns stopped
    (``RuntimeConfig.recompute_chunk_layers``)."""

    def __init__(self, model_config, topology, zero: bool, window: int = 64, ridge: float = 1e-3,
                 graphs: Optional[dict] = None, tp_overlap: float = 1.0, recompute_chunk_layers: int = 0):
        if isinstance(tp_overlap, bool) or not (isinstance(tp_overlap, (int, float)) and 0.0 <= tp_overlap <= 1.0):
            raise ValueError(f"tp_overlap must be a share in [0, 1], got {tp_overlap!r}")
        if isinstance(recompute_chunk_layers, bool) or not isinstance(recompute_chunk_layers, int) or \
                recompute_chunk_layers < 0:
            raise ValueError(f"recompute_chunk_layers must be an int >= 0, got {recompute_chunk_layers!r}")
        self.graphs = dict(graphs or {})
        self.tp_overlap = float(tp_overlap)
        self.recompute_chunk_layers = recompute_chunk_layers
        self.model_config = model_config
        self.topology = topology
        self.zero = zero
        self.ridge = ridge
        self.phases: Deque[Tuple["_C.Layout", List[List[List[int]]], float, str, Optional[List[List[int]]]]] = \
            collections.deque(maxlen=window)
        # (layout, the graph bucket of each micro-batch of a replica, seconds saved)
        self.graph_savings: Deque[Tuple["_C.Layout", List[int], float]] = collections.deque(maxlen=window)
        self.switches: Deque[Tuple[float, float]] = collections.deque(maxlen=window)
        self.overheads: Deque[float] = collections.deque(maxlen=window)

    def observe_phase(self, layout, batches: Sequence[Sequence[Sequence[int]]], measured_s: float,
                      recompute: str = "none", graph_tokens: Optional[Sequence[Sequence[int]]] = None) -> None:
        """``batches[replica][k]``: the sequence lengths of micro-batch k of each data replica;
        ``recompute``: the activation recomputation the phase ran with; ``graph_tokens[replica][k]``:
        the graph bucket micro-batch k ran padded to, 0 where it ran as it is (a plan phase's
        ``graph_tokens``; None: the cost model's choice)."""
        tokens = None if graph_tokens is None else self._checked_graph_tokens(layout, batches, recompute, graph_tokens)
        if measured_s > 0:
            self.phases.append((layout, [[list(mb) for mb in r] for r in batches], float(measured_s), recompute,
                                tokens))

    def _checked_graph_tokens(self, layout, batches, recompute: str, graph_tokens) -> List[List[int]]:
        """``graph_tokens`` as lists of ints, or ``ValueError`` (nothing observed) when they are not
        one entry per micro-batch, each 0 or a graph bucket holding it under a layout that runs
        graphs (``LayoutTerms.graphs``: pp and cp 1, every bucket a multiple of tp, no full
        recomputation)."""
        buckets = self.graphs.get("graph_buckets", [])
        shape = [len(r) for r in batches]
        if not isinstance(graph_tokens, (list, tuple)) or [len(r) for r in graph_tokens] != shape:
            raise ValueError(f"graph_tokens must hold one entry per micro-batch of each replica {shape}, got "
                             f"{graph_tokens!r}")
        graphs = runs_graphs(layout, buckets, recompute, self.graphs.get("graph_layouts"))
        for r, (replica, row) in enumerate(zip(batches, graph_tokens)):
            for k, (micro, b) in enumerate(zip(replica, row)):
                if isinstance(b, bool) or not isinstance(b, int) or (
                        b != 0 and (not graphs or not self._static(layout, b) or b < sum(micro))):
                    raise ValueError(f"graph_tokens[{r}][{k}] must be 0 or one of the graph buckets {list(buckets)} "
                                     f"holding the micro-batch's {sum(micro)} tokens under a layout that runs graphs "
                                     f"(pp and cp 1, every bucket a multiple of tp, no full recomputation; here "
                                     f"{layout}, recompute {recompute!r}) with its attention static at that size "
                                     f"(heads per rank * tokens^2 <= graph_max_scores "
                                     f"{self.graphs.get('graph_max_scores')}), got {b!r}")
        return [[int(b) for b in row] for row in graph_tokens]

    def _static(self, layout, bucket: int) -> bool:
        """Whether ``bucket`` is a graph bucket whose attention is static under ``layout``: its
        heads per rank * bucket^2 within ``graph_max_scores`` where there is one (the cost
        model's ``LayoutTerms.graph_max_tokens``)."""
        heads = self.model_config.num_attention_heads // layout.tp
        return (bucket in self.graphs.get("graph_buckets", []) and
                static_within(heads, bucket, self.graphs.get("graph_max_scores")))

    def observe_graph_saving(self, layout, graph_tokens: Sequence[int], eager_s: float, graphed_s: float) -> None:
        """The same micro-batches per replica under ``layout``, micro-batch k filling the graph
        bucket ``graph_tokens[k]``, ran ``eager_s`` seconds as they are and ``graphed_s`` from the
        graphs. The difference is the layers' fixed cost less theirs, less what the graphs pay
        more at tp > 1: the tp collectives the eager layers hide and the compiled, graphed ones
        wait for (``LayoutTerms.graph_tp_alpha``), which the fit adds back under its profile
        (``_layer_saving``) so that it is not counted twice."""
        if not self.graphs:
            raise ValueError("observe_graph_saving needs graph buckets (OnlineCalibration(graphs=...))")
        buckets = list(self.graphs["graph_buckets"])
        if not runs_graphs(layout, buckets, layouts=self.graphs.get("graph_layouts")):
            raise ValueError(f"observe_graph_saving: layout {layout} runs no CUDA graphs at the graph buckets "
                             f"{buckets} (pp and cp 1, every bucket a multiple of tp, among graph_layouts "
                             f"{self.graphs.get('graph_layouts')})")
        if (not isinstance(graph_tokens, (list, tuple)) or not graph_tokens or
                any(isinstance(b, bool) or not isinstance(b, int) or not self._static(layout, b) for b in graph_tokens)):
            raise ValueError(f"observe_graph_saving: graph_tokens must list the graph bucket of each micro-batch "
                             f"of a replica, each one of {buckets} with {layout}'s attention static at that size "
                             f"(heads per rank * tokens^2 <= graph_max_scores {self.graphs.get('graph_max_scores')}), "
                             f"got {graph_tokens!r}")
        if eager_s > 0 and graphed_s > 0:
            self.graph_savings.append((layout, [int(b) for b in graph_tokens], float(eager_s) - float(graphed_s)))

    def observe_switch(self, planned_s: float, measured_s: float) -> None:
        if planned_s > 0 and measured_s > 0:
            self.switches.append((float(planned_s), float(measured_s)))

    def observe_overhead(self, seconds: float) -> None:
        self.overheads.append(max(0.0, float(seconds)))

    @property
    def overhead_s(self) -> float:
        return float(np.mean(self.overheads)) if self.overheads else 0.0

    @property
    def switch_scale(self) -> float:
        if not self.switches:
            return 1.0
        planned = np.array([p for p, _ in self.switches])
        measured = np.array([m for _, m in self.switches])
        return float(np.clip(planned @ measured / (planned @ planned), 0.05, 50.0))

    def _graph_overhead(self, fields: dict, saving: Optional[float]) -> Optional[float]:
        """The graph overhead under ``fields`` (None without buckets): their layer overhead less
        ``saving`` per layer (at least 0) once one is measured; else the given overhead, or
        without one their layer overhead (the graphs save nothing until measured)."""
        if not self.graphs:
            return None
        if saving is not None:
            return max(0.0, fields["layer_overhead_seconds"] - saving)
        given = self.graphs.get("graph_layer_overhead_seconds")
        return fields["layer_overhead_seconds"] if given is None else float(given)

    def _layer_saving(self, fields: dict, layout_scale: Dict[str, float]) -> Optional[float]:
        """The median saving per layer of the observed pairs, in the cost model's seconds (a
        layout's factor scales its fixed costs too), or None without pairs. Each pair's
        difference gets back what its graphed run paid more for the tp collectives under
        ``fields`` and ``layout_scale``, which the cost model prices apart."""
        if not self.graph_savings:
            return None
        graphs = dict(self.graphs, graph_layer_overhead_seconds=fields["layer_overhead_seconds"])
        cost = _C.CostModel(self.model_config, _profile(fields), self.topology, zero=self.zero,
                            layout_scale=layout_scale, tp_overlap=self.tp_overlap,
                            recompute_chunk_layers=self.recompute_chunk_layers, **graphs)
        layers = self.model_config.num_layers
        per_layer = []
        for layout, tokens, seconds in self.graph_savings:
            t = cost.terms(layout)
            waited = t.graph_tp_alpha * sum(tokens) + t.graph_tp_micro_batch_seconds * len(tokens)
            per_layer.append((seconds + waited) / (len(tokens) * layers * layout_scale.get(layout.name, 1.0)))
        return float(np.median(per_layer))

    def _predict(self, fields: dict, layout_scale=None, saving: Optional[float] = None) -> np.ndarray:
        """Each observed phase's time under ``fields``, ``layout_scale`` and the graphs'
        ``saving`` per layer (``_graph_overhead``)."""
        graphs = dict(self.graphs)
        if graphs:
            graphs["graph_layer_overhead_seconds"] = self._graph_overhead(fields, saving)
        cost = _C.CostModel(self.model_config, _profile(fields), self.topology, zero=self.zero,
                            layout_scale=layout_scale or {}, tp_overlap=self.tp_overlap,
                            recompute_chunk_layers=self.recompute_chunk_layers, **graphs)
        out = []
        for layout, batches, _, recompute, tokens in self.phases:
            out.append(cost.phase(layout, batches, recompute=recompute, graph_tokens=tokens).run_seconds)
        return np.array(out)

    def fit(self, hardware) -> Optional[Fit]:
        """The refitted profile, or None without observations. Deterministic in its inputs.

        The shared coefficients and the layout factors are fitted in turn, three rounds: the
        coefficients to the times divided by the factors, the factors to what the coefficients
        leave, so that one layout's excess does not pull every other layout's prediction."""
        if not self.phases:
            return None
        measured = np.array([p[2] for p in self.phases])
        base = _fields(hardware)
        for name, value in _PROBE.items():
            if base[name] == 0:
                base[name] = value
        predicted = self._predict(base)  # before any saving is taken into account
        layout_scale: Dict[str, float] = {}
        # The graph overhead follows the layer overhead being fitted, less the saving.
        saving = self._layer_saving(base, layout_scale)
        for _ in range(3):
            fields = self._fit_shared(base, measured, layout_scale, saving)
            if fields is None:
                return None
            layout_scale = self._layout_scale(self._predict(fields, saving=saving), measured)
            saving = self._layer_saving(fields, layout_scale)
        profile = _profile(fields)
        after = self._predict(fields, layout_scale, saving)
        return Fit(hardware=profile, switch_scale=self.switch_scale, overhead_s=self.overhead_s,
                   error_before=float(np.median(np.abs(predicted - measured) / measured)),
                   error_after=float(np.median(np.abs(after - measured) / measured)),
                   phases=len(measured), layout_scale=layout_scale,
                   graph_layer_overhead_seconds=self._graph_overhead(fields, saving), graph_saving_seconds=saving)

    def _fit_shared(self, base: dict, measured: np.ndarray, layout_scale: Dict[str, float],
                    saving: Optional[float] = None) -> Optional[dict]:
        """The profile's fields refitted to ``measured`` under ``layout_scale`` and the graphs'
        ``saving``, by regularised least squares towards ``base``; None when they make no valid
        profile."""
        predicted = self._predict(base, layout_scale, saving)
        # Contribution of each term at the current coefficients: with time ~ sum_i c_i * x_i
        # (x_i the contribution, c_i its scale), doubling term i adds x_i.
        columns = [self._predict(_scaled(base, i, 2.0), layout_scale, saving) - predicted for i in range(len(_TERMS))]
        x = np.stack(columns, axis=1)
        rest = predicted - x.sum(axis=1)  # what no term explains (0 for a linear model)
        active = [i for i in range(x.shape[1]) if np.any(np.abs(x[:, i]) > 1e-12)]
        scale = np.ones(x.shape[1])
        weights = 1.0 / measured  # relative errors
        while active:
            pinned = [i for i in range(x.shape[1]) if i not in active]
            a = x[:, active] * weights[:, None]
            b = (measured - rest - x[:, pinned] @ scale[pinned]) * weights
            # Each term is pulled by ridge times its own weight in the data, so that a fixed cost
            # that is a small share of every phase is fitted as well as the FLOP/s; and by at
            # least RIDGE_FLOOR of the average term's, so that one the data barely see stays.
            weight = np.diag(a.T @ a)
            lam = self.ridge * np.maximum(weight, RIDGE_FLOOR * float(np.mean(weight)))
            lhs = a.T @ a + np.diag(lam)
            rhs = a.T @ b + lam
            solution = np.linalg.solve(lhs, rhs)
            low = [k for k, v in enumerate(solution) if v < 0.02]
            if not low:
                scale[active] = solution
                break
            # Pin the worst offender at the floor and refit the others.
            worst = active[min(low, key=lambda k: solution[k])]
            scale[worst] = 0.02
            active.remove(worst)
        fields = dict(base)
        for i, s in enumerate(scale):
            fields = _scaled(fields, i, float(s))
        try:
            _profile(fields)
        except ValueError:
            return None
        return fields

    def _layout_scale(self, predicted: np.ndarray, measured: np.ndarray) -> Dict[str, float]:
        """Per observed layout: exp(sum of log(measured / predicted) / (its phases + LAYOUT_PRIOR))."""
        logs: Dict[str, List[float]] = {}
        for (layout, *_), p, m in zip(self.phases, predicted, measured):
            if p > 0:
                logs.setdefault(layout.name, []).append(float(np.log(m / p)))
        low, high = LAYOUT_SCALE_RANGE
        return {name: float(np.clip(np.exp(sum(v) / (len(v) + LAYOUT_PRIOR)), low, high)) for name, v in logs.items()}
