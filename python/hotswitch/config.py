"""``RuntimeConfig``: every setting of a ``Runtime``, one field each. The ranks of a job agree
on all of its fields when the runtime is built (a digest of every field, so no new setting can
be left out of the check). The command line maps Megatron-LM's arguments onto it in one place,
``hotswitch.cli.train.runtime_config``.
"""

import dataclasses
import math
from typing import List, Optional, Sequence, Union

from hotswitch._C import HardwareProfile, Layout, Topology
from hotswitch._checks import check_bool, check_choice, check_int, check_token_counts
from hotswitch.precision import LossScaling
from hotswitch.redistribute import DEFAULT_TIMEOUT_S

__all__ = ["GRAD_METHODS", "NONFINITE_POLICIES", "RECOMPUTE_CHOICES", "RuntimeConfig"]

# How a phase's gradients reach the home accumulator: "auto" takes the planner's choice per
# phase; the others force one of the planner's methods ("local" is the home layout's own).
GRAD_METHODS = ("auto", "partial", "reduce")
NONFINITE_POLICIES = ("raise", "skip")
# Activation recomputation: Megatron-LM's granularities for every phase, or the planner's
# choice per phase ("auto").
RECOMPUTE_CHOICES = ("none", "selective", "full", "auto")


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """The settings of a ``hotswitch.Runtime``. Checked when built: a bad value raises
    ``ValueError`` naming the field."""

    candidates: Union[str, Sequence[Union[str, Layout]]] = "auto"
    """``"auto"`` (every layout of the world the model divides, cp up to ``max_cp``) or the
    layouts the planner may use, as ``Layout`` objects or names like ``"dp2tp2"`` or
    ``"dp2cp2"``."""

    max_cp: int = 1
    """Under ``candidates="auto"``, the largest context-parallel degree among the candidates
    (Megatron-LM's ``--context-parallel-size`` under ``--hot-switch``): the planner may then
    run a bucket of long sequences under cp and switch to and away from it within a step."""

    home: Optional[Union[str, Layout]] = None
    """The layout of the master weights, optimizer state and gradient accumulator. Default:
    the candidate the planner finds fastest for a batch of one ``max_context`` sequence, what
    a static run would pick."""

    hardware: Optional[HardwareProfile] = None
    """The cost model's hardware profile (a preset or calibrated). Default: the ``a800`` preset (as the dry run's)."""

    memory_budget_bytes: Optional[int] = None
    """Per-rank memory the planner never exceeds, overriding the profile's ``memory_bytes``."""

    max_context: Optional[int] = None
    """The longest sequence a step may hold, in tokens. Default: the model's
    ``max_position_embeddings``."""

    max_tokens_per_micro_batch: Optional[int] = None
    """A cap on a micro-batch's tokens below what memory allows (Megatron's micro-batch size
    times the sequence length); at least ``max_context``. Default: memory alone decides."""

    zero: bool = False
    """ZeRO-1: master weights and optimizer state sharded over the home layout's data group."""

    grad_method: str = "auto"
    """How a phase's gradients move into the home accumulator: ``"auto"`` (the planner's
    cheaper choice per phase), ``"partial"`` (unreduced summands, summed by the switch) or
    ``"reduce"`` (reduced over the phase's data group, then switched)."""

    seed: int = 0
    """Seed of the initial weights: the same logical weights whatever the layout."""

    timeout: float = DEFAULT_TIMEOUT_S
    """Seconds every switch and the runtime's own collectives wait for a peer before raising
    ``SwitchTimeout``/``SwitchFault``."""

    recalibrate: bool = True
    """Refit the cost model from measured times after every step (``hotswitch.calibration.online``).
    Plans then follow the machine; pass ``False`` for bit-reproducible runs and bitwise resumes."""

    nonfinite: str = "raise"
    """A NaN or infinite loss raises ``NonFiniteLoss`` (``"raise"``) or skips the optimizer step
    (``"skip"``)."""

    clip_grad: Optional[float] = None
    """Clip the global L2 norm of each step's gradients to this value (Megatron's
    ``--clip-grad``): every gradient is scaled by ``clip_grad / (norm + 1e-6)`` when that is
    below 1. The norm counts every element once whatever the layout. ``None``: no clipping
    (the norm is still computed and reported)."""

    loss_scaling: Optional[LossScaling] = None
    """Scale the loss before the backward pass and the gradients back before the optimizer
    (``hotswitch.precision.LossScaling``; Megatron's fp16 recipe): a step whose gradients hold
    an inf or NaN on any rank is skipped (no optimizer update) and a dynamic scale shrinks.
    ``None``: no scaling (fp32 or bf16 compute)."""

    topology: Optional[Topology] = None
    """Ranks per node. Default: ``LOCAL_WORLD_SIZE`` (torchrun's) ranks per node, or one node."""

    recompute: str = "none"
    """Activation recomputation (Megatron-LM's ``--recompute-granularity``): ``"none"``;
    ``"selective"``, every layer's attention core reruns in the backward pass; ``"full"``, only
    the layers' inputs are kept and their forward reruns in the backward pass; ``"auto"``, the
    planner chooses per phase, paying for recomputation only in the phases whose layouts
    hold their sequences faster or at all with it. The cost model prices each choice; the
    gradients are the same."""

    min_gain: float = 0.01
    """A planned step switches layouts only when the planner predicts it at least this fraction
    faster than the same step run as one phase under the home layout (or the best static
    layout); otherwise it runs as that one phase. 0.01: 1%, the size of the cost model's
    error on runs it never saw."""

    home_window: int = 0
    """After every step, re-choose the home over the last ``home_window`` batches
    (``hotswitch.planner.choose_home``) and move it (``Runtime.move_home``: masters and
    optimizer state, bit for bit) when another home's predicted saving over those batches
    exceeds the move's cost. 0: the home stays where it started."""

    trust_error: Optional[float] = 0.25
    """Protects the run while the cost model learns the machine. A layout other than the home
    is trusted once a warm phase under it (not its first in this process), planned with a
    re-calibrated model, ran within this relative error of its predicted compute time, and
    loses that trust when one does not.
    A step may try at most one untrusted layout; a layout whose phase disagreed is left out
    of the next 1, 2, 4, ... steps (doubling with each disagreement) while the re-calibrated
    model catches up. Applies with ``recalibrate`` (without it the model is fixed and plans
    are reproducible). None: every layout's prediction is relied on from the first step."""

    explore: Optional[float] = None
    """The uncertainty, as a fraction u, of a layout the re-calibrating model has not yet
    measured, which it may price far off. A plan relying on it prices its phases at (1 + u)
    times the prediction; and from the second step on a step tries one such layout, on its
    shortest pieces up to about a quarter of the step's tokens (the home running the rest),
    when at (1 - u) times the prediction that would beat the plan. Once measured, a layout is
    planned and trusted (``trust_error``) like every other. Applies with ``recalibrate`` and
    ``trust_error``, not under a fixed plan. None (the default for now): only the predictions
    choose; 0.5 is the value measured in ``benchmarks.train``."""

    switch_compute_dtype: bool = True
    """Under a ``compute_dtype`` narrower than the master weights (bf16 compute, fp32
    masters), a phase's parameters travel between layouts in the compute dtype wherever the
    model uses them only in it (the layers' four matrices and an untied head), widened again
    on arrival: about half the bytes of every parameter switch, and the same results bit for
    bit (the model's compute copy of such a weight is the same bf16 value either way).
    Gradients, masters and optimizer state move at full width. Not under ``zero`` (the
    masters are one flat buffer there). False: parameters travel at the masters' width."""

    probe: bool = False
    """Before the first step, time every candidate layout's forward and backward on synthetic
    micro-batches (a short sequence, a long one and the long one's tokens cut into four, each
    after a run of the same shape that warms it), refit the cost model to those times, layout
    factors included, and, unless ``home`` names it, move the home to the layout the fitted
    model prefers: the first steps are planned with this machine's costs instead of the
    starting profile's. Costs six forward and backward passes per layout at start-up; needs
    ``recalibrate``. The weights, optimizer state and data are untouched."""

    fixed_plan: Optional[Union[str, Sequence]] = None
    """A hand-written plan that replaces the planner's choice every step: a JSON file or a list
    of ``[upper_bound, layout, recompute]`` entries, bounds increasing
    (``hotswitch.planner.load_fixed_plan``). Each length runs under the first entry that holds
    it, with the planner's packing, switches and gradient methods. None: the planner plans."""

    recompute_num_layers: int = 1
    """Under full recomputation, the layers of one recomputed chunk: each chunk keeps its input
    only (Megatron-LM's ``--recompute-method uniform --recompute-num-layers``)."""

    compile_layers: bool = False
    """Regional compilation: every layout's model compiles each layer's forward with
    ``torch.compile`` (``ParallelTransformer(compile_layers=True)``: inductor fuses the layer's
    element-wise steps instead of the Triton kernels). The first micro-batch under each layout
    compiles it, and the start-up probe, when on, times the compiled layers."""

    graph_buckets: Optional[List[int]] = None
    """Token counts at which the layers of layouts with pp and cp 1 (at tp > 1, where every
    bucket is a multiple of tp) run from CUDA graphs (``ParallelTransformer(graph_buckets=...)``):
    the planner pads a micro-batch to the
    smallest that holds it when the padding costs less than the launches it saves
    (``CostModel(graph_buckets=...)``), and the plan's ``graph_tokens`` say which. Needs
    ``graph_layer_overhead_seconds`` or the start-up ``probe``, which measures it."""

    graph_layer_overhead_seconds: Optional[float] = None
    """The fixed seconds per layer of a micro-batch run from the graphs, in place of the
    hardware profile's ``layer_overhead_seconds``: measured on the device
    (``hotswitch.calibration.measure_micro_batch(..., graphs=True)``), and refitted with the
    profile under ``recalibrate``. The start-up ``probe`` measures it: each layout that runs graphs
    runs one sequence of its smallest and of its largest bucket it holds, as it is and
    from the graphs, and the graph overhead becomes the refitted layer overhead less the
    measured saving per layer (replacing a given one). None, under ``probe`` only: until a
    saving is measured the graphs are priced as saving nothing."""

    graph_layouts: Union[None, str, Sequence[Union[str, Layout]]] = None
    """Under ``graph_buckets``, the candidate layouts whose models capture CUDA graphs, as
    ``Layout`` objects or names (None: every candidate that can). Each such model keeps its
    graphs' weight copies while other layouts run, which the planner holds in every layout's
    memory (``CostModel(graph_layouts=...)``): with many candidates, naming a few leaves the
    others room for larger micro-batches. The layouts not named run as without graph buckets.

    ``"auto"``: the runtime names them itself (``Runtime.graph_layouts``): the home alone until
    the first training step, then the home of that step and every layout that a planner
    without graph buckets gives its batch (``hotswitch.planner.auto_graph_layouts``), kept for
    the rest of the process's run even when the home moves (a resumed run chooses again at its
    first step); the home alone when their copies would leave no layout that holds a
    ``max_context`` sequence (or a fixed plan's bounds), none when even the home's would."""

    def __post_init__(self):
        check_choice("nonfinite", self.nonfinite, NONFINITE_POLICIES)
        check_choice("grad_method", self.grad_method, GRAD_METHODS)
        check_bool("zero", self.zero)
        check_bool("recalibrate", self.recalibrate)
        check_bool("probe", self.probe)
        check_bool("switch_compute_dtype", self.switch_compute_dtype)
        check_bool("compile_layers", self.compile_layers)
        if self.probe and not self.recalibrate:
            raise ValueError("probe=True needs recalibrate=True: the probe's times refit the cost model")
        check_int("seed", self.seed, 0)
        check_int("max_cp", self.max_cp, 1)
        check_choice("recompute", self.recompute, RECOMPUTE_CHOICES)
        check_int("recompute_num_layers", self.recompute_num_layers, 1)
        check_int("home_window", self.home_window, 0)
        if isinstance(self.min_gain, bool) or not isinstance(self.min_gain, (int, float)) or not (
                math.isfinite(self.min_gain) and self.min_gain >= 0):
            raise ValueError(f"min_gain must be a fraction >= 0 (0.01: 1%), got {self.min_gain!r}")
        if self.trust_error is not None and (isinstance(self.trust_error, bool) or not isinstance(
                self.trust_error, (int, float)) or not (math.isfinite(self.trust_error) and self.trust_error > 0)):
            raise ValueError(f"trust_error must be a fraction > 0 (0.25: 25%) or None, got {self.trust_error!r}")
        if self.explore is not None and (isinstance(self.explore, bool) or not isinstance(
                self.explore, (int, float)) or not (math.isfinite(self.explore) and 0 <= self.explore < 1)):
            raise ValueError(f"explore must be a fraction in [0, 1) (0.5: 50%) or None, got {self.explore!r}")
        if self.fixed_plan is not None:
            from hotswitch.planner import load_fixed_plan
            load_fixed_plan(self.fixed_plan, None)  # its form; world, model and memory at the runtime
        if isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float)) or not self.timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {self.timeout!r}")
        for name in ("max_context", "max_tokens_per_micro_batch", "memory_budget_bytes"):
            if getattr(self, name) is not None:
                check_int(name, getattr(self, name), 1)
        if self.clip_grad is not None and (isinstance(self.clip_grad, bool) or not isinstance(
                self.clip_grad, (int, float)) or not math.isfinite(self.clip_grad) or self.clip_grad <= 0):
            raise ValueError(f"clip_grad must be a positive finite number or None, got {self.clip_grad!r}")
        if self.hardware is not None and not isinstance(self.hardware, HardwareProfile):
            raise ValueError(f"hardware must be a hotswitch.HardwareProfile, got {type(self.hardware).__name__}")
        if self.loss_scaling is not None and not isinstance(self.loss_scaling, LossScaling):
            raise ValueError(f"loss_scaling must be a hotswitch.precision.LossScaling or None, got "
                             f"{self.loss_scaling!r}")
        if self.topology is not None and not isinstance(self.topology, Topology):
            raise ValueError(f"topology must be a hotswitch.Topology, got {self.topology!r}")
        if self.graph_buckets is not None:
            check_token_counts("graph_buckets", self.graph_buckets)
            g = self.graph_layer_overhead_seconds
            if g is None and not self.probe:
                raise ValueError("graph_buckets needs graph_layer_overhead_seconds (measured with "
                                 "hotswitch.calibration.measure_micro_batch(..., graphs=True)) or probe=True, whose "
                                 "start-up probe measures it; got neither")
            if g is not None and (isinstance(g, bool) or not isinstance(g, (int, float)) or
                                  not (math.isfinite(g) and g >= 0)):
                raise ValueError(f"graph_layer_overhead_seconds must be finite seconds >= 0 (measured with "
                                 f"hotswitch.calibration.measure_micro_batch(..., graphs=True)), got {g!r}")
        elif self.graph_layer_overhead_seconds is not None:
            raise ValueError(f"graph_layer_overhead_seconds ({self.graph_layer_overhead_seconds!r}) needs graph_buckets")
        if self.graph_layouts is not None:
            if self.graph_buckets is None:
                raise ValueError(f"graph_layouts ({self.graph_layouts!r}) needs graph_buckets")
            if not self.auto_graph_layouts:
                self.graph_layout_names()

    @property
    def auto_graph_layouts(self) -> bool:
        """Whether the runtime chooses the layouts that capture graphs (``graph_layouts="auto"``)."""
        return isinstance(self.graph_layouts, str) and self.graph_layouts == "auto"

    def check_graph_layouts(self, candidates) -> None:
        """``ValueError`` when ``graph_layouts`` names a layout that is not among ``candidates``
        (the candidate layouts of the run)."""
        if self.auto_graph_layouts:
            return  # chosen among them
        names = [c.name for c in candidates]
        stray = [n for n in self.graph_layout_names() or [] if n not in names]
        if stray:
            raise ValueError(f"graph_layouts {stray} are not among the candidate layouts {names}")

    def graph_layout_names(self) -> Optional[List[str]]:
        """``graph_layouts`` as layout names (``Layout.name``), or None: every layout that can
        capture graphs does. ``ValueError`` for a name that is no layout, a repeat, or an empty
        list, and under ``"auto"``, which names none until a runtime chooses them."""
        if self.graph_layouts is None:
            return None
        if self.auto_graph_layouts:
            raise ValueError("graph_layouts='auto' names no layouts until a runtime chooses them at its first step "
                             "(Runtime.graph_layouts)")
        if isinstance(self.graph_layouts, (str, Layout)) or not isinstance(self.graph_layouts, (list, tuple)) or \
                not self.graph_layouts:
            raise ValueError(f"graph_layouts must be 'auto' or a non-empty list of layouts or their names (or None: "
                             f"every layout that can), got {self.graph_layouts!r}")
        names = []
        for i, v in enumerate(self.graph_layouts):
            if isinstance(v, Layout):
                names.append(v.name)
            elif isinstance(v, str):
                try:
                    names.append(Layout.parse(v).name)
                except ValueError as e:
                    raise ValueError(f"graph_layouts[{i}] is {v!r}, not a layout name like 'dp2tp2': {e}") from None
            else:
                raise ValueError(f"graph_layouts[{i}] must be a Layout or a name like 'dp2tp2', got {v!r}")
            if names[-1] in names[:-1]:
                raise ValueError(f"graph_layouts names {names[-1]} twice")
        return names

    @property
    def tp_overlap(self) -> float:
        """The cost model's ``tp_overlap``: the share of the tp backward's column-parallel
        collectives that hide behind their products. The eager layers run them beside the
        products (1); compiled layers wait for each where it is posted (0)."""
        return 0.0 if self.compile_layers else 1.0

    @property
    def recompute_chunk_layers(self) -> int:
        """The cost model's ``recompute_chunk_layers``: full recomputation reruns each chunk of
        ``recompute_num_layers`` layers under PyTorch's non-reentrant checkpoint, which stops
        after the last tensor the chunk's backward saved (its last reduce-scatter is not posted
        again). 0 under ``compile_layers``: a compiled layer's saved tensors come out of its
        compiled forward whole, so its rerun is not known to stop early (unmeasured)."""
        return 0 if self.compile_layers else self.recompute_num_layers

    def graph_options(self, hardware: "HardwareProfile", graph_layer_overhead_seconds: Optional[float] = None,
                      model=None, graph_max_scores: Optional[int] = None,
                      graph_layouts: Optional[Sequence[str]] = None) -> dict:
        """The cost model's keyword arguments for the CUDA graph buckets (none without), with
        ``graph_layer_overhead_seconds`` when given (a measured one), else this config's; left to
        the probe, ``hardware``'s layer overhead: the graphs save nothing until measured. With the
        ``model`` (a ``TransformerConfig``) computing in a narrower ``compute_dtype``, the bytes of
        the matrix copies the graphs read (``graph_copy_param_bytes``). ``graph_max_scores``: the
        attention kernel's bound on a static pack where it has one
        (``PackAttention.max_static_scores``; None: every bucket's attention is static).
        ``graph_layouts``: under ``"auto"``, the names chosen (needed there)."""
        if self.graph_buckets is None:
            return {}
        if self.auto_graph_layouts and graph_layouts is None:
            raise ValueError("graph_layouts='auto' needs the layouts chosen (graph_layouts=[names]) for the cost "
                             "model's options")
        g = self.graph_layer_overhead_seconds if graph_layer_overhead_seconds is None else graph_layer_overhead_seconds
        out = dict(graph_buckets=sorted(self.graph_buckets),
                   graph_layer_overhead_seconds=float(hardware.layer_overhead_seconds if g is None else g))
        if model is not None and model.compute_dtype is not None:
            out["graph_copy_param_bytes"] = 2  # bfloat16 and float16
        if graph_max_scores is not None:
            out["graph_max_scores"] = int(graph_max_scores)
        if self.auto_graph_layouts:
            out["graph_layouts"] = list(graph_layouts)
        elif self.graph_layouts is not None:
            out["graph_layouts"] = self.graph_layout_names()
        return out

    def digest_fields(self) -> tuple:
        """Every field as plain values (layouts by name, profiles by their fields), in field
        order: what the ranks compare."""
        def plain(value):
            if isinstance(value, Layout):
                return value.name
            if isinstance(value, HardwareProfile):
                return tuple(sorted(value.to_dict().items()))
            if isinstance(value, Topology):
                return (value.world, value.ranks_per_node)
            if isinstance(value, LossScaling):
                return dataclasses.astuple(value)
            if isinstance(value, (list, tuple)):
                return tuple(plain(v) for v in value)
            return value

        return tuple((f.name, plain(getattr(self, f.name))) for f in dataclasses.fields(self))
