"""Where a training step's time goes, read from a PyTorch profiler trace.

``torch.profiler.profile(...).export_chrome_trace(path)`` writes the Chrome trace format that
Perfetto and Holistic Trace Analysis read: ``{"traceEvents": [...]}``, each complete event
(``"ph": "X"``) with a category ``cat``, a ``name``, a start ``ts`` and a duration ``dur`` in
microseconds. The categories read here:

- ``kernel``, ``gpu_memcpy``, ``gpu_memset``: work on the GPU (a CUDA trace);
- ``cuda_runtime``: the host's calls into CUDA, among them the ones that wait for the device
  (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``, ``cudaEventSynchronize``, the
  synchronous ``cudaMemcpy``);
- ``cpu_op``: PyTorch operators on the host; in a trace without GPU work the operators that
  do work themselves are the work (``_work_ops``: not a view or allocation, and calling no
  operator that does work);
- ``user_annotation``: ``torch.profiler.record_function`` ranges, which mark the windows to
  summarise (``summarize(events, window="step")``).

``summarize`` returns a ``TraceSummary`` per trace: the windows' wall time, how much of it the
device was busy (the union of its work intervals: whatever else is wall time is the host's —
Python, autograd, launches, or waiting), the work split by kind (``KINDS``, ``kernel_kind``),
the number of kernels, the host's waits for the device, and the longest kernels by name.
"""

import dataclasses
import gzip
import json
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = ["KINDS", "TraceSummary", "kernel_kind", "load_trace", "summarize"]

# What a unit of device work is, by name (``kernel_kind``).
KINDS = ("matmul", "attention", "fused", "elementwise", "collective", "optimizer", "memory", "other")

# The model's own Triton kernels (hotswitch.model._triton_kernels): the fused steps.
FUSED_KERNELS = ("norm_fwd", "norm_bwd", "rotary_fwd", "rotary_bwd", "swiglu_fwd", "swiglu_bwd",
                 "cross_entropy_fwd", "cross_entropy_bwd")

_DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
               "cudaMemcpy2D", "cudaMemcpy3D")

# Substrings of a lower-cased name, checked in this order (the first match decides).
_RULES: Tuple[Tuple[str, Tuple[str, ...]], ...] = (
    ("collective", ("nccl", "c10d::", "gloo", "all_gather", "allgather", "reduce_scatter", "allreduce",
                    "all_reduce")),
    ("attention", ("flash", "fmha", "attention", "attn", "flex")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "aten::mm", "aten::addmm", "aten::bmm",
                "aten::baddbmm", "aten::_scaled_mm", "matmul_kernel")),
    ("optimizer", ("multi_tensor_apply", "adam", "_foreach_", "fused_sgd")),
    ("memory", ("memcpy", "memset")),
    ("elementwise", ("elementwise", "vectorized", "reduce_kernel", "at::native::", "aten::", "triton_",
                     "catarraybatchedcopy", "index", "scatter", "gather", "fill")),
)


def kernel_kind(name: str, category: str = "kernel") -> str:
    """The kind of one unit of work (``KINDS``) from its trace name: ``"fused"`` for the
    model's Triton kernels (``FUSED_KERNELS``), ``"memory"`` for the device's copies and fills
    of the ``gpu_memcpy``/``gpu_memset`` categories (a copy or fill done by a kernel, and
    ``aten::copy_``/``aten::fill_`` on the host, are ``"elementwise"``), else by the name's
    substrings (cuBLAS/CUTLASS kernels and ``aten::mm`` are ``"matmul"``, flash and
    FlexAttention kernels ``"attention"``, NCCL's and gloo's ``"collective"``, the optimizer's
    multi-tensor kernels ``"optimizer"``, PyTorch's own element-wise and reduction kernels
    ``"elementwise"``); ``"other"`` when nothing matches."""
    if category in ("gpu_memcpy", "gpu_memset"):
        return "memory"
    if name in FUSED_KERNELS:
        return "fused"
    lowered = name.lower()
    for kind, needles in _RULES:
        if any(n in lowered for n in needles):
            return kind
    return "other"


@dataclasses.dataclass
class TraceSummary:
    """One trace's windows, summed over them (``summarize``).

    ``device``: ``"cuda"`` when the trace holds GPU work, else ``"cpu"`` (then the work is the
    host operators that do work themselves, and ``busy_s`` what they took of the windows: the rest is
    Python and the framework between them). ``windows``: how many annotated ranges were
    summed; ``window_s``: their wall time; ``busy_s``: the union of the work intervals inside
    them; ``kernels``: units of work started inside them (kernels, and the device's copies and
    fills); ``seconds_by_kind``: the work's durations by kind (``KINDS``; overlapping work
    counts in each; work that runs past its window's end counts up to that end, as in
    ``busy_s``); ``syncs``: the host's waits for the device (CUDA only); ``top``: ``(name,
    count, seconds)`` of the longest work by name.
    """

    device: str
    windows: int
    window_s: float
    busy_s: float
    kernels: int
    seconds_by_kind: Dict[str, float]
    syncs: int
    top: List[Tuple[str, int, float]]

    @property
    def busy_share(self) -> float:
        """``busy_s / window_s``: the share of the windows' wall time the device worked."""
        return self.busy_s / self.window_s if self.window_s > 0 else 0.0

    def per_window(self) -> Dict[str, object]:
        """The figures per window (a step when the windows are steps), as plain values."""
        n = max(self.windows, 1)
        return {"window_s": self.window_s / n, "busy_s": self.busy_s / n, "busy_share": self.busy_share,
                "kernels": self.kernels / n, "syncs": self.syncs / n,
                "seconds_by_kind": {k: v / n for k, v in self.seconds_by_kind.items()},
                "top": [(name, count / n, seconds / n) for name, count, seconds in self.top]}


