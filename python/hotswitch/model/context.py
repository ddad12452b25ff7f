"""Context parallelism: the tokens of a pack split over the ``cp`` ranks of a replica.

Each sequence of ``n >= 2 * cp * min_chunk`` tokens is cut into ``2 * cp`` chunks of
``n / (2 * cp)`` tokens (the first ``n mod 2cp`` chunks one longer); cp rank ``i`` holds
chunks ``i`` and ``2 * cp - 1 - i``. Under causal attention a chunk's work grows with its
position, so pairing an early chunk with the mirrored late one gives every rank the same
attention work (the load-balanced order of Megatron-LM's context parallelism). A shorter
sequence stays whole on one rank: the sequences are dealt longest first to the rank holding
the fewest tokens so far, which balances tokens (cutting a short sequence into tiny chunks
costs more in per-chunk overhead than it balances).

Attention under cp all-gathers the keys and values of the cp group: every rank then holds
the K/V of every token of the pack and computes its own queries against their sequence's
whole causal past. All-gather, not a ring exchange, because under grouped-query attention
K/V are ``2 * num_query_groups / num_attention_heads`` of the queries' size (a quarter or
less for LLaMA-style models), so one collective moves little and leaves the attention a
single call per distinct chunk shape; its backward is a reduce-scatter of the K/V gradients,
which sums every rank's contribution to the gradient of each rank's own K/V
(``hotswitch.model.comm.gather_from_sequence``).

Rotary positions are each token's position in its own sequence, whatever rank holds it; a
token's target is the next token of its sequence, which every rank knows (all ranks of a
replica hold the whole pack's token ids), so the loss of each token is computed where the
token lives and the replica's loss is the sum over its cp ranks.
"""

from typing import Dict, List, Tuple

import torch

__all__ = ["CP_MIN_CHUNK", "ContextSplit", "ContextAttention", "split_sequences"]

CP_MIN_CHUNK = 4  # tokens: shorter chunks stay whole on one rank (see above)


