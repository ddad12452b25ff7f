"""The hot-switch training runtime: every step is planned, each phase runs under its own
layout, and one optimizer update in the home layout ends the step.

One step, on every rank (collective over the group):

1. the ranks agree that they hold the same batch, and the planner cuts it into phases —
   buckets of sequences by length, a layout per bucket, micro-batches per data replica;
2. per phase: the parameters are switched into the phase's layout (from the previous phase's
   layout, or from the master weights for the first), its micro-batches run forward and
   backward, and its gradients move into the home layout's accumulator — as partial summands
   summed by the switch, or reduced over the phase's data group first, whichever the plan
   shows moves fewer bytes;
3. the optimizer steps over the fp32 master weights in the home layout (optionally ZeRO-1:
   one flat shard per rank of the home data group).

The master weights and the optimizer state change only in step 3, so an error in steps 1–2
(bad input, a dead or stalled peer) leaves them exactly as they were.
"""

import collections
import dataclasses
import hashlib
import logging
import math
import time
from datetime import timedelta
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from hotswitch import _C, checkpoint
from hotswitch._boxes import owned_pieces
from hotswitch._C import CostModel, HardwareProfile, Layout, Planner
from hotswitch._errors import as_fault
from hotswitch.calibration.online import OnlineCalibration
from hotswitch.logging import get_logger
from hotswitch.model.batch import MicroBatch
from hotswitch.model.config import TransformerConfig, runs_graphs
from hotswitch.model.context import CP_MIN_CHUNK
from hotswitch.model.attention import PackAttention, select_kernel
from hotswitch.model.groups import ParallelGroups, backend_device, global_ranks
from hotswitch.model.transformer import ParallelTransformer
from hotswitch.planner import (auto_graph_layouts, check_candidates, choose_home, fixed_plan_entries,
                               keep_graph_layouts, load_fixed_plan,
                               plan_choice, redistribution_seconds, tensor_switch_costs, with_fixed_layouts)
from hotswitch.precision import GradScaler
from hotswitch.config import RuntimeConfig
from hotswitch.hooks import Hooks
from hotswitch.redistribute import default_topology, plan_switch, switch

__all__ = ["NonFiniteLoss", "PhaseResult", "Runtime", "StepResult"]

_log = get_logger("runtime")

_NEVER_S = 1e30  # a switch cost the planner never chooses
# A layout tried because it was never measured runs at most about this share of the step's
# tokens (RuntimeConfig.explore): enough for the model to learn it, little to lose if it is slow.
EXPLORE_SHARE = 0.25
# The start-up probe's micro-batches (RuntimeConfig.probe): (fraction of the tokens a layout's
# micro-batch holds, sequences they are cut into). Short and long, whole and cut, they separate
# the per-token, per-sequence and attention terms.
PROBE_PACKS = ((0.125, 1), (0.5, 4), (0.5, 1))
_TOKEN_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _ran_graphs(model, graph_tokens, recompute: Optional[str] = None) -> List[int]:
    """A micro-batch list's graph tokens as ``model`` runs them (under ``recompute``, default
    its own): 0 where it cannot run from the graphs (``ParallelTransformer.runs_graphed``) and
    runs as it is."""
    return [b if b and model.runs_graphed(b, recompute) else 0 for b in graph_tokens]


class NonFiniteLoss(ValueError):
    """A step's loss is NaN or infinite (``nonfinite="raise"``); nothing was updated."""
OptimizerFactory = Callable[[List[torch.nn.Parameter]], torch.optim.Optimizer]


@dataclasses.dataclass
class PhaseResult:
    """One phase of a step as it ran on this rank (times in seconds, sizes in bytes)."""

    layout: str
    sequences: int
    tokens: int
    micro_batches: int           # of this rank's data replica
    predicted_s: float           # the cost model's phase time
    compute_s: float             # forward and backward of the micro-batches
    switch_s: float              # parameters into this layout
    switch_bytes: int            # moved by that switch, whole world
    grad_s: float                # gradients into the home accumulator
    grad_bytes: int
    grad_method: str             # "partial", "reduce" or "local"
    recompute: str = "none"      # the activation recomputation it ran with


@dataclasses.dataclass
class StepResult:
    """What ``Runtime.train_step`` returns, the same on every rank but for the times."""

    step: int
    loss: float                  # mean over the target tokens of the whole batch
    skipped: bool                # no optimizer step: gradients overflowed under loss scaling, or a
                                 # non-finite loss under nonfinite="skip"
    tokens: int                  # input tokens of the batch
    targets: int                 # target tokens (a sequence of n tokens has n - 1)
    seconds: float               # wall time of the step on this rank
    switch_seconds: float        # parameters and gradients moved between layouts
    switch_bytes: int
    optimizer_seconds: float
    predicted_s: float           # the planner's step time (re-calibrated cost model)
    best_static: str             # the single layout the planner would run instead
    best_static_predicted_s: float
    phases: List[PhaseResult]
    grad_norm: float = 0.0       # global L2 norm of the step's gradients, before clipping (inf or
                                 # NaN when they overflowed)
    lr: float = 0.0              # the learning rate the optimizer stepped with
    loss_scale: float = 1.0      # the loss scale after this step's update (what Megatron logs)

    @property
    def layouts(self) -> List[str]:
        return [p.layout for p in self.phases]


def _largest_budget(planner, candidate: int, modes):
    """(tokens, recompute mode): the most tokens a micro-batch of ``candidate`` holds under
    ``planner`` over the recompute ``modes``, and the first mode that holds them."""
    budget, k = max((planner.candidate_model(candidate, m).budget, -k) for k, m in enumerate(modes))
    return budget, modes[-k]


def _with_memory(hw, memory_bytes: int):
    fields = hw.to_dict()
    fields["memory_bytes"] = memory_bytes
    return _C.HardwareProfile.from_dict(fields)