def load_trace(path: str) -> List[dict]:
    """The events of a Chrome trace file (``.json`` or ``.json.gz``). Raises ``ValueError``
    when the file holds no ``traceEvents`` list."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"{path}: expected a Chrome trace with a traceEvents list, got {type(events).__name__}")
    return events


def _union(intervals: Iterable[Tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


# Host operators that launch no kernel: views, metadata and allocations.
_NO_WORK = frozenset({
    "aten::resolve_conj", "aten::resolve_neg", "aten::as_strided", "aten::view", "aten::_unsafe_view",
    "aten::reshape", "aten::t", "aten::transpose", "aten::permute", "aten::expand", "aten::unsqueeze",
    "aten::squeeze", "aten::select", "aten::slice", "aten::narrow", "aten::alias", "aten::detach", "detach",
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::lift_fresh", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::unflatten", "aten::flatten",
    "aten::view_as", "aten::expand_as", "aten::contiguous", "aten::to", "aten::new_empty",
    "aten::new_empty_strided", "aten::resize_", "aten::broadcast_tensors", "torch::autograd::AccumulateGrad"})


def _work_ops(ops: Sequence[dict]) -> List[dict]:
    """The host operators that do work themselves: not a view, metadata or allocation
    (``_NO_WORK``), and calling no operator that does work (``aten::mm`` calls only
    ``aten::resolve_conj``, so it counts; ``aten::matmul`` calls ``aten::mm``, so it does not)."""
    work = []
    by_thread: Dict[object, List[dict]] = {}
    for e in ops:
        by_thread.setdefault((e.get("pid"), e.get("tid")), []).append(e)
    for thread in by_thread.values():
        thread.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: List[list] = []  # [event, calls work]

        def close(until: float) -> None:
            while stack and stack[-1][0]["ts"] + stack[-1][0]["dur"] <= until:
                e, calls = stack.pop()
                if e["name"] not in _NO_WORK and not calls:
                    work.append(e)
                if stack and (calls or e["name"] not in _NO_WORK):
                    stack[-1][1] = True

        for e in thread:
            close(e["ts"])
            stack.append([e, False])
        close(float("inf"))
    return work


def summarize(events: Sequence[dict], window: Optional[str] = None, top: int = 10) -> TraceSummary:
    """Summarises ``events`` (``load_trace``'s list) inside the ``user_annotation`` ranges named
    ``window`` (every annotated range of that name, summed), or over the whole trace when
    ``window`` is None. Raises ``ValueError`` when ``window`` names no range of the trace."""
    complete = [e for e in events if isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e]
    if window is None:
        if not complete:
            raise ValueError("the trace holds no complete events")
        spans = [(min(e["ts"] for e in complete), max(e["ts"] + e["dur"] for e in complete))]
    else:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in complete
                       if e.get("cat") == "user_annotation" and e.get("name") == window)
        if not spans:
            names = sorted({e.get("name") for e in complete if e.get("cat") == "user_annotation"})
            raise ValueError(f"no user_annotation range named {window!r} in the trace; it has {names}")

    def inside(e) -> Optional[Tuple[float, float]]:
        for start, stop in spans:
            if start <= e["ts"] < stop:
                return start, stop
        return None

    work = [e for e in complete if e.get("cat") in _DEVICE_CATEGORIES]
    device = "cuda" if work else "cpu"
    if not work:
        work = _work_ops([e for e in complete if e.get("cat") == "cpu_op"])
    by_kind = {k: 0.0 for k in KINDS}
    by_name: Dict[str, List[float]] = {}
    intervals = []
    count = 0
    for e in work:
        span = inside(e)
        if span is None:
            continue
        count += 1
        stop = min(e["ts"] + e["dur"], span[1])
        seconds = (stop - e["ts"]) * 1e-6
        by_kind[kernel_kind(e["name"], e.get("cat", ""))] += seconds
        entry = by_name.setdefault(e["name"], [0, 0.0])
        entry[0] += 1
        entry[1] += seconds
        intervals.append((e["ts"], stop))
    syncs = sum(1 for e in complete if e.get("cat") == "cuda_runtime" and e.get("name") in _SYNC_CALLS
                and inside(e) is not None)
    longest = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return TraceSummary(device=device, windows=len(spans), window_s=sum(b - a for a, b in spans) * 1e-6,
                        busy_s=_union(intervals) * 1e-6, kernels=count, seconds_by_kind=by_kind, syncs=syncs,
                        top=[(name, int(c), s) for name, (c, s) in longest])
