"""The configuration of a LLaMA-style decoder and its checks against a layout."""

import dataclasses
from typing import Optional

from hotswitch import _C
from hotswitch.specs import llama_tensor_set

__all__ = ["TransformerConfig", "DTYPES", "COMPUTE_DTYPES", "runs_graphs"]


def runs_graphs(layout, buckets, recompute: str = "none", layouts=None) -> bool:
    """Whether ``layout``'s layers run from CUDA graphs at the graph ``buckets`` (token
    counts; None or empty: no graphs) under ``recompute``: one stage and no context
    parallelism, every bucket a multiple of tp (a padded pack cuts into equal
    sequence-parallel slices), activations kept, and the layout among ``layouts`` (names;
    None: every layout). The cost model's ``LayoutTerms.graphs``."""
    return bool(buckets) and layout.pp == 1 and layout.cp == 1 and recompute != "full" and \
        all(b % layout.tp == 0 for b in buckets) and (layouts is None or layout.name in layouts)

DTYPES = ("float32", "bfloat16", "float16")
COMPUTE_DTYPES = ("bfloat16", "float16")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")


ROPE_SCALING_KEYS = ("factor", "high_freq_factor", "low_freq_factor", "original_max_position_embeddings", "rope_type")


def _rope_scaling(value) -> Optional[tuple]:
    """``rope_scaling`` as a sorted tuple of pairs, checked; ValueError naming what is wrong."""
    if value is None:
        return None
    try:
        d = dict(value)
    except (TypeError, ValueError):
        raise ValueError(f"rope_scaling must be None or a dict, got {value!r}") from None
    d.setdefault("rope_type", d.pop("type", None))  # older config.json files say "type"
    if d["rope_type"] != "llama3":
        raise ValueError(f"rope_scaling type {d['rope_type']!r} is not supported (expected 'llama3' or None)")
    missing = sorted(set(ROPE_SCALING_KEYS) - set(d))
    extra = sorted(set(d) - set(ROPE_SCALING_KEYS))
    if missing or extra:
        raise ValueError(f"rope_scaling {value!r}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {', '.join(extra)}"] if extra else [])))
    for key in ("factor", "low_freq_factor", "high_freq_factor"):
        if isinstance(d[key], bool) or not isinstance(d[key], (int, float)) or not d[key] > 0:
            raise ValueError(f"rope_scaling {key} must be a positive number, got {d[key]!r}")
        d[key] = float(d[key])
    if not d["high_freq_factor"] > d["low_freq_factor"]:
        raise ValueError(f"rope_scaling high_freq_factor({d['high_freq_factor']}) must exceed "
                         f"low_freq_factor({d['low_freq_factor']})")
    _positive_int("rope_scaling original_max_position_embeddings", d["original_max_position_embeddings"])
    return tuple(sorted(d.items()))


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """A LLaMA-style decoder: RMSNorm, rotary embeddings, SwiGLU MLP, grouped-query attention.

    ``num_query_groups`` is the number of key/value heads (``<= num_attention_heads``, a
    divisor of it); the head dimension is ``hidden_size / num_attention_heads`` and must be
    even (rotary embeddings rotate pairs). ``tied_embedding`` makes the output head reuse
    the embedding (held by the first and the last pipeline stage). ``dtype`` is the
    parameter and activation dtype. ``init_std`` is the standard deviation of the initial
    linear and embedding weights (output projections of each block are scaled down by
    ``sqrt(2 * num_layers)``, as in Megatron); norm weights start at one.

    ``compute_dtype``: ``None`` computes in ``dtype``; ``"bfloat16"`` or ``"float16"`` (with
    ``dtype`` float32) runs the matrix products and attention in 16 bits under
    ``torch.autocast``, while the parameters (the fp32 master weights), their gradients, the
    residual stream, the norms and the loss stay in fp32 (Megatron's ``--bf16``/``--fp16``;
    fp16 wants loss scaling, ``RuntimeConfig.loss_scaling``).

    ``rope_scaling``: ``None``, or LLaMA 3.1's frequency scaling of the rotary embeddings as
    Hugging Face's ``config.json`` writes it, a dict ``{"rope_type": "llama3", "factor",
    "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}``; held as a
    sorted tuple of pairs (``rope_scaling_dict`` gives the dict back).
    """

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    vocab_size: int
    max_position_embeddings: int
    tied_embedding: bool = False
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    dtype: str = "float32"
    init_std: float = 0.02
    compute_dtype: Optional[str] = None
    rope_scaling: Optional[tuple] = None

    def __post_init__(self):
        object.__setattr__(self, "rope_scaling", _rope_scaling(self.rope_scaling))
        for name in ("num_layers", "hidden_size", "num_attention_heads", "num_query_groups",
                     "ffn_hidden_size", "vocab_size", "max_position_embeddings"):
            _positive_int(name, getattr(self, name))
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(f"hidden_size({self.hidden_size}) is not divisible by "
                             f"num_attention_heads({self.num_attention_heads})")
        if self.num_query_groups > self.num_attention_heads or \
                self.num_attention_heads % self.num_query_groups:
            raise ValueError(f"num_attention_heads({self.num_attention_heads}) is not a multiple of "
                             f"num_query_groups({self.num_query_groups})")
        if self.head_dim % 2:
            raise ValueError(f"head dim hidden_size({self.hidden_size}) / num_attention_heads"
                             f"({self.num_attention_heads}) = {self.head_dim} must be even for rotary "
                             f"embeddings")
        if not isinstance(self.tied_embedding, bool):
            raise ValueError(f"tied_embedding must be a bool, got {self.tied_embedding!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {', '.join(DTYPES)}")
        if self.compute_dtype is not None and (self.compute_dtype not in COMPUTE_DTYPES or self.dtype != "float32"):
            raise ValueError(f"compute_dtype {self.compute_dtype!r} with dtype {self.dtype!r}: expected None, or "
                             f"{' or '.join(map(repr, COMPUTE_DTYPES))} over float32 parameters")
        for name in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{name} must be a positive number, got {value!r}")

    @property
    def rope_scaling_dict(self) -> Optional[dict]:
        return None if self.rope_scaling is None else dict(self.rope_scaling)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def tensor_set(self, compute_matrices: bool = False) -> "_C.TensorSet":
        """The parameters with their full shapes and sharding rules: ``hs.llama_tensor_set``
        of this config, the names the redistribution engine switches. ``compute_matrices``:
        the layers' matrices and an untied head in ``compute_dtype`` (when set), the dtype
        the model computes with them in: what a phase's parameters need to travel as."""
        return llama_tensor_set(
            num_layers=self.num_layers, hidden_size=self.hidden_size,
            ffn_hidden_size=self.ffn_hidden_size, num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups, vocab_size=self.vocab_size,
            tied_embedding=self.tied_embedding, dtype=self.dtype,
            matrix_dtype=self.compute_dtype if compute_matrices else None)

    def cost_config(self, recompute: str = "none") -> "_C.ModelConfig":
        """This model for the cost model (``hs.ModelConfig``); ``recompute`` (``"none"``,
        ``"selective"``, ``"full"``) is what its costs assume when a call names none."""
        return _C.ModelConfig(
            num_layers=self.num_layers, hidden_size=self.hidden_size,
            num_attention_heads=self.num_attention_heads, num_query_groups=self.num_query_groups,
            ffn_hidden_size=self.ffn_hidden_size, vocab_size=self.vocab_size,
            param_bytes=4 if self.dtype == "float32" else 2, recompute=recompute, name="custom")

    def validate(self, layout: "_C.Layout") -> None:
        """Raises ``ValueError`` naming the failing arithmetic when this model cannot run under
        ``layout``. Local: no collective, so every rank raises the same error on its own."""
        if not isinstance(layout, _C.Layout):
            raise ValueError(f"layout must be a hotswitch.Layout, got {type(layout).__name__}")
        tp, pp = layout.tp, layout.pp
        checks = [
            ("num_attention_heads", self.num_attention_heads, "tp", tp),
            ("num_query_groups", self.num_query_groups, "tp", tp),
            ("ffn_hidden_size", self.ffn_hidden_size, "tp", tp),
            ("vocab_size", self.vocab_size, "tp", tp),
            ("num_layers", self.num_layers, "pp", pp),
        ]
        for name, value, axis, degree in checks:
            if value % degree:
                raise ValueError(f"{name}({value}) is not divisible by {axis}({degree}) of layout {layout}"
                                 + (" (pad the vocabulary)" if name == "vocab_size" else ""))