class Runtime:
    """Trains a ``ParallelTransformer`` with a planned layout per bucket of every step.

    ``config``: the model (``TransformerConfig``; fp32 recommended: the master weights are the
    model's dtype). ``settings``: a ``RuntimeConfig``; its fields may instead be given as
    keywords (``Runtime(cfg, zero=True)`` is ``Runtime(cfg, RuntimeConfig(zero=True))``).
    ``optimizer``: a factory ``params -> torch.optim.Optimizer`` over the home-layout master
    tensors (default AdamW, lr 1e-3); optimizers that act elementwise (SGD, Adam, AdamW, ...)
    give the same update whatever the layout. ``group``: the process group (default: the world).

    Construction is collective over ``group``: it builds the process groups of every
    candidate once, checks that every rank passed the same settings, and initialises the
    weights from ``settings.seed`` (the same logical weights whatever the layout).

    ``hooks`` (``hotswitch.hooks.Hooks``) are the declared points where functions can be
    attached (faults, profilers); ``state_dict``/``load_state_dict`` are this rank's training
    state, which ``hotswitch.checkpoint`` writes layout-independently.
    """

    def __init__(self, config, settings: Optional[RuntimeConfig] = None, *,
                 optimizer: Optional[OptimizerFactory] = None, group: Optional[dist.ProcessGroup] = None,
                 **fields):
        if settings is None:
            names = {f.name for f in dataclasses.fields(RuntimeConfig)}
            unknown = sorted(set(fields) - names)
            if unknown:
                raise ValueError(f"unknown runtime settings {unknown}; RuntimeConfig has {sorted(names)}")
            settings = RuntimeConfig(**fields)
        elif fields:
            raise ValueError(f"pass the settings either as a RuntimeConfig or as keywords, not both "
                             f"(got {sorted(fields)} beside a RuntimeConfig)")
        if not isinstance(settings, RuntimeConfig):
            raise ValueError(f"settings must be a hotswitch.RuntimeConfig, got {type(settings).__name__}")
        if not isinstance(config, TransformerConfig):
            raise ValueError(f"config must be a hotswitch.TransformerConfig, got {type(config).__name__}")
        self.settings = settings
        s = settings
        max_context = config.max_position_embeddings if s.max_context is None else s.max_context
        if max_context > config.max_position_embeddings:
            raise ValueError(f"max_context({max_context}) exceeds the model's max_position_embeddings"
                             f"({config.max_position_embeddings})")
        max_tokens_per_micro_batch = s.max_tokens_per_micro_batch
        if max_tokens_per_micro_batch is not None and max_tokens_per_micro_batch < max_context:
            raise ValueError(f"max_tokens_per_micro_batch({max_tokens_per_micro_batch}) must be >= "
                             f"max_context({max_context}): a micro-batch holds at least one whole sequence")
        self.max_tokens_per_micro_batch = max_tokens_per_micro_batch
        if group is None:
            if not dist.is_initialized():
                raise ValueError("torch.distributed is not initialized; call init_process_group first")
            group = dist.group.WORLD
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.topology = default_topology(self.world) if s.topology is None else s.topology
        if self.topology.world != self.world:
            raise ValueError(f"topology must be a hotswitch.Topology of world {self.world}, got {self.topology!r}")
        self.config = config
        self.tensor_set = config.tensor_set()
        # What a phase's parameters travel as: the matrices the model computes with only in
        # compute_dtype (RuntimeConfig.switch_compute_dtype) in that dtype, the rest as masters.
        self.param_set = self.tensor_set
        if s.switch_compute_dtype and not s.zero and config.compute_dtype not in (None, config.dtype):
            self.param_set = config.tensor_set(compute_matrices=True)
        self._compute_names = {spec.name for spec, full in zip(self.param_set.specs, self.tensor_set.specs)
                               if spec.dtype != full.dtype}
        self._narrow_dtype = getattr(torch, config.compute_dtype or config.dtype)
        self._wide_dtype = getattr(torch, config.dtype)
        # The attention's bound on a static pack, which caps the graph buckets the planner uses
        # (the models' runs_graphed): its kernel is the one every model of this rank selects.
        device = backend_device(group)
        self._graph_max_scores = PackAttention.max_static_scores(
            select_kernel(device, self._narrow_dtype, config.head_dim), device)
        self.max_context = max_context
        self.hooks = Hooks()
        self._stage = ""
        self.step = 0
        zero, seed = s.zero, s.seed

        self.candidates = check_candidates(config, self.world, s.candidates, s.max_cp)
        fixed = None
        if s.fixed_plan is not None:
            fixed = load_fixed_plan(s.fixed_plan, self.world, config, max_context)
            self.candidates = with_fixed_layouts(self.candidates, fixed)
        s.check_graph_layouts(self.candidates)
        hardware = HardwareProfile.preset("a800") if s.hardware is None else s.hardware
        if s.memory_budget_bytes is not None:
            hardware = _with_memory(hardware, s.memory_budget_bytes)
        self.hardware = hardware
        # Under graph buckets, the fixed seconds per layer of a micro-batch run from the graphs:
        # given, or the layer overhead (no saving) until the start-up probe measures it.
        g = s.graph_layer_overhead_seconds
        self._graph_overhead = None if s.graph_buckets is None else \
            float(hardware.layer_overhead_seconds if g is None else g)
        self.home = None  # chosen below; graph_layouts="auto" names no layout before
        self._chosen_graph_layouts: Optional[List[str]] = None  # graph_layouts="auto": at the first step
        self._layout_scale: Dict[str, float] = {}  # per layout, from the measured phases (re-calibration)
        self._measured: set = set()  # layouts the online calibration has observed
        self.cost = self._cost_model(hardware)
        self.home_placement = "zero" if zero else "sharded"  # of the master weights and accumulator
        # The recompute modes the planner may give a phase (RuntimeConfig.recompute).
        self.recompute_modes = ["none", "selective", "full"] if s.recompute == "auto" else [s.recompute]
        free = self._free_planner()
        self._check_holds(free)
        self.home = self._home(s.home, free)
        if s.auto_graph_layouts:
            # The home's graphs' copies, now that it is known (chosen as without graphs).
            self.cost = self._cost_model(hardware)
            self._check_holds(self._free_planner())
        self._costs = None
        self._plan_cache = _C.PlanCache()
        self._recent = collections.deque(maxlen=max(1, s.home_window))  # the last batches' lengths
        self._switch_scale = 1.0  # measured / planned switch seconds (online re-calibration)
        # Which layouts' predictions have held (RuntimeConfig.trust_error): agreed alike on every
        # rank, since they follow from the agreed plan and the slowest rank's times.
        self._warm: Dict[str, int] = {}  # phases run per layout in this process
        self._trusted: set = set()
        self._misses: Dict[str, int] = {}  # disagreements per layout
        self._left_out_until: Dict[str, int] = {}  # a disagreeing layout is not planned before this step
        self.planner = self._build_planner()
        self._restricted: Dict[frozenset, Planner] = {}  # planners without some layouts, for this planner
        # A fixed plan's entries over the candidates, refused now when a layout cannot hold its bound.
        self.fixed_entries = None
        if fixed is not None:
            self.fixed_entries = fixed_plan_entries(fixed, self.candidates)
            self.planner.check_fixed_plan(self.fixed_entries)

        # Collective from here on: the same order on every rank.
        # The runtime's own small collectives (batch agreement, loss, checkpoints) give up
        # after `timeout` too, whatever the timeout of the caller's group.
        self._root = global_ranks(group)[0]
        self.control = dist.new_group(global_ranks(group), timeout=timedelta(seconds=self.timeout))
        self._agree_on_settings()
        self.groups = {l.name: ParallelGroups(l, group=group, timeout=self.timeout) for l in self.candidates}
        self._models: Dict[str, "ParallelTransformer"] = {}
        home_model = ParallelTransformer(config, self.home, self.groups[self.home.name], seed=seed,
                                         recompute_num_layers=s.recompute_num_layers, compile_layers=s.compile_layers,
                                         graph_buckets=self._graph_buckets(self.home))
        shards = {n: t.detach() for n, t in home_model.named_shards().items()}
        if zero:
            shards = switch(shards, self.tensor_set, self.home, self.home, dst_kind="zero", group=group,
                               topology=self.topology, timeout=self.timeout).shards
            self.master = {"zero": torch.nn.Parameter(shards.clone())}
        else:
            self.master = {n: torch.nn.Parameter(t.clone()) for n, t in shards.items()}
            self._models[self.home.name] = home_model
        self.optimizer = (optimizer or (lambda params: torch.optim.AdamW(params, lr=1e-3)))(list(self.master.values()))
        if not isinstance(self.optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer factory returned {type(self.optimizer).__name__}, expected a torch.optim.Optimizer")
        self.prediction_errors: List[float] = []
        # The calibration's graph overhead is the given one, None when unknown (left to the probe).
        graphs = dict(self._graph_options(), graph_layer_overhead_seconds=s.graph_layer_overhead_seconds) \
            if self._graph_overhead is not None else {}
        self.calibration = OnlineCalibration(config.cost_config(), self.topology, zero, graphs=graphs,
                                             tp_overlap=s.tp_overlap,
                                             recompute_chunk_layers=s.recompute_chunk_layers) if s.recalibrate else None
        self._fit_vector: Optional[torch.Tensor] = None  # fitted at the end of a step, agreed at the next
        self._fits_applied = 0
        self._overhead_s = 0.0
        self._owned = None  # the accumulator's pieces this rank counts in the gradient norm
        self._optimizer_s = 0.0  # the last step's, for the next step's overhead observation
        self.scaler = None if s.loss_scaling is None else GradScaler(s.loss_scaling)
        self.skipped = 0  # steps without an optimizer update: the learning-rate schedule does not count them
        self._probed = False
        self._rebuilt: set = set()  # layouts whose models graph_layouts="auto" built again, until they run
        if s.probe:
            self._guarded(lambda: self._probe(home_given=s.home is not None), lambda: "the start-up probe")

    # ----------------------------------------------------------------------------- set-up

    def _cost_model(self, hardware, graphs: bool = True) -> "_C.CostModel":
        """The planner's cost model of this runtime: its model and topology, ZeRO as set, cp
        chunks cut as the model cuts them (nothing of the K/V exchange hides: the model
        gathers K/V before its attention call), the tp backward's overlap as its layers run
        (``RuntimeConfig.tp_overlap``), full recomputation's reruns as its checkpoint stops them
        (``RuntimeConfig.recompute_chunk_layers``), the graph buckets as set (``graphs=False``:
        none)."""
        return CostModel(self.config.cost_config(), hardware, self.topology, zero=self.zero,
                         cp_min_chunk=CP_MIN_CHUNK, layout_scale=self._planned_scale(),
                         tp_overlap=self.settings.tp_overlap,
                         recompute_chunk_layers=self.settings.recompute_chunk_layers,
                         **(self._graph_options() if graphs else {}))

    def _graph_options(self) -> dict:
        """The cost model's CUDA graph options: the settings' buckets, the current graph overhead,
        the bytes of the model's weight copies, the attention's bound on a static pack, the
        layouts that capture graphs."""
        return self.settings.graph_options(self.hardware, self._graph_overhead, self.config, self._graph_max_scores,
                                           graph_layouts=self.graph_layouts)

    @property
    def graph_layouts(self) -> Optional[List[str]]:
        """The names of the candidate layouts whose models capture CUDA graphs under the graph
        buckets (``RuntimeConfig.graph_layouts``; None: every one that can). Under ``"auto"`` the
        home alone until the first training step chooses them (``_choose_graph_layouts``)."""
        if not self.settings.auto_graph_layouts:
            return self.settings.graph_layout_names()
        if self._chosen_graph_layouts is not None:
            return list(self._chosen_graph_layouts)
        return [] if self.home is None else [self.home.name]

    def _graph_buckets(self, layout) -> Optional[List[int]]:
        """The graph buckets of ``layout``'s model: the settings' where the layout runs graphs
        (pp and cp 1, every bucket a multiple of its tp, among ``graph_layouts``:
        ``LayoutTerms.graphs``), else None."""
        buckets = self.settings.graph_buckets
        return list(buckets) if runs_graphs(layout, buckets, layouts=self.graph_layouts) else None

    def _widen_calibration_graphs(self) -> None:
        """Under ``graph_layouts="auto"``, the online calibration takes graphs from every layout
        that has captured them in this process (the home before the first step, then the chosen
        ones): its observations of earlier steps and of the probe ran under the earlier set."""
        if self.calibration is None or not self.calibration.graphs or not self.settings.auto_graph_layouts:
            return
        seen = set(self.calibration.graphs.get("graph_layouts") or []) | set(self.graph_layouts)
        self.calibration.graphs["graph_layouts"] = [c.name for c in self.candidates if c.name in seen]

    def _choose_graph_layouts(self, lengths) -> None:
        """``graph_layouts="auto"``, at the first training step (its batch's ``lengths``): the
        home and every layout that the planner without graph buckets gives the batch
        (``auto_graph_layouts``; the fixed plan's under ``fixed_plan``) capture graphs from now
        on; the home alone (a warning) when their copies would leave no layout that holds a
        ``max_context`` sequence or the fixed plan's bounds, and none when even the home's would.
        The cost model holds their copies and the planner is rebuilt; a model built without
        buckets before (by the probe) is built again with them, and its first phase, which
        compiles and captures, is cold: not observed by the calibration."""
        free_of_graphs = self._build_planner(cost=self._cost_model(self.hardware, graphs=False))
        chosen = auto_graph_layouts(free_of_graphs, [lengths], fixed_entries=self.fixed_entries)

        def check(names):
            # Their copies must leave a layout that holds max_context, and the fixed plan's bounds.
            self._chosen_graph_layouts = names
            cost = self._cost_model(self.hardware)
            planner = self._build_planner(cost=cost)
            self._check_holds(self._free_planner(cost))
            if self.fixed_entries is not None:
                planner.check_fixed_plan(self.fixed_entries)
            return cost, planner

        try:
            names, (cost, planner), refused = keep_graph_layouts(chosen, self.home.name, check)
        except ValueError:
            self._chosen_graph_layouts = None  # (the home alone again, as before the step)
            raise
        for tried, e in refused:
            _log.warning("step %d: graph_layouts='auto' does not take %s: with their graphs' copies %s",
                         self.step + 1, tried, e)
        for layout in self.candidates:
            model = self._models.get(layout.name)
            if model is not None and not model.graph_buckets and self._graph_buckets(layout):
                # Built again with buckets: its next phase compiles and captures, a cold one.
                del self._models[layout.name]
                self._warm.pop(layout.name, None)
                self._rebuilt.add(layout.name)
        self._widen_calibration_graphs()
        self.cost, self.planner = cost, planner
        self._restricted = {}
        _log.info("step %d: graph_layouts='auto' chose %s (the home and the layouts planned without graph buckets)",
                  self.step + 1, names)

    def _planned_scale(self) -> Dict[str, float]:
        """The factor on each layout's predicted times: the re-calibration's for the layouts it
        measured; under ``explore``, 1 + explore for those it has not yet (a layout the model
        has never seen run is priced at the top of its uncertainty when the step relies on it;
        ``_explore`` prices it at the bottom when deciding whether to try it)."""
        scale = dict(self._layout_scale)
        if self._exploring:
            for c in self.candidates:
                if c.name not in self._measured:
                    scale[c.name] = 1.0 + self.settings.explore
        return scale

    def _check_holds(self, free) -> None:
        """``ValueError`` unless some candidate holds a ``max_context`` sequence under ``free``'s
        cost model (``_free_planner``), naming what fails: the model's own state, or the context."""
        longest = max(free.micro_batch_budget(i) for i in range(len(self.candidates)))
        if longest >= self.max_context:
            return
        memory = self.hardware.memory_bytes
        if longest == 0:
            least = min(self.candidates, key=free.cost.static_bytes)
            held = free.cost.graph_copies_held_bytes
            copies = f" (with {held} bytes of the CUDA graphs' weight copies)" if held else ""
            raise ValueError(
                f"no candidate layout fits the model within {memory} bytes per rank: its weights, "
                f"gradients and optimizer state alone take {free.cost.static_bytes(least)} bytes per rank{copies} "
                f"even under {least.name}, the layout that shards them most; give more memory per rank or more "
                f"ranks")
        held = free.cost.graph_copies_held_bytes
        copies = f" beside {held} bytes of the CUDA graphs' weight copies" if held else ""
        raise ValueError(f"no candidate layout holds a sequence of max_context({self.max_context}) tokens "
                         f"within {memory} bytes per rank{copies}; the longest that fits is {longest}")

    def _free_planner(self, cost=None) -> Planner:
        """A planner over the candidates with switches free (under ``cost``, default the
        runtime's cost model): what each layout holds and would take alone."""
        n = len(self.candidates)
        return Planner(cost or self.cost, self.candidates, 0, [[0.0] * n for _ in range(n)], [0.0] * n, [0.0] * n,
                       recompute=self.recompute_modes)

    def _home(self, home, free) -> "_C.Layout":
        names = [l.name for l in self.candidates]
        if home is None:
            return self.candidates[free.plan([self.max_context]).best_static_candidate]
        layout = Layout.parse(home) if isinstance(home, str) else home
        if not isinstance(layout, _C.Layout) or layout.name not in names:
            raise ValueError(f"home layout {home!r} is not among the candidates {names}")
        return self.candidates[names.index(layout.name)]

    def _switch_costs(self, home=None, params_switch=None):
        """Seconds of every switch the planner weighs, from the redistribution plans of this
        model's tensors: parameters between candidates; a phase's gradients into the home
        accumulator (of candidate ``home``; default the home), reduced over its data group
        first or as partial summands."""
        if home is None:
            home = [l.name for l in self.candidates].index(self.home.name)
        return tensor_switch_costs(self.param_set, self.tensor_set, self.hardware, self.topology, self.candidates,
                                   home, home_placement=self.home_placement, method="plans",
                                   params_switch=params_switch, cache=self._plan_cache)

    def _build_planner(self, cost=None, home=None, costs=None, without=()):
        """The planner around the home (or candidate ``home``, with its switch costs ``costs``);
        the candidates in ``without`` (indices, never the home) are priced out: no switch
        enters them."""
        if home is None:
            home = [l.name for l in self.candidates].index(self.home.name)
            if self._costs is None:
                self._costs = self._switch_costs()
            costs = self._costs
        params, reduced, partial = costs
        scale = self._switch_scale
        params = [[_NEVER_S if j in without and j != i else c * scale for j, c in enumerate(row)]
                  for i, row in enumerate(params)]
        reduced = [c * scale for c in reduced]
        partial = [c * scale for c in partial]
        if self.grad_method == "partial":
            # The planner needs finite costs: reducing first is made too dear to choose.
            reduced = [_NEVER_S if r else 0.0 for r in reduced]
        elif self.grad_method == "reduce":
            partial = None
        return Planner(cost or self.cost, self.candidates, home, params, reduced, partial,
                          max_context=self.max_context,
                          max_tokens_per_micro_batch=self.max_tokens_per_micro_batch or 0,
                          recompute=self.recompute_modes, min_gain=self.min_gain)

    # ----------------------------------------------------------------------------- step

    def _agree_on_settings(self) -> None:
        """Every rank must build the same runtime: differing settings would plan different
        steps and leave ranks waiting in different collectives."""
        settings = repr((dataclasses.asdict(self.config), self.settings.digest_fields()))
        digest = int.from_bytes(hashlib.blake2b(settings.encode(), digest_size=7).digest(), "little")
        mine = torch.tensor([digest], dtype=torch.int64)
        everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(everyone, mine, group=self.control)
        differ = [r for r, d in enumerate(everyone) if int(d) != digest]
        if differ:
            raise ValueError(f"rank {self.rank}'s runtime settings differ from those of ranks {differ}; every rank "
                             f"must build the Runtime alike (its settings: {settings})")

    def _agreed_batch(self, sequences) -> List[torch.Tensor]:
        """The batch as int64 tensors, once every rank has checked it and holds the same."""
        error = None
        try:
            tensors = self._check_batch(sequences)
        except Exception as e:  # whatever a bad batch raises, every rank must hear of it
            error = e if isinstance(e, ValueError) else ValueError(
                f"the batch is not a list of token sequences ({type(e).__name__}: {e})")
            tensors = []
        # Every rank learns of any rank's refusal: nobody is left waiting in a collective.
        flag = torch.tensor([0 if error is None else 1], dtype=torch.int64)
        dist.all_reduce(flag, group=self.control)
        if error is not None:
            raise error
        if int(flag) != 0:
            raise ValueError("another rank refused the batch (see its error); no data moved")
        self._agree_on_batch(tensors)
        return tensors

    def _agree_on_batch(self, sequences) -> None:
        digest = hashlib.blake2b(digest_size=7)
        for s in sequences:
            digest.update(len(s).to_bytes(8, "little"))
            digest.update(torch.as_tensor(s, dtype=torch.int64).numpy().tobytes())
        mine = torch.tensor([int.from_bytes(digest.digest(), "little")], dtype=torch.int64)
        everyone = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world)]
        dist.all_gather(everyone, mine, group=self.control)
        differ = [r for r, d in enumerate(everyone) if int(d) != int(mine)]
        if differ:
            raise ValueError(f"rank {self.rank}'s batch differs from the batch of ranks {differ}; every rank "
                             "must pass the same global batch to train_step")

    def _check_batch(self, sequences) -> List[torch.Tensor]:
        if not isinstance(sequences, (list, tuple)) or not sequences:
            raise ValueError(f"a step needs a non-empty list of token sequences, got {type(sequences).__name__}"
                             f"{'' if not isinstance(sequences, (list, tuple)) else ' of length 0'}")
        out = []
        vocab = self.config.vocab_size
        for i, s in enumerate(sequences):
            try:
                t = torch.as_tensor(s) if not isinstance(s, torch.Tensor) else s
            except Exception as e:  # None, dicts, ids beyond int64, ragged nesting, ...
                raise ValueError(f"sequence {i} must be a non-empty 1-D sequence of integer token ids, got "
                                 f"{type(s).__name__} ({type(e).__name__}: {e})") from None
            if t.dim() != 1 or t.numel() == 0 or t.dtype not in _TOKEN_DTYPES:
                raise ValueError(f"sequence {i} must be a non-empty 1-D sequence of integer token ids, got "
                                 f"shape {tuple(t.shape)} and {t.dtype}")
            if t.numel() > self.max_context:
                raise ValueError(f"sequence {i} has {t.numel()} tokens, more than max_context({self.max_context}); "
                                 "truncate or split it first (hotswitch.data.fit_length)")
            lo, hi = int(t.min()), int(t.max())
            if lo < 0 or hi >= vocab:
                raise ValueError(f"sequence {i} holds token id {lo if lo < 0 else hi}, outside [0, vocab_size({vocab}))")
            out.append(t.to(torch.int64).cpu())
        return out

    def _model(self, layout, shards) -> "ParallelTransformer":
        model = self._models.get(layout.name)
        if model is None:
            model = ParallelTransformer(self.config, layout, self.groups[layout.name], seed=self.seed, shards=shards,
                                        recompute_num_layers=self.settings.recompute_num_layers,
                                        compile_layers=self.settings.compile_layers,
                                        graph_buckets=self._graph_buckets(layout))
            self._models[layout.name] = model
        else:
            model.load_shards(shards)
        return model

    def _switch(self, shards, src, dst, src_kind="sharded", dst_kind="sharded", donate=False, tensor_set=None):
        try:
            return self._switch_raw(shards, src, dst, src_kind, dst_kind, donate, tensor_set or self.tensor_set)
        except _C.SwitchFault as e:
            raise type(e)(f"rank {self.rank}, step {self.step + 1}, {self._stage}: {e}") from e

    def _switch_raw(self, shards, src, dst, src_kind, dst_kind, donate, tensor_set):
        self.hooks.fire("switch")
        return switch(shards, tensor_set, src, dst, src_kind=src_kind, dst_kind=dst_kind,
                         group=self.group, topology=self.topology, timeout=self.timeout, donate=donate)

    def _switch_params(self, shards, src, dst, src_kind="sharded", donate=False):
        """A phase's parameters from ``src`` into ``dst``. The matrices the model uses only in
        its compute dtype travel in it (``param_set``) and arrive widened to the masters'
        dtype: the model's compute copy of such a weight rounds the widened value to exactly
        the bits it would have rounded the master to, so the phase computes bit for bit as
        with full-width parameters, on about half the bytes."""
        if not self._compute_names:
            return self._switch(shards, src, dst, src_kind=src_kind, donate=donate)
        narrow = {n: t.detach().to(self._narrow_dtype) if n in self._compute_names else t
                  for n, t in shards.items()}
        r = self._switch(narrow, src, dst, src_kind=src_kind, donate=donate, tensor_set=self.param_set)
        r.shards = {n: t.to(self._wide_dtype) if n in self._compute_names else t for n, t in r.shards.items()}
        return r

    def _master_shards(self):
        if self.zero:
            return self.master["zero"].detach()
        return {n: p.detach() for n, p in self.master.items()}

    def train_step(self, sequences: Sequence[Sequence[int]]) -> StepResult:
        """Trains one step on ``sequences``: the whole global batch, a list of 1-D sequences of
        token ids (ints in ``[0, vocab_size)``, 1 to ``max_context`` tokens each), the same on
        every rank. The loss is the mean next-token cross-entropy over all target tokens of
        the batch. Collective over the group.

        Raises ``ValueError`` on every rank, before any data moves, for a bad batch, a batch
        that differs between ranks, or a sequence no layout holds; a dead or stalled peer
        raises ``SwitchTimeout``/``SwitchFault`` within the timeout, naming the rank, the
        step and the stage (which phase, which switch or which groups). A NaN or infinite loss
        raises ``NonFiniteLoss`` (a ValueError) under ``nonfinite="raise"``, or skips the
        optimizer step under ``"skip"``. Under loss scaling, gradients that overflow (an inf
        or NaN on any rank) skip the optimizer step on every rank and shrink a dynamic scale;
        the step counts in ``skipped``. After any error the master weights and optimizer
        state are as they were; after a fault the process group is usually unusable: restart
        the job from the last checkpoint.
        """
        self._stage = "agreeing on the batch"
        return self._guarded(lambda: self._train_step(sequences), lambda: f"step {self.step + 1}")

    def _train_step(self, sequences: Sequence[Sequence[int]]) -> StepResult:
        start = time.perf_counter()
        tensors = self._agreed_batch(sequences)
        lengths = [int(t.numel()) for t in tensors]
        targets = sum(n - 1 for n in lengths)
        if targets == 0:
            raise ValueError(f"the batch has no target tokens: all {len(lengths)} sequences have length 1")
        self._apply_fit()
        if self.settings.auto_graph_layouts and self._chosen_graph_layouts is None:
            self._choose_graph_layouts(lengths)
        plan = self._plan(lengths)

        # The gradients are those of the loss times the loss scale (1 without loss scaling),
        # divided by the batch's target count: the mean over the batch.
        scale = self.scaler.scale if self.scaler is not None else 1.0
        loss_scale = scale / targets
        accumulator = None
        loss_sum = torch.zeros(1, dtype=torch.float64)
        phases: List[PhaseResult] = []
        cold = []  # whether each phase is its layout's first in this process
        ran_graphs = []  # under graph buckets, per phase, every replica's micro-batches' graph tokens as they ran
        current, current_layout, switch_total, switch_bytes = None, None, 0.0, 0
        for k, ph in enumerate(plan.phases):
            layout = ph.layout
            cold.append(self._warm.get(layout.name, 0) == 0)
            self._warm[layout.name] = self._warm.get(layout.name, 0) + 1
            t0 = time.perf_counter()
            params, moved = self._enter(k, layout, current, current_layout)
            switch_s = time.perf_counter() - t0
            model = self._model(layout, params)
            model.recompute = ph.recompute  # the planner's choice for this phase
            current, current_layout = params, layout
            model.zero_grad()

            coord = self.groups[layout.name]
            self._stage = (f"phase {k} ({layout.name}): forward and backward of data replica {coord.dp_rank} "
                           f"(tp ranks {coord.tp_ranks}, pp ranks {coord.pp_ranks}, cp ranks {coord.cp_ranks})")
            mbs = [MicroBatch.from_sequences([tensors[i] for i in mb])
                   for mb in ph.packing.micro_batches[coord.dp_rank]]
            t0 = time.perf_counter()
            replica_loss, _ = model.forward_backward(mbs, loss_scale, before_forward=self._before_forward,
                                                     graph_tokens=list(ph.graph_tokens[coord.dp_rank]))
            model.finish_gradients()
            compute_s = time.perf_counter() - t0
            if self._graph_overhead is not None:  # only graph buckets give the calibration graph tokens
                ran_graphs.append([_ran_graphs(model, r) for r in ph.graph_tokens])
            if coord.tp_rank == 0 and coord.pp_rank == 0 and coord.cp_rank == 0:
                loss_sum += float(replica_loss)

            t0 = time.perf_counter()
            self._stage = f"phase {k} ({layout.name}): moving gradients into the home layout {self.home.name}"
            grads, method, grad_bytes = self._grads_home(model, layout, ph)
            model.zero_grad()
            accumulator = grads if accumulator is None else self._add(accumulator, grads)
            grad_s = time.perf_counter() - t0
            # The home phase's own data-parallel reduction is part of running it, not a switch.
            switch_total += switch_s + (grad_s if method != "local" else 0.0)
            switch_bytes += moved + grad_bytes
            tokens = sum(lengths[i] for i in ph.sequences)
            phases.append(PhaseResult(layout.name, len(ph.sequences), tokens, len(mbs), ph.cost.run_seconds,
                                      compute_s, switch_s, moved, grad_s, grad_bytes, method, ph.recompute))
        if current_layout is not None:
            self._release(self._models[current_layout.name])
        del current
        self.hooks.fire("gradients", accumulator)
        self._stage = "reducing the step's loss, gradient norm and times"
        # The loss, the squares of the gradients this rank owns and its count of non-finite
        # gradient tensors (every copy, so that a replica's overflow counts too), summed in one
        # collective: every rank reaches the same verdict on overflow.
        sums = torch.cat([loss_sum, self._grad_squares(accumulator), self._nonfinite(accumulator)])
        dist.all_reduce(sums, group=self.control)
        loss = float(sums[0]) / targets
        grad_norm = math.sqrt(float(sums[1])) / scale
        overflow = float(sums[2]) != 0 or not math.isfinite(grad_norm)
        if overflow and math.isfinite(grad_norm):  # the inf sits in a copy this rank does not count
            grad_norm = math.inf
        # The slowest rank's times: what the step took, and what re-calibration learns from.
        times = [time.perf_counter() - start, self._optimizer_s]
        for p in phases:
            times += [p.compute_s, p.switch_s, p.grad_s]
        times = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MAX, group=self.control)
        if not math.isfinite(loss) or (overflow and self.scaler is None):
            what = f"the loss is {loss}" if not math.isfinite(loss) else f"the gradient norm is {grad_norm}"
            if self.nonfinite == "raise":
                raise NonFiniteLoss(f"step {self.step + 1}: {what}; the optimizer did not step and the "
                                    "master weights are unchanged")
            _log.warning("step %d: %s; skipping the optimizer step", self.step + 1, what)
        elif overflow:
            _log.info("step %d: the gradients overflowed at loss scale %g; skipping the optimizer step",
                      self.step + 1, scale)

        t0 = time.perf_counter()
        skipped = not math.isfinite(loss) or overflow
        if self.scaler is not None:
            self.scaler.update(skipped)
        lr = float(self.optimizer.param_groups[0]["lr"])
        if not skipped:
            if scale != 1.0:
                for g in ([accumulator] if self.zero else accumulator.values()):
                    g.mul_(1.0 / scale)
            clip = self.settings.clip_grad
            if clip is not None and grad_norm > 0:
                # Megatron's rule: scale every gradient by clip / (norm + 1e-6) when that is < 1.
                coeff = clip / (grad_norm + 1e-6)
                if coeff < 1.0:
                    for g in ([accumulator] if self.zero else accumulator.values()):
                        g.mul_(coeff)
            if self.zero:
                self.master["zero"].grad = accumulator
            else:
                for n, p in self.master.items():
                    p.grad = accumulator[n]
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
        optimizer_s = time.perf_counter() - t0
        seconds = time.perf_counter() - start
        # Everything but the optimizer is the slowest rank's; the optimizer runs alike everywhere.
        measured = float(times[0]) + optimizer_s
        predicted = plan.total_seconds + self._overhead_s
        error = abs(predicted - measured) / measured
        self.prediction_errors.append(error)
        self.step += 1
        self.skipped += int(skipped)
        self._observe(plan, lengths, times.tolist(), ran_graphs, cold)
        self._update_trust(plan, [float(times[2 + 3 * k]) for k in range(len(phases))], cold)
        if self.settings.home_window:
            self._recent.append(lengths)
            self._rehome()
        self._optimizer_s = optimizer_s
        if _log.isEnabledFor(logging.INFO):  # the line is built only when it is written
            _log.info("step %d: %d sequences, %d tokens, phases %s, predicted %.3f s, measured %.3f s (error %.1f%%); "
                      "%s", self.step, len(lengths), sum(lengths), [p.layout for p in phases], predicted, measured,
                      100 * error, "fixed plan" if self.fixed_entries is not None else
                      plan_choice(plan, [c.name for c in self.candidates], self.min_gain))
        return StepResult(
            step=self.step, loss=loss, skipped=skipped, tokens=sum(lengths), targets=targets,
            seconds=seconds, switch_seconds=switch_total, switch_bytes=switch_bytes,
            optimizer_seconds=optimizer_s, predicted_s=predicted,
            best_static=self.candidates[plan.best_static_candidate].name,
            best_static_predicted_s=plan.best_static_seconds + self._overhead_s, phases=phases,
            grad_norm=grad_norm, lr=lr, loss_scale=scale if self.scaler is None else self.scaler.scale)

    # The settings, as the runtime's own attributes.
    zero = property(lambda self: self.settings.zero)
    grad_method = property(lambda self: self.settings.grad_method)
    seed = property(lambda self: self.settings.seed)
    timeout = property(lambda self: float(self.settings.timeout))
    recalibrate = property(lambda self: self.settings.recalibrate)
    nonfinite = property(lambda self: self.settings.nonfinite)
    min_gain = property(lambda self: float(self.settings.min_gain))
    # Trust protects runs whose model learns online; a fixed model plans reproducibly.
    _protecting = property(lambda self: self.settings.recalibrate and self.settings.trust_error is not None)
    _exploring = property(lambda self: self._protecting and self.settings.explore is not None
                          and self.settings.fixed_plan is None)

    @property
    def updates(self) -> int:
        """Optimizer updates so far: the steps less the skipped ones. A learning-rate schedule
        follows this count (Megatron's does not advance on a skipped iteration)."""
        return self.step - self.skipped

    def _enter(self, k: int, layout, current, current_layout):
        """Phase ``k``'s parameters under ``layout``: kept when the previous phase ran under it,
        else switched from the previous phase's (``current`` under ``current_layout``) or, for
        the first phase, from the master weights. Returns (shards, bytes moved)."""
        src = current_layout or self.home
        self._stage = f"phase {k} ({layout.name}): switching parameters {src.name} -> {layout.name}"
        if current_layout is not None and current_layout.name == layout.name:
            return current, 0
        if current_layout is not None:
            # The last layout's model lets go of its parameters: the switch may reuse them.
            self._release(self._models[current_layout.name])
        if layout.name == self.home.name and not self.zero:
            return {n: t.clone() for n, t in self._master_shards().items()}, 0
        if current is None:
            r = self._switch_params(self._master_shards(), self.home, layout, src_kind=self.home_placement)
        else:
            r = self._switch_params(current, current_layout, layout, donate=True)
        return r.shards, r.stats["bytes_moved"]

    def evaluate(self, sequences: Sequence[Sequence[int]]) -> float:
        """The mean next-token cross entropy of ``sequences`` (a batch as for ``train_step``,
        the same on every rank), forward only under the planned layouts: validation. Nothing
        trains: the master weights, optimizer state and step count stay as they are.
        Collective; the same errors as ``train_step``."""
        self._stage = "agreeing on the evaluation batch"
        return self._guarded(lambda: self._evaluate(sequences), lambda: f"evaluation after step {self.step}")

    def _guarded(self, run, when):
        """``run()``; a backend error (a dead peer closes its connections, a stalled one times
        out) becomes ``SwitchFault``/``SwitchTimeout`` naming this rank, ``when()`` and the
        stage. The master weights and optimizer state are untouched by then."""
        try:
            return run()
        except (ValueError, _C.SwitchFault):
            raise
        except RuntimeError as e:
            raise as_fault(e, f"rank {self.rank}, {when()}, {self._stage}") from e

    def _evaluate(self, sequences) -> float:
        tensors = self._agreed_batch(sequences)
        lengths = [int(t.numel()) for t in tensors]
        targets = sum(n - 1 for n in lengths)
        if targets == 0:
            raise ValueError(f"the batch has no target tokens: all {len(lengths)} sequences have length 1")
        plan = self._plan(lengths)
        loss_sum = torch.zeros(1, dtype=torch.float64)
        current, current_layout = None, None
        for k, ph in enumerate(plan.phases):
            layout = ph.layout
            params, _ = self._enter(k, layout, current, current_layout)
            model = self._model(layout, params)
            current, current_layout = params, layout
            coord = self.groups[layout.name]
            self._stage = f"evaluation phase {k} ({layout.name}): forward of data replica {coord.dp_rank}"
            mbs = [MicroBatch.from_sequences([tensors[i] for i in mb]) for mb in ph.packing.micro_batches[coord.dp_rank]]
            replica_loss, _ = model.forward_loss(mbs)
            if coord.tp_rank == 0 and coord.pp_rank == 0 and coord.cp_rank == 0:
                loss_sum += replica_loss
        if current_layout is not None:
            self._release(self._models[current_layout.name])
        del current
        self._stage = "reducing the evaluation loss"
        dist.all_reduce(loss_sum, group=self.control)
        return float(loss_sum) / targets

    def _before_forward(self) -> None:
        self.hooks.fire("forward")

    @staticmethod
    def _release(model) -> None:
        """Drops a cached layout model's gradients and parameter storage (it gets new shards
        with ``load_shards`` when its layout runs again)."""
        model.zero_grad()
        model.drop_compute_copies()
        with torch.no_grad():
            for p in model.parameters():
                p.data = torch.empty(0, dtype=p.dtype, device=p.device)

    # ----------------------------------------------------------------------------- re-calibration

    _FIT_FIELDS = ("peak_flops", "efficiency", "attention_efficiency", "layer_overhead_seconds",
                   "sequence_overhead_seconds", "intra_node_bandwidth", "inter_node_bandwidth",
                   "intra_node_latency", "inter_node_latency")

    def _plan(self, lengths) -> "_C.StepPlan":
        """The step's plan: the planner's, or the fixed plan's (RuntimeConfig.fixed_plan).

        Under ``trust_error`` the planner plans without the layouts left out after a
        disagreement, and when its plan relies on more than one untrusted layout it plans
        again with only the trusted ones and the untrusted one that carries the most
        predicted compute: a step tries at most one layout the model has not yet got right.
        Leaving layouts out never makes a step impossible: when the layouts left cannot hold
        its longest sequences, the step is planned without that restriction."""
        if self.fixed_entries is not None:
            return self.planner.plan_fixed(lengths, self.fixed_entries)
        if not self._protecting:
            return self.planner.plan(lengths)
        names = [c.name for c in self.candidates]
        home = names.index(self.home.name)
        left_out = {names.index(n) for n, until in self._left_out_until.items() if until > self.step + 1} - {home}
        plan = self._restricted_planner(left_out).plan(lengths)
        if left_out and plan.total_seconds >= _NEVER_S:
            plan = self.planner.plan(lengths)
        work: Dict[int, float] = {}
        for ph in plan.phases:
            if ph.candidate != home and names[ph.candidate] not in self._trusted:
                work[ph.candidate] = work.get(ph.candidate, 0.0) + ph.cost.run_seconds
        if len(work) > 1:
            # The one carrying the most work, or the next when the step cannot run without another;
            # then the same allowing a left-out one, which may be the only one holding the step.
            order = sorted(work, key=lambda c: (-work[c], c))
            for tried, out in [(c, left_out) for c in order] + [(c, set()) for c in order]:
                untrusted = {i for i, n in enumerate(names) if n not in self._trusted and i not in (home, tried)}
                restricted = self._restricted_planner(out | untrusted).plan(lengths)
                if restricted.total_seconds < _NEVER_S:
                    _log.info("step %d: the plan relied on %d untrusted layouts %s; trying only %s this step",
                              self.step + 1, len(work), sorted(names[c] for c in work), names[tried])
                    plan = restricted
                    break
        return self._explore(lengths, plan, names, home)

    def _explore(self, lengths, plan, names, home):
        """Optimism towards the layouts the model has never measured (``RuntimeConfig.explore``,
        u): the planner prices each at (1 + u) times its prediction (``_planned_scale``), the top
        of its uncertainty; here each one not yet measured and not in the plan, the home aside,
        is priced running the shortest pieces it holds, up to ``EXPLORE_SHARE`` of the step's
        tokens (the home running the rest), with its own phase at (1 - u) times, the bottom; the
        step runs that instead when so priced it beats the plan as planned. From the second step
        on, whose times the model learns from; at most one a step (the cheapest so priced); the
        home is measured whenever it runs, and a trial needs a home that holds the step's longest
        pieces or a layout that holds them all."""
        if not self._exploring or self.calibration is None or self.step < 1:
            return plan
        unmeasured = [i for i, n in enumerate(names) if i != home and n not in self._measured]
        if not unmeasured:
            return plan
        u = self.settings.explore
        cut = 1.0 - (1.0 - u) / (1.0 + u)  # from the top of the uncertainty to its bottom

        def price(p, c):
            return p.total_seconds - cut * sum(ph.cost.run_seconds for ph in p.phases if ph.candidate == c)

        pieces = sorted(piece.length for piece in self.planner.pieces(lengths))
        longest, share = pieces[-1], EXPLORE_SHARE * sum(pieces)
        # None: the home cannot run the step's longest pieces; a trial must then hold them all.
        home_mode = next((m for m in self.recompute_modes
                          if self.planner.candidate_model(home, m).budget >= longest), None)
        best, best_price, tried = plan, plan.total_seconds, None
        in_plan = {ph.candidate for ph in plan.phases}
        for c in unmeasured:
            if c in in_plan:
                continue
            budget, mode = _largest_budget(self.planner, c, self.recompute_modes)
            held = [n for n in pieces if n <= budget]
            if not held:
                continue  # it holds no piece of this step
            # The shortest pieces it holds, up to EXPLORE_SHARE of the step's tokens (one at least).
            bound, tokens = held[0], 0
            for n in held:
                if tokens >= share:
                    break
                bound, tokens = n, tokens + n
            entries = [(bound, c, mode)]
            if bound < longest:
                if home_mode is None:
                    continue
                entries.append((longest, home, home_mode))
            try:
                trial = self.planner.plan_fixed(lengths, entries)
            except ValueError:
                continue
            p = price(trial, c)
            _log.debug("step %d: %s, never measured, would run %.3f s predicted, %.3f s at the bottom of its "
                       "uncertainty, against %.3f s planned", self.step + 1, names[c], trial.total_seconds, p,
                       plan.total_seconds)
            if p < best_price:
                best, best_price, tried = trial, p, c
        if tried is not None:
            _log.info("step %d: trying %s, never measured: %.3f s predicted, %.3f s at the bottom of its uncertainty "
                      "(%.0f%%), against %.3f s planned", self.step + 1, names[tried], best.total_seconds,
                      best_price, 100 * u, plan.total_seconds)
        return best

    def _restricted_planner(self, without) -> Planner:
        """The planner with the candidates ``without`` (indices) priced out, built once per set
        until the planner is rebuilt."""
        if not without:
            return self.planner
        key = frozenset(without)
        if key not in self._restricted:
            self._restricted[key] = self._build_planner(without=key)
        return self._restricted[key]

    def _update_trust(self, plan, compute_s, cold) -> None:
        """Trusts a layout whose warm phase ran within ``trust_error`` of its predicted compute
        seconds, and distrusts one that did not; one that ran slower is also left out of the
        next 1, 2, 4, ... steps (one that ran faster costs the step nothing: the next refit
        learns it). The prediction is the model's own, without the factor ``explore`` puts on
        a layout not yet measured. ``compute_s``: each phase's forward and backward seconds on
        the slowest rank, so that every rank decides alike."""
        threshold = self.settings.trust_error
        # Before the first refit the model's scale is the starting profile's: a miss then says
        # nothing about one layout.
        if not self._protecting or not self._fits_applied:
            return
        for ph, measured, was_cold in zip(plan.phases, compute_s, cold):
            name = ph.layout.name
            if was_cold or name == self.home.name or measured <= 0:
                continue
            # self.cost planned this step; its factors beyond the fitted ones are explore's.
            predicted = ph.cost.run_seconds * self._layout_scale.get(name, 1.0) / self.cost.layout_scale.get(name, 1.0)
            error = abs(predicted - measured) / measured
            if error <= threshold:
                self._trusted.add(name)
                continue
            self._trusted.discard(name)
            if measured < predicted:
                continue
            misses = self._misses.get(name, 0)
            self._misses[name] = misses + 1
            self._left_out_until[name] = self.step + 1 + 2 ** misses
            _log.info("step %d: %s ran %.3f s against %.3f s predicted (error %.0f%% > %.0f%%): left out until "
                      "step %d", self.step, name, measured, predicted, 100 * error,
                      100 * threshold, self._left_out_until[name])

    def _observe(self, plan, lengths, times, ran_graphs, cold=None) -> None:
        """Feeds the step's slowest-rank times to the online calibration (from the second step
        on: the first runs each layout cold) and fits the cost model; the fit is agreed on and
        used at the next step. After a start-up probe (``RuntimeConfig.probe``) every layout is
        warm at the first step, which then counts too, but for the phases of a model that
        ``graph_layouts="auto"`` built again (``cold``: per phase, its layout's first in this
        process), which compiled and captured its graphs."""
        rebuilt = self._rebuilt
        self._rebuilt = rebuilt - {ph.layout.name for ph in plan.phases}
        if self.calibration is None or (self.step < 2 and not self._probed):
            return
        parts = times[2:]
        for k, ph in enumerate(plan.phases):
            self._measured.add(ph.layout.name)
            compute_s, switch_s, grad_s = parts[3 * k: 3 * k + 3]
            batches = [[[lengths[i] for i in mb] for mb in replica] for replica in ph.packing.micro_batches]
            if not (cold is not None and cold[k] and ph.layout.name in rebuilt):
                self.calibration.observe_phase(ph.layout, batches, compute_s, ph.recompute,
                                               graph_tokens=ran_graphs[k] if self._graph_overhead is not None
                                               else None)
            # Planned at the current scale; the home phase's own reduction is planned as 0.
            self.calibration.observe_switch(ph.switch_in_seconds / self._switch_scale, switch_s)
            self.calibration.observe_switch(ph.grad_seconds / self._switch_scale, grad_s)
        self.calibration.observe_overhead(times[0] - sum(parts) + (times[1] if self.step > 2 else 0.0))
        self._refit(f"after step {self.step}")

    def _refit(self, when: str) -> None:
        """Fits the cost model to the observations so far; the fit is agreed on and used at the
        next ``_apply_fit``."""
        fit = self.calibration.fit(self.hardware)
        if fit is None:
            return
        d = fit.hardware.to_dict()
        graphed = [] if self._graph_overhead is None else [fit.graph_layer_overhead_seconds]
        self._fit_vector = torch.tensor([d[f] for f in self._FIT_FIELDS] + [fit.switch_scale, fit.overhead_s] +
                                        graphed + [fit.layout_scale.get(c.name, 1.0) for c in self.candidates],
                                        dtype=torch.float64)
        _log.info("re-calibration %s: phase time error %.1f%% -> %.1f%% over %d phases; switch scale "
                  "%.2f, fixed %.3f s per step; layout factors %s%s", when, 100 * fit.error_before,
                  100 * fit.error_after, fit.phases, fit.switch_scale, fit.overhead_s,
                  {n: round(k, 3) for n, k in fit.layout_scale.items()},
                  "" if not graphed else f"; layer overhead {1e3 * fit.hardware.layer_overhead_seconds:.3f} ms, "
                                         f"from the graphs {1e3 * graphed[0]:.3f} ms" +
                                         ("" if fit.graph_saving_seconds is None else
                                          f" (saving {1e3 * fit.graph_saving_seconds:.3f} ms measured)"))

    def _apply_fit(self) -> None:
        """Makes the last fit (rank 0's, so that every rank plans alike) the planner's model."""
        if self._fit_vector is None:
            return
        self._stage = "agreeing on the re-calibrated cost model"
        vector = self._fit_vector.clone()
        dist.broadcast(vector, src=self._root, group=self.control)
        values = vector.tolist()
        fields = self.hardware.to_dict()
        fields.update(zip(self._FIT_FIELDS, values))
        hardware = _C.HardwareProfile.from_dict(fields)
        self.hardware = hardware
        n = len(self._FIT_FIELDS)
        self._switch_scale, self._overhead_s = values[n], values[n + 1]
        n += 2
        if self._graph_overhead is not None:
            self._graph_overhead = values[n]
            n += 1
        self._layout_scale = {c.name: k for c, k in zip(self.candidates, values[n:]) if k != 1.0}
        self._fits_applied += 1
        self.cost = self._cost_model(hardware)
        self.planner = self._build_planner()
        self._restricted = {}
        self._fit_vector = None

    def _probe(self, home_given: bool) -> None:
        """``RuntimeConfig.probe``: before the first step, every candidate that holds a sequence
        runs forward and backward of synthetic micro-batches, one per entry of ``PROBE_PACKS``
        (a fraction of the tokens its micro-batch holds, at most ``max_context``, cut into so
        many sequences; ``2 * pp`` such micro-batches under a pipeline, so that its fill shows),
        each timed after an untimed run of the same shape. Under graph buckets a layout that
        runs graphs also runs one sequence of its smallest and of its largest bucket it holds,
        eagerly and from the graphs (``_probe_packs``): the difference is the launches the
        graphs save. The slowest rank's times refit the cost model (``OnlineCalibration``,
        layout factors and the graph overhead included), which every rank plans the first step
        with; unless the home was given, it moves to the layout the fitted model prefers for a
        ``max_context`` sequence. The master weights, the optimizer and the data are untouched:
        the probe's gradients are dropped and its tokens come from a generator of its own."""
        gen = torch.Generator().manual_seed(self.seed)
        vocab = self.config.vocab_size
        runs, times = [], []
        for i, layout in enumerate(self.candidates):
            budget, mode = _largest_budget(self.planner, i, self.recompute_modes)
            hold = min(budget, self.max_context)
            if hold < 16:
                continue  # it holds no sequence worth timing
            self._stage = f"start-up probe: switching parameters {self.home.name} -> {layout.name}"
            params, _ = self._enter(0, layout, None, None)
            model = self._model(layout, params)
            packs = self._probe_packs(i, layout, mode, hold, model)
            self._stage = f"start-up probe: forward and backward under {layout.name}"
            for pack, graphed, pack_mode in packs:
                model.recompute = pack_mode
                mbs = [MicroBatch.from_sequences([torch.randint(0, vocab, (n,), generator=gen) for n in micro])
                       for micro in pack]
                # From the graphs, the first run compiles, the second captures, and the third
                # replays, as every later step does.
                for timed in ([False] * (2 if any(graphed) else 1)) + [True]:
                    model.zero_grad()
                    t0 = time.perf_counter()
                    model.forward_backward(mbs, 1.0, graph_tokens=graphed)
                    model.finish_gradients()
                    if timed:
                        times.append(time.perf_counter() - t0)
            self._release(model)
            del params
            self._warm[layout.name] = self._warm.get(layout.name, 0) + 1
            runs.append((layout, packs))
        self._stage = "start-up probe: agreeing on the times"
        measured = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(measured, op=dist.ReduceOp.MAX, group=self.control)
        seconds = iter(measured.tolist())
        report = {}
        for layout, packs in runs:
            eager = {}  # the time of each pack run as it is, by its lengths and mode
            for pack, graphed, mode in packs:
                t = next(seconds)
                tokens = [graphed] * layout.dp if self._graph_overhead is not None else None
                self.calibration.observe_phase(layout, [pack] * layout.dp, t, mode, graph_tokens=tokens)
                key = (str(pack), mode)
                if not any(graphed):
                    eager[key] = t
                elif key in eager and all(b == sum(micro) for b, micro in zip(graphed, pack)):
                    self.calibration.observe_graph_saving(layout, list(graphed), eager[key], t)
                report.setdefault(layout.name, []).append(
                    f"{len(pack)}x{pack[0]} tokens{' from the graphs' if any(graphed) else ''} {1e3 * t:.1f} ms")
            self._measured.add(layout.name)
        _log.info("start-up probe, slowest rank: %s", report)
        if self._graph_overhead is not None and not self.calibration.graph_savings:
            _log.warning("start-up probe: no layout runs a graph bucket of 16 tokens or more from the "
                         "graphs here, so the graphs' saving is unmeasured; the graph overhead stays %s",
                         "as given" if self.settings.graph_layer_overhead_seconds is not None else
                         "the layer overhead (the graphs save nothing)")
        self._refit(f"after the start-up probe ({len(runs)} layouts, {measured.sum().item():.3f} s)")
        self._apply_fit()
        self._probed = True
        if not home_given:
            best = self._home(None, self._free_planner())
            if best.name != self.home.name:
                _log.info("start-up probe: the fitted model prefers the home %s to %s for a %d-token sequence",
                          best.name, self.home.name, self.max_context)
                self.move_home(best)

    def _probe_packs(self, index: int, layout, mode: str, hold: int, model) -> List[Tuple[List[List[int]], List[int], str]]:
        """The start-up probe's micro-batches under candidate ``index`` (``layout``), which holds
        ``hold`` tokens per micro-batch under ``mode``, and whose ``model`` runs them: (sequence
        lengths per micro-batch, the graph bucket each runs padded to, 0: as it is, the
        recomputation) per timed run. ``PROBE_PACKS`` as the plans would run them, under
        ``mode``; then, where the layout runs graphs, one sequence of its smallest and of its
        largest bucket of at least 16 tokens that it holds and runs from the graphs, each as it
        is and from the graphs, filling the bucket (the same work, with and without the
        launches), under the first allowed recomputation that runs graphs and holds the bucket."""
        per = 2 * layout.pp if layout.pp > 1 else 1
        out = []
        for f, cut in PROBE_PACKS:
            pack = [[int(hold * f) // cut] * cut for _ in range(per)]
            out.append((pack, _ran_graphs(model, [self.cost.graph_tokens(layout, micro, mode) for micro in pack], mode),
                        mode))
        if self._graph_overhead is None:
            return out
        held = {}  # bucket -> the recomputation it runs under
        for m in self.recompute_modes:
            if not self.cost.terms(layout, m).graphs:
                continue
            room = min(self.planner.candidate_model(index, m).budget, self.max_context)
            for b in self.settings.graph_buckets:
                if 16 <= b <= room and b not in held and model.runs_graphed(b, m):
                    held[b] = m
        for bucket in sorted({min(held), max(held)}) if held else []:
            out += [([[bucket]], [0], held[bucket]), ([[bucket]], [bucket], held[bucket])]
        return out

    def _grads_home(self, model, layout, ph):
        """This phase's gradients as home-layout tensors (the home placement's shards or ZeRO
        flat buffer), summed over the phase's data replicas; (grads, method, bytes moved)."""
        method = ph.grad_method if self.grad_method == "auto" else self.grad_method
        if layout.name == self.home.name and not self.zero:
            model.reduce_gradients()
            return {n: g.clone() for n, g in model.grad_shards().items()}, "local", 0
        if method == "reduce":
            model.reduce_gradients()
            r = self._switch(model.grad_shards(), layout, self.home, dst_kind=self.home_placement)
            return r.shards, "reduce", r.stats["bytes_moved"]
        # The summands, summed by the switch; under ZeRO also the home phase's own ("local")
        # reduction, which lands in its shards the same way.
        r = self._switch(model.grad_shards(), layout, self.home, src_kind="partial", dst_kind=self.home_placement)
        return r.shards, "partial", r.stats["bytes_moved"]

    def _grad_squares(self, accumulator) -> torch.Tensor:
        """This rank's share of the squared global L2 norm of the step's gradients (the home
        accumulator), float64, shape (1,): the squares of the pieces it owns (``owned_pieces``,
        as checkpoints write them), so that the sum over ranks counts every element once
        whatever the layout."""
        if self._owned is None:
            mine = owned_pieces(self.tensor_set, self.home, self.home_placement).get(self.rank, set())
            self._owned = [(buffer, offset, strides, [b - a for a, b in zip(lo, hi)])
                           for t, lo, hi, buffer, offset, strides, _ in
                           _C.Placement(self.tensor_set, self.home, self.home_placement).pieces(self.rank)
                           if (t, tuple(lo), tuple(hi)) in mine]
        buffers = [accumulator.reshape(-1)] if self.zero else [accumulator[n] for n in self.master]
        total = torch.zeros(1, dtype=torch.float64)
        for buffer, offset, strides, sizes in self._owned:
            total += buffers[buffer].as_strided(sizes, strides, offset).double().pow(2).sum()
        return total

    def _nonfinite(self, accumulator) -> torch.Tensor:
        """How many of this rank's gradient tensors hold an inf or NaN, float64, shape (1,)."""
        buffers = [accumulator] if self.zero else accumulator.values()
        return torch.tensor([sum(float(not bool(torch.isfinite(g).all())) for g in buffers)], dtype=torch.float64)

    @staticmethod
    def _add(acc, grads):
        if isinstance(acc, torch.Tensor):
            return acc.add_(grads)
        for n, g in grads.items():
            acc[n].add_(g)
        return acc

    # ----------------------------------------------------------------------------- home

    def _rehome(self) -> None:
        """After a step, with ``home_window``: the home with the least predicted time over the
        last batches (``hotswitch.planner.choose_home``, every candidate weighed with its own
        switch costs), moved to when its mean saving per batch, over ``home_window`` batches,
        exceeds what the move costs
        (three fp32 copies of the parameters, masters and Adam's moments, in the home
        placement, at the re-calibrated switch scale). Every rank decides alike: the same
        batches and the agreed cost model."""
        names = [l.name for l in self.candidates]
        home = names.index(self.home.name)
        params = self._costs[0]
        planners = {home: self.planner}

        def planner_for(h):
            if h not in planners:
                planners[h] = self._build_planner(home=h, costs=self._switch_costs(h, params))
            return planners[h]

        def move_seconds(a, b):
            plan = plan_switch(self.tensor_set, self.candidates[a], self.candidates[b], src_kind=self.home_placement,
                               dst_kind=self.home_placement, topology=self.topology, cache=self._plan_cache)
            return 3 * redistribution_seconds(plan, self.hardware, self.topology) * self._switch_scale

        self._stage = "choosing the home"
        new, totals = choose_home(planner_for, range(len(names)), list(self._recent), current=home,
                                  move_seconds=move_seconds, horizon=self.settings.home_window)
        if _log.isEnabledFor(logging.DEBUG):
            _log.debug("step %d: predicted seconds over the last %d batches per home %s; moves from %s %s", self.step,
                       len(self._recent), {names[h]: round(t, 4) for h, t in totals.items()}, names[home],
                       {names[h]: round(move_seconds(home, h), 4) for h in totals if h != home})
        if new != home:
            _log.info("step %d: home %s -> %s: %.3f s against %.3f s predicted over the last %d batches, a move of "
                      "%.3f s", self.step, names[home], names[new], totals[new], totals[home], len(self._recent),
                      move_seconds(home, new))
            self.move_home(self.candidates[new])

    def recent_batches(self) -> Optional[List[List[int]]]:
        """The lengths of the last batches the home is chosen over (``home_window``), for
        checkpoints; None without a window."""
        return [list(b) for b in self._recent] if self.settings.home_window else None

    def resume_home(self, home: Optional[str], recent: Optional[Sequence[Sequence[int]]]) -> None:
        """After a checkpoint load, with ``home_window``: moves the home to the one the run
        had when it saved (when it is a candidate here) and restores the batches the home is
        chosen over, so that a resumed run continues as the uninterrupted one. Collective."""
        if not self.settings.home_window:
            return
        names = [c.name for c in self.candidates]
        if home in names and home != self.home.name:
            self.move_home(home)
        self._recent.clear()
        for lengths in recent or []:
            self._recent.append([int(n) for n in lengths])

    def move_home(self, layout) -> int:
        """Moves the home layout, which holds the master weights, the optimizer's state and the
        gradient accumulator, to ``layout`` (a candidate, or its name), between steps: the
        masters and every optimizer state tensor shaped like them (Adam's moments) are switched
        from the old home's placement to the new one's, bit for bit, and the planner is rebuilt
        around the new home. Collective; every rank must pass the same layout. Returns the
        bytes this rank sent.

        ValueError, with nothing changed, for a layout that is not a candidate or differs
        between ranks; a failed switch raises and leaves the old home and its state intact
        (nothing is replaced until every tensor has arrived). ``hotswitch.planner.choose_home``
        says when a move pays."""
        names = [l.name for l in self.candidates]
        error, index = None, -1
        try:
            target = Layout.parse(layout) if isinstance(layout, str) else layout
            if not isinstance(target, _C.Layout) or target.name not in names:
                raise ValueError(f"home layout {layout!r} is not among the candidates {names}")
            index = names.index(target.name)
        except ValueError as e:
            error = e
        # Every rank learns whether all ranks name the same valid layout.
        both = torch.tensor([index, -index], dtype=torch.int64)
        dist.all_reduce(both, op=dist.ReduceOp.MAX, group=self.control)
        if error is not None:
            raise error
        if int(both[0]) != -int(both[1]):
            raise ValueError(f"ranks name different home layouts (this rank {names[index]}); every rank must "
                             f"move the home to the same layout")
        target = self.candidates[index]
        if target.name == self.home.name:
            return 0
        groups = self.optimizer.param_groups
        if len(groups) != 1 or len(groups[0]["params"]) != len(self.master):
            raise ValueError(f"move_home needs an optimizer with the master tensors in one parameter group, got "
                             f"{len(groups)} groups")
        old = self.home
        kind = self.home_placement
        self._stage = f"moving the home {old.name} -> {target.name}"
        params = list(self.master.values())
        states = [self.optimizer.state.get(p, {}) for p in params]
        # What moves: the masters, and per optimizer state key the tensors shaped like them
        # (Adam's moments); what is the same for every master (Adam's step) is kept.
        keys = sorted(k for k in (states[0] if states else {})
                      if all(isinstance(st.get(k), torch.Tensor) and st[k].shape == p.shape and st[k].dim() > 0
                             for st, p in zip(states, params)))
        kept = {k: v for k, v in (states[0] if states else {}).items() if k not in keys}

        def as_shards(tensors):
            return tensors[0] if self.zero else dict(zip(self.master.keys(), tensors))

        moved, sent = {}, 0
        for key, tensors in [(None, [p.detach() for p in params])] + \
                [(k, [st[k] for st in states]) for k in keys]:
            r = self._switch(as_shards(tensors), old, target, src_kind=kind, dst_kind=kind)
            moved[key] = {"zero": r.shards} if self.zero else r.shards
            sent += r.bytes_sent
        # Every tensor has arrived: only now is anything replaced. The new home's ranks may hold
        # other tensors (another pipeline stage), so the masters are new parameters.
        master = {n: torch.nn.Parameter(t) for n, t in moved[None].items()}
        state = collections.defaultdict(dict)
        if states and states[0]:
            for n, p in master.items():
                state[p] = {**{k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in kept.items()},
                            **{k: moved[k][n] for k in keys}}
        groups[0]["params"] = list(master.values())
        self.optimizer.state = state
        self.master = master
        self.home = target
        self._owned = None
        self._models.clear()
        self._costs = None
        # Under graph_layouts="auto", before the first step chooses them: the new home's graphs.
        self.cost = self._cost_model(self.hardware)
        self._widen_calibration_graphs()
        self.planner = self._build_planner()
        self._restricted = {}
        _log.info("home moved %s -> %s: masters and %d optimizer state tensors each, %d B sent by rank %d",
                  old.name, target.name, len(keys), sent, self.rank)
        return sent

    # ----------------------------------------------------------------------------- state

    def full_weights(self) -> Dict[str, torch.Tensor]:
        """The full logical weights (name -> tensor of the spec's full shape) on every rank.
        Collective; it gathers the whole model on each rank, so it is meant for tests and small
        models (checkpoints never gather)."""
        everyone = Layout(dp=self.world, tp=1, pp=1)
        self._stage = "gathering the full weights"
        return self._switch(self._master_shards(), self.home, everyone, src_kind=self.home_placement).shards

    def state_dict(self) -> dict:
        """This rank's training state under the home layout, what ``hotswitch.checkpoint``
        writes by logical box: ``{"step": int, "params": [this rank's master tensors, in the
        home placement's order (one flat buffer under ZeRO)], "optimizer": the optimizer's
        ``state_dict()``, its state keyed by the index in "params", "skipped": steps without an
        optimizer update, "grad_scaler": the loss scaler's ``state_dict()`` or None}``. The
        tensors are the runtime's own (detached, not copies)."""
        return {"step": self.step, "params": [p.detach() for p in self.master.values()],
                "optimizer": self.optimizer.state_dict(), "skipped": self.skipped,
                "grad_scaler": None if self.scaler is None else self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Takes a ``state_dict()`` of this home layout and placement (tensors of the same
        shapes); ValueError, with nothing changed, when it does not match. "skipped" and
        "grad_scaler" may be left out (states saved before they existed): then 0 and the
        scaler's settings' initial state."""
        masters = list(self.master.values())
        if not isinstance(state, dict) or not {"optimizer", "params", "step"} <= set(state) or \
                not set(state) <= {"optimizer", "params", "step", "skipped", "grad_scaler"}:
            raise ValueError(f"a runtime state must be a dict with keys optimizer, params, step (and optionally "
                             f"skipped, grad_scaler), got "
                             f"{sorted(state) if isinstance(state, dict) else type(state).__name__}")
        params = state["params"]
        if len(params) != len(masters) or any(
                not isinstance(t, torch.Tensor) or t.shape != p.shape for t, p in zip(params, masters)):
            raise ValueError(f"the state's params ({[tuple(getattr(t, 'shape', ())) for t in params]}) do not match "
                             f"this runtime's master tensors ({[tuple(p.shape) for p in masters]})")
        step = state["step"]
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"the state's step must be an int >= 0, got {step!r}")
        skipped = state.get("skipped", 0)
        if isinstance(skipped, bool) or not isinstance(skipped, int) or not 0 <= skipped <= step:
            raise ValueError(f"the state's skipped must be an int in [0, step({step})], got {skipped!r}")
        scaler = None
        if self.scaler is not None:
            scaler = GradScaler(self.scaler.settings)
            if state.get("grad_scaler") is not None:
                scaler.load_state_dict(state["grad_scaler"])
        self.optimizer.load_state_dict(state["optimizer"])
        with torch.no_grad():
            for p, value in zip(masters, params):
                p.copy_(value)
        self.step = step
        self.skipped = skipped
        self.scaler = scaler

    def save_checkpoint(self, root: str, data_state: Optional[dict] = None, extra: Optional[dict] = None,
                        ckpt_format: str = "hotswitch") -> str:
        """Saves a layout-independent checkpoint under ``root/step_<N>`` (see
        ``hotswitch.checkpoint``); returns its path. Collective. ``ckpt_format="torch_dist"``
        writes it through ``torch.distributed.checkpoint`` (``hotswitch.dist_checkpoint``)."""
        return checkpoint.save(self, root, data_state=data_state, extra=extra, ckpt_format=ckpt_format)

    def load_checkpoint(self, path: str, optimizer: bool = True, rng: bool = True, reset_step: bool = False) -> dict:
        """Loads a checkpoint saved under any home layout and world the model allows; returns
        ``{"step", "data_state", "extra"}``. Collective; ``CheckpointError`` (a ValueError)
        on every rank, with nothing changed, for a bad checkpoint. ``optimizer=False``: the
        weights only (Megatron-LM's ``--no-load-optim``); ``rng=False``: keep this process's
        RNG states (``--no-load-rng``); ``reset_step=True``: count steps from 0 and return no
        data position (``--finetune``, with both off). See ``hotswitch.checkpoint.load``."""
        return checkpoint.load(self, path, optimizer=optimizer, rng=rng, reset_step=reset_step)
