"""A plain-PyTorch LLaMA, written from the published architecture (Touvron et al., "LLaMA:
Open and Efficient Foundation Language Models", 2023; grouped-query attention as in LLaMA 2,
Ainslie et al. 2023) after the structure of Meta's reference ``llama/model.py``. It shares no
code with hotswitch: the parallel transformer is checked against it.

- pre-norm RMSNorm: ``x / sqrt(mean(x^2) + eps) * weight``;
- rotary position embeddings on queries and keys, in Meta's form: consecutive feature pairs
  ``(2j, 2j + 1)`` of a head are a complex number rotated by ``position * theta^(-2j / d)``;
  every sequence runs on its own, so positions restart at 0 for each;
- grouped-query attention: each key/value head serves ``n_heads / n_kv_heads`` consecutive
  query heads; causal softmax attention scaled by ``1 / sqrt(head_dim)``;
- SwiGLU feed-forward: ``w2(silu(w1 x) * w3 x)``;
- an output head of its own, or the embedding's (tied);
- next-token cross entropy, the mean over every sequence's target tokens.

Weights are Meta's names and shapes. ``meta_weights`` maps hotswitch's logical tensors onto
them and ``hotswitch_grads`` maps gradients back: hotswitch fuses q, k, v into one
``qkv.weight`` (rows q | k | v) and gate, up into ``gate_up.weight`` (rows gate | up), and
pairs rotary features ``j`` and ``j + head_dim / 2`` within a head (the "rotate half" form),
which is Meta's pairing after a fixed permutation of each head's query and key rows.
"""

import math
from typing import Dict, List, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def precompute_freqs_cis(head_dim: int, end: int, theta: float, dtype: torch.dtype) -> torch.Tensor:
    """``[end, head_dim / 2]`` complex rotations ``exp(i * t * theta^(-2j / head_dim))``."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=dtype)[: head_dim // 2] / head_dim))
    angles = torch.outer(torch.arange(end, dtype=dtype), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
    """``x`` ``[seq, heads, head_dim]`` rotated pairwise by ``freqs_cis`` ``[seq, head_dim / 2]``."""
    pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(pairs * freqs_cis[:, None, :]).flatten(-2)


class Attention(nn.Module):
    def __init__(self, dim: int, n_heads: int, n_kv_heads: int):
        super().__init__()
        self.n_heads, self.n_kv_heads = n_heads, n_kv_heads
        self.head_dim = dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x, freqs_cis):
        n = x.shape[0]
        q = apply_rotary_emb(self.wq(x).view(n, self.n_heads, self.head_dim), freqs_cis)
        k = apply_rotary_emb(self.wk(x).view(n, self.n_kv_heads, self.head_dim), freqs_cis)
        v = self.wv(x).view(n, self.n_kv_heads, self.head_dim)
        rep = self.n_heads // self.n_kv_heads
        # Query head h reads key/value head h // rep (Meta's repeat_kv).
        k = k[:, :, None, :].expand(n, self.n_kv_heads, rep, self.head_dim).reshape(n, self.n_heads, self.head_dim)
        v = v[:, :, None, :].expand(n, self.n_kv_heads, rep, self.head_dim).reshape(n, self.n_heads, self.head_dim)
        q, k, v = (t.transpose(0, 1) for t in (q, k, v))  # [heads, seq, head_dim]
        scores = q @ k.transpose(1, 2) / math.sqrt(self.head_dim)
        mask = torch.full((n, n), float("-inf"), dtype=x.dtype).triu(1)
        probs = F.softmax(scores + mask, dim=-1)
        return self.wo((probs @ v).transpose(0, 1).reshape(n, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, n_kv_heads, hidden_dim, eps):
        super().__init__()
        self.attention = Attention(dim, n_heads, n_kv_heads)
        self.feed_forward = FeedForward(dim, hidden_dim)
        self.attention_norm = RMSNorm(dim, eps)
        self.ffn_norm = RMSNorm(dim, eps)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Llama(nn.Module):
    """The decoder; ``forward(tokens)`` of one sequence (int64 ``[n]``) gives its logits
    ``[n, vocab]``."""

    def __init__(self, vocab: int, dim: int, n_layers: int, n_heads: int, n_kv_heads: int, hidden_dim: int,
                 max_seq_len: int, eps: float, rope_theta: float, tied: bool, dtype: torch.dtype):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, n_heads, n_kv_heads, hidden_dim, eps)
                                    for _ in range(n_layers))
        self.norm = RMSNorm(dim, eps)
        self.output = nn.Linear(dim, vocab, bias=False)
        if tied:
            self.output.weight = self.tok_embeddings.weight
        self.to(dtype)
        self.register_buffer("freqs_cis", precompute_freqs_cis(dim // n_heads, max_seq_len, rope_theta, dtype),
                             persistent=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        freqs_cis = self.freqs_cis[: tokens.shape[0]]
        for layer in self.layers:
            h = layer(h, freqs_cis)
        return self.output(self.norm(h))

    def loss(self, sequences: Sequence[torch.Tensor]):
        """(logits of each sequence, mean next-token cross entropy over all of their targets)."""
        logits = [self(s) for s in sequences]
        total = sum(F.cross_entropy(l[:-1], s[1:], reduction="sum") for l, s in zip(logits, sequences))
        return logits, total / sum(len(s) - 1 for s in sequences)


def from_config(config, dtype: torch.dtype) -> Llama:
    """The reference of a ``hotswitch.TransformerConfig``'s architecture (read by field)."""
    return Llama(config.vocab_size, config.hidden_size, config.num_layers, config.num_attention_heads,
                 config.num_query_groups, config.ffn_hidden_size, config.max_position_embeddings,
                 config.norm_eps, config.rope_theta, config.tied_embedding, dtype)