def split_sequences(lengths: List[int], cp: int, min_chunk: int = CP_MIN_CHUNK) -> List[List[Tuple[int, int, int]]]:
    """Which tokens of each sequence each cp rank holds.

    ``lengths``: tokens per sequence of a pack. Returns, for each cp rank, its pieces in pack
    order as ``(sequence, start, end)`` (token positions within the sequence, end
    exclusive). Deterministic: every rank computes every rank's pieces alike."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a positive int, got {cp!r}")
    if isinstance(min_chunk, bool) or not isinstance(min_chunk, int) or min_chunk < 1:
        raise ValueError(f"min_chunk must be a positive int (tokens), got {min_chunk!r}")
    chunks = 2 * cp
    pieces: List[List[Tuple[int, int, int]]] = [[] for _ in range(cp)]
    load = [0] * cp
    whole = []
    for s, n in enumerate(lengths):
        if cp == 1 or n < chunks * min_chunk:
            whole.append(s)
            continue
        base, extra = divmod(n, chunks)
        bounds = [0]
        for j in range(chunks):
            bounds.append(bounds[-1] + base + (1 if j < extra else 0))
        for i in range(cp):
            for j in (i, chunks - 1 - i):
                pieces[i].append((s, bounds[j], bounds[j + 1]))
                load[i] += bounds[j + 1] - bounds[j]
    owner: Dict[int, int] = {}
    for s in sorted(whole, key=lambda s: (-lengths[s], s)):
        r = min(range(cp), key=lambda r: (load[r], r))
        owner[s] = r
        load[r] += lengths[s]
    for s, r in owner.items():
        pieces[r].append((s, 0, lengths[s]))
    for p in pieces:
        p.sort()
    return pieces


class ContextSplit:
    """This cp rank's part of one pack, and what attention needs of the whole pack.

    ``cu_seqlens``: int64 ``[n + 1]`` of the whole pack; ``cp``/``cp_rank``: the cp group's
    size and this rank's index; ``multiple``: the local row count is padded to a multiple
    of it (the tp degree, for sequence parallelism). Every cp rank's part is padded to the
    same ``rows`` (the all-gather needs equal sizes); padding rows have no target and are
    neither queries nor keys of any sequence.

    ``index``: int64 ``[rows]``, the pack position of each local row (``-1`` for padding);
    ``positions``: int64 ``[rows]``, each row's position within its sequence (0 for
    padding). ``groups``: per distinct (length, local pieces) shape, ``(queries [B, m],
    keys [B, n], allowed [m, n])``: local row indices of the ``B`` sequences' queries,
    indices of their whole sequence in the gathered ``[cp * rows]`` K/V, and which key each
    query may see (key position <= query position). ``inverse``: int64 ``[rows]``, the
    row of the concatenated group outputs (followed by one zero row per padding row) that
    belongs to each local row.
    """

    def __init__(self, cu_seqlens: torch.Tensor, cp: int, cp_rank: int, multiple: int = 1,
                 min_chunk: int = CP_MIN_CHUNK):
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).cpu()
        lengths = (cu[1:] - cu[:-1]).tolist()
        starts = cu[:-1].tolist()
        pieces = split_sequences(lengths, cp, min_chunk)
        counts = [sum(e - b for _, b, e in p) for p in pieces]
        rows = -(-max(counts) // multiple) * multiple
        self.cp, self.cp_rank, self.rows = cp, cp_rank, rows
        # Pack position -> row of the gathered K/V ([cp * rows], rank r's rows first at r * rows).
        gathered = torch.empty(int(cu[-1]), dtype=torch.int64)
        index_of = []
        for r, p in enumerate(pieces):
            idx = torch.cat([torch.arange(starts[s] + b, starts[s] + e, dtype=torch.int64) for s, b, e in p]) \
                if p else torch.zeros(0, dtype=torch.int64)
            gathered[idx] = r * rows + torch.arange(idx.numel(), dtype=torch.int64)
            index_of.append(idx)
        mine = index_of[cp_rank]
        self.num_local = int(mine.numel())
        self.index = torch.cat([mine, torch.full((rows - self.num_local,), -1, dtype=torch.int64)])
        pack_positions = torch.arange(int(cu[-1]), dtype=torch.int64) - \
            torch.repeat_interleave(cu[:-1], torch.tensor(lengths, dtype=torch.int64))
        self.positions = torch.zeros(rows, dtype=torch.int64)
        self.positions[:self.num_local] = pack_positions[mine]

        # This rank's pieces by sequence: (row offset, piece bounds) lists.
        by_seq: Dict[int, List[Tuple[int, int, int]]] = {}
        row = 0
        for s, b, e in pieces[cp_rank]:
            by_seq.setdefault(s, []).append((row, b, e))
            row += e - b
        shapes: Dict[tuple, List[int]] = {}
        for s, parts in by_seq.items():
            key = (lengths[s],) + tuple((b, e) for _, b, e in parts)
            shapes.setdefault(key, []).append(s)
        self.groups: List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        order = []
        for key in sorted(shapes):
            seqs = shapes[key]
            n, bounds = key[0], key[1:]
            q_pos = torch.cat([torch.arange(b, e, dtype=torch.int64) for b, e in bounds])
            queries = torch.stack([torch.cat([torch.arange(r0, r0 + e - b, dtype=torch.int64)
                                              for r0, b, e in by_seq[s]]) for s in seqs])
            keys = torch.stack([gathered[starts[s]:starts[s] + n] for s in seqs])
            allowed = torch.arange(n, dtype=torch.int64)[None, :] <= q_pos[:, None]
            self.groups.append((queries, keys, allowed))
            order.append(queries.reshape(-1))
        flat = torch.cat(order + [torch.arange(self.num_local, rows, dtype=torch.int64)])
        self.inverse = torch.empty_like(flat)
        self.inverse[flat] = torch.arange(flat.numel(), dtype=torch.int64)

    def to(self, device: torch.device) -> "ContextSplit":
        """Moves the index tensors attention uses to ``device``; returns self."""
        self.groups = [tuple(x.to(device) for x in g) for g in self.groups]
        self.inverse = self.inverse.to(device)
        return self


def _masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """``q`` ``[B, m, hq, d]`` against ``k``/``v`` ``[B, n, hkv, d]`` where ``allowed`` ``[m, n]``;
    returns ``[B, m, hq, d]``. The query heads sharing a K/V head are folded into rows, so
    K/V are never repeated."""
    b, m, hq, d = q.shape
    n, hkv = k.shape[1], k.shape[2]
    rep = hq // hkv
    qg = q.reshape(b, m, hkv, rep, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, rep * m, d)
    kg, vg = k.permute(0, 2, 1, 3), v.permute(0, 2, 1, 3)  # [B, hkv, n, d]
    scores = torch.matmul(qg, kg.transpose(-1, -2)) * (1.0 / d ** 0.5)  # [B, hkv, rep * m, n]
    scores = scores.view(b, hkv, rep, m, n).masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vg.dtype).view(b, hkv, rep * m, n)
    out = torch.matmul(probs, vg)  # [B, hkv, rep * m, d]
    return out.view(b, hkv, rep, m, d).permute(0, 3, 1, 2, 4).reshape(b, m, hq, d)


class ContextAttention:
    """Causal attention of this cp rank's rows against their sequences' whole past.

    ``split``: the pack's ``ContextSplit``; ``gather``: ``x [rows, ...] -> [cp * rows, ...]``,
    the autograd all-gather over the cp group (backward: reduce-scatter). One masked call
    per distinct (length, pieces) shape of this rank's sequences."""

    def __init__(self, split: ContextSplit, gather):
        self.split = split
        self.gather = gather
        self.num_tokens = split.rows
        self.kernel = "context"

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """``q`` ``[rows, hq, d]``, ``k``/``v`` ``[rows, hkv, d]`` (this rank's rows) ->
        ``[rows, hq, d]``; padding rows get zeros."""
        sp = self.split
        if q.shape[0] != sp.rows or k.shape != v.shape or k.shape[0] != sp.rows or q.shape[1] % k.shape[1]:
            raise ValueError(f"context-parallel attention of {sp.rows} rows expects q [rows, hq, d] and k, v "
                             f"[rows, hkv, d] with hkv dividing hq, got {tuple(q.shape)}, {tuple(k.shape)}, "
                             f"{tuple(v.shape)}")
        hkv, d = k.shape[1], k.shape[2]
        kv = self.gather(torch.cat([k, v], dim=1).reshape(sp.rows, 2 * hkv * d)).view(-1, 2 * hkv, d)
        k_all, v_all = kv[:, :hkv], kv[:, hkv:]
        outs = []
        for queries, keys, allowed in sp.groups:
            o = _masked_attention(q[queries], k_all[keys], v_all[keys], allowed)
            outs.append(o.reshape(-1, q.shape[1], d))
        outs.append(q.new_zeros((sp.rows - sp.num_local, q.shape[1], d)))
        out = torch.cat(outs).index_select(0, sp.inverse)
        if not sp.groups:
            # The gather's backward is a collective: a rank holding no query of this pack must
            # still enter it, so its output joins the graph (as a zero).
            out = out + kv[:0].sum()
        return out