def _half_to_pairs(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of ``heads`` heads in hotswitch's rotary order (feature j pairs with j + d/2)
    to Meta's (feature 2j pairs with 2j + 1)."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def _pairs_to_half(w: torch.Tensor, heads: int) -> torch.Tensor:
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def meta_weights(full: Dict[str, torch.Tensor], config) -> Dict[str, torch.Tensor]:
    """hotswitch's full tensors by logical name -> the reference's state dict."""
    hq, hkv, d = config.num_attention_heads, config.num_query_groups, config.head_dim
    ffn = config.ffn_hidden_size
    out = {"tok_embeddings.weight": full["embedding.weight"], "norm.weight": full["final_norm.weight"],
           "output.weight": full["embedding.weight" if config.tied_embedding else "head.weight"]}
    for i in range(config.num_layers):
        ours, meta = f"layers.{i}.", f"layers.{i}."
        wq, wk, wv = full[ours + "qkv.weight"].split([hq * d, hkv * d, hkv * d])
        w1, w3 = full[ours + "gate_up.weight"].split([ffn, ffn])
        out.update({
            meta + "attention_norm.weight": full[ours + "input_norm.weight"],
            meta + "attention.wq.weight": _half_to_pairs(wq, hq),
            meta + "attention.wk.weight": _half_to_pairs(wk, hkv),
            meta + "attention.wv.weight": wv,
            meta + "attention.wo.weight": full[ours + "proj.weight"],
            meta + "ffn_norm.weight": full[ours + "post_norm.weight"],
            meta + "feed_forward.w1.weight": w1,
            meta + "feed_forward.w3.weight": w3,
            meta + "feed_forward.w2.weight": full[ours + "down.weight"],
        })
    return out


def hotswitch_grads(model: Llama, config) -> Dict[str, torch.Tensor]:
    """The reference's gradients under hotswitch's logical names and layouts."""
    hq, hkv = config.num_attention_heads, config.num_query_groups
    g = {name: p.grad for name, p in model.named_parameters()}
    out = {"embedding.weight": g["tok_embeddings.weight"], "final_norm.weight": g["norm.weight"]}
    if not config.tied_embedding:
        out["head.weight"] = g["output.weight"]
    for i in range(config.num_layers):
        p = f"layers.{i}."
        out.update({
            p + "input_norm.weight": g[p + "attention_norm.weight"],
            p + "qkv.weight": torch.cat([_pairs_to_half(g[p + "attention.wq.weight"], hq),
                                         _pairs_to_half(g[p + "attention.wk.weight"], hkv),
                                         g[p + "attention.wv.weight"]]),
            p + "proj.weight": g[p + "attention.wo.weight"],
            p + "post_norm.weight": g[p + "ffn_norm.weight"],
            p + "gate_up.weight": torch.cat([g[p + "feed_forward.w1.weight"], g[p + "feed_forward.w3.weight"]]),
            p + "down.weight": g[p + "feed_forward.w2.weight"],
        })
    return out


def run(config, full: Dict[str, torch.Tensor], sequences: List[torch.Tensor], dtype: torch.dtype):
    """Loads ``full`` (hotswitch's logical tensors) into the reference, runs ``sequences`` and
    back-propagates the mean loss: (logits per sequence, loss, gradients by hotswitch name)."""
    model = from_config(config, dtype)
    # Strict: every reference weight comes from hotswitch's tensors (a tied output head loads
    # the embedding's values into the same parameter twice).
    model.load_state_dict({k: v.to(dtype) for k, v in meta_weights(full, config).items()})
    logits, loss = model.loss(sequences)
    loss.backward()
    return [l.detach() for l in logits], loss.detach(), hotswitch_grads(model, config)
