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
single kernel call per layer (``ContextAttention``); its backward is a reduce-scatter of
the K/V gradients, which sums every rank's contribution to the gradient of each rank's own
K/V (``hotswitch.model.comm.gather_from_sequence``).

Rotary positions are each token's position in its own sequence, whatever rank holds it; a
token's target is the next token of its sequence, which every rank knows (all ranks of a
replica hold the whole pack's token ids), so the loss of each token is computed where the
token lives and the replica's loss is the sum over its cp ranks.
"""

import functools
from typing import List, Tuple

import torch
import torch.nn.functional as F

from hotswitch import _C
import hotswitch.model.attention as attention
from hotswitch.model.batch import to_device

__all__ = ["CP_MIN_CHUNK", "ContextSplit", "ContextAttention", "split_pieces", "split_sequences"]

CP_MIN_CHUNK = 4  # tokens: shorter chunks stay whole on one rank (see above)
Pieces = Tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (sequence, start, end), int64 [k] each


def split_pieces(lengths, cp: int, min_chunk: int = CP_MIN_CHUNK) -> List[Pieces]:
    """Which tokens of each sequence each cp rank holds, as tensors.

    ``lengths``: tokens per sequence of a pack (ints or an int64 tensor, each >= 1, else
    ``ValueError``). Returns, for each cp rank, its pieces in pack order as int64 CPU
    tensors ``(sequence, start, end)`` (token positions within the sequence, end
    exclusive). The dealing of whole sequences is ``hotswitch._C.context_split_owners``, the
    one the cost model prices; the rest is tensor arithmetic, with no loop over the
    sequences. Deterministic: every rank computes every rank's pieces alike."""
    if isinstance(cp, bool) or not isinstance(cp, int) or cp < 1:
        raise ValueError(f"cp must be a positive int, got {cp!r}")
    if isinstance(min_chunk, bool) or not isinstance(min_chunk, int) or min_chunk < 1:
        raise ValueError(f"min_chunk must be a positive int (tokens), got {min_chunk!r}")
    n = torch.as_tensor(lengths, dtype=torch.int64).cpu().reshape(-1)
    owner = torch.tensor(_C.context_split_owners(n.tolist(), cp, min_chunk), dtype=torch.int64)
    cut = torch.nonzero(owner < 0).reshape(-1)
    chunks = 2 * cp
    base, extra = n[cut] // chunks, n[cut] % chunks

    def start(j: int) -> torch.Tensor:  # first token of chunk j of every cut sequence
        return j * base + extra.clamp(max=j)

    span = int(n.max()) + 1 if n.numel() else 1
    out = []
    for r in range(cp):
        whole = torch.nonzero(owner == r).reshape(-1)
        seq = torch.cat([cut, cut, whole])
        begin = torch.cat([start(r), start(chunks - 1 - r), torch.zeros_like(whole)])
        end = torch.cat([start(r + 1), start(chunks - r), n[whole]])
        order = torch.argsort(seq * span + begin)
        out.append((seq[order], begin[order], end[order]))
    return out


def split_sequences(lengths: List[int], cp: int, min_chunk: int = CP_MIN_CHUNK) -> List[List[Tuple[int, int, int]]]:
    """``split_pieces`` as lists of ``(sequence, start, end)`` tuples, per cp rank."""
    return [list(zip(*(x.tolist() for x in p))) for p in split_pieces(lengths, cp, min_chunk)]


def _expand(first: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """``cat([arange(f, f + c) for f, c in zip(first, counts)])`` without the loop."""
    offsets = torch.cumsum(counts, 0) - counts
    total = int(counts.sum()) if counts.numel() else 0
    return torch.repeat_interleave(first - offsets, counts) + torch.arange(total, dtype=torch.int64)


class ContextSplit:
    """This cp rank's part of one pack, and what attention needs of the whole pack.

    ``cu_seqlens``: int64 ``[n + 1]`` of the whole pack; ``cp``/``cp_rank``: the cp group's
    size and this rank's index; ``multiple``: the local row count is padded to a multiple
    of it (the tp degree, for sequence parallelism). Every cp rank's part is padded to the
    same ``rows`` (the all-gather needs equal sizes); padding rows have no target and are
    neither queries nor keys of any sequence.

    ``index``: int64 ``[rows]``, the pack position of each local row (``-1`` for padding);
    ``positions``: int64 ``[rows]``, each row's position within its sequence (0 for
    padding). Rows of the gathered ``[cp * rows]`` K/V (rank ``r``'s rows at ``r * rows``):
    ``row_ids`` int64, the sequence of each (``num_sequences + row`` for a padding row, a
    sequence of its own), ``row_positions`` int64, its position there (0 for padding). This
    rank's local row ``i`` is gathered row ``cp_rank * rows + i``. ``pieces``: this rank's
    ``(sequence, start, end)`` int64 tensors in local row order (``split_pieces``);
    ``gathered``: int64 ``[T]``, the gathered row of each pack position; ``starts``/
    ``lengths``: int64 ``[n]``, the pack's sequences. Built with tensor operations (one loop
    over the cp ranks), whatever the number of sequences.
    """

    def __init__(self, cu_seqlens: torch.Tensor, cp: int, cp_rank: int, multiple: int = 1,
                 min_chunk: int = CP_MIN_CHUNK):
        cu = torch.as_tensor(cu_seqlens, dtype=torch.int64).cpu()
        lengths = cu[1:] - cu[:-1]
        starts = cu[:-1]
        pieces = split_pieces(lengths, cp, min_chunk)  # checks cp first
        if isinstance(cp_rank, bool) or not isinstance(cp_rank, int) or not 0 <= cp_rank < cp:
            raise ValueError(f"cp_rank must be an int in [0, {cp}), got {cp_rank!r}")
        counts = [int((e - b).sum()) for _, b, e in pieces]
        rows = -(-max(counts) // multiple) * multiple
        self.cp, self.cp_rank, self.rows = cp, cp_rank, rows
        self.lengths, self.starts, self.pieces = lengths, starts, pieces[cp_rank]
        self.num_sequences = int(lengths.numel())
        # Pack position -> row of the gathered K/V ([cp * rows], rank r's rows first at r * rows).
        self.gathered = torch.empty(int(cu[-1]), dtype=torch.int64)
        for r, (seq, begin, end) in enumerate(pieces):
            idx = _expand(starts[seq] + begin, end - begin)
            self.gathered[idx] = r * rows + torch.arange(idx.numel(), dtype=torch.int64)
            if r == cp_rank:
                mine = idx
        self.num_local = int(mine.numel())
        self.index = torch.cat([mine, torch.full((rows - self.num_local,), -1, dtype=torch.int64)])
        _, begin, end = self.pieces
        self.positions = torch.zeros(rows, dtype=torch.int64)
        self.positions[:self.num_local] = _expand(begin, end - begin)

    # Only the mask kernels (FlexAttention, SDPA, masked) need these: built on first use.
    @functools.cached_property
    def row_ids(self) -> torch.Tensor:
        ids = self.num_sequences + torch.arange(self.cp * self.rows, dtype=torch.int64)
        ids[self.gathered] = torch.repeat_interleave(torch.arange(self.num_sequences, dtype=torch.int64), self.lengths)
        return ids

    @functools.cached_property
    def row_positions(self) -> torch.Tensor:
        positions = torch.zeros(self.cp * self.rows, dtype=torch.int64)
        positions[self.gathered] = _expand(torch.zeros_like(self.lengths), self.lengths)
        return positions

    def shape_groups(self) -> Tuple[List[Tuple[torch.Tensor, torch.Tensor, torch.Tensor]], torch.Tensor]:
        """This rank's sequences grouped by length (which fixes the pieces a rank holds of
        a sequence, so every sequence of a group has the same shape): per group ``(queries
        [B, m], keys [B, n], allowed [m, n])``, the local row indices of the ``B`` sequences'
        queries, the gathered rows of their whole sequences, and which key each query may
        see; and ``inverse`` int64 ``[rows]``, the row of the concatenated group outputs
        (followed by one zero row per padding row) that belongs to each local row. One
        loop over the distinct lengths, none over the sequences."""
        seq, begin, end = self.pieces
        size = end - begin
        # A rank's pieces of one sequence are adjacent in pack order, so its rows are contiguous.
        sequences, per_sequence = torch.unique_consecutive(seq, return_counts=True)
        first_row = (torch.cumsum(size, 0) - size)[torch.cumsum(per_sequence, 0) - per_sequence]
        rows_of = torch.zeros_like(sequences).index_add_(
            0, torch.repeat_interleave(torch.arange(sequences.numel()), per_sequence), size)
        n_of = self.lengths[sequences]
        by_length, order = torch.sort(n_of, stable=True)
        distinct, counts = torch.unique_consecutive(by_length, return_counts=True)
        groups, flat = [], []
        for n, members in zip(distinct.tolist(), order.split(counts.tolist())):
            r0, m = first_row[members], int(rows_of[members[0]])
            queries = r0[:, None] + torch.arange(m, dtype=torch.int64)
            keys = self.gathered[self.starts[sequences[members]][:, None] + torch.arange(n, dtype=torch.int64)]
            q_pos = self.positions[int(r0[0]):int(r0[0]) + m]
            groups.append((queries, keys, torch.arange(n, dtype=torch.int64)[None, :] <= q_pos[:, None]))
            flat.append(queries.reshape(-1))
        flat = torch.cat(flat + [torch.arange(self.num_local, self.rows, dtype=torch.int64)])
        inverse = torch.empty_like(flat)
        inverse[flat] = torch.arange(flat.numel(), dtype=torch.int64)
        return groups, inverse

    def varlen_bounds(self) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
        """This rank's pieces as flash-attention's variable-length sequences: piece ``i``'s
        queries are local rows ``cu_q[i]:cu_q[i+1]`` (its ``end - start`` tokens), its keys
        the prefix ``[0, end)`` of its sequence, which ``key_rows[cu_k[i]:cu_k[i+1]]`` picks
        out of the gathered K/V. Under a causal mask aligned to the bottom right, query ``j``
        of the piece (position ``start + j``) sees exactly its sequence's keys ``0 ..
        start + j``. Returns ``(cu_q, cu_k, key_rows, max_q, max_k)``: int64 tensors and the
        longest piece and prefix (ints)."""
        seq, begin, end = self.pieces
        zero = torch.zeros(1, dtype=torch.int64)
        if not seq.numel():
            return zero, zero, torch.zeros(0, dtype=torch.int64), 0, 0
        cu_q = torch.cat([zero, torch.cumsum(end - begin, 0)])
        cu_k = torch.cat([zero, torch.cumsum(end, 0)])
        key_rows = self.gathered[_expand(self.starts[seq], end)]
        return cu_q, cu_k, key_rows, int((end - begin).max()), int(end.max())


class ContextAttention:
    """Causal attention of this cp rank's rows against their sequences' whole past.

    ``split``: the pack's ``ContextSplit``; ``gather``: ``x [rows, ...] -> [cp * rows, ...]``,
    the autograd all-gather over the cp group (backward: reduce-scatter); ``kernel``: one of
    ``hotswitch.model.attention.KERNELS`` (``select_kernel``'s choice); ``heads``: this rank's
    query heads; ``device``: where q, k, v live. One kernel call per layer, as without cp:

    - ``flash_attn``, ``varlen``: each local piece is a sequence of queries against its
      sequence's prefix, picked out of the gathered K/V (``ContextSplit.varlen_bounds``);
    - ``flex``: the local rows against the whole gathered K/V under a ``BlockMask`` of
      ``(sequence, position)``;
    - ``sdpa``, ``masked``: the same as one masked call, while ``heads * rows * cp * rows``
      stays within ``MASKED_MAX_SCORES``; beyond, and for ``grouped``:
    - ``grouped``: one masked call per distinct (length, pieces) shape of the rank's
      sequences (``ContextSplit.shape_groups``).

    ``self.kernel`` is the kernel this pack runs. Padding rows attend only to themselves
    (no row is fully masked, so no kernel yields NaN) and their output is zero.
    """

    def __init__(self, split: ContextSplit, gather, kernel: str, heads: int, device: torch.device):
        if kernel not in attention.KERNELS:
            raise ValueError(f"attention kernel {kernel!r} is not one of {', '.join(attention.KERNELS)}")
        device = torch.device(device)
        self.split = split
        self.gather = gather
        self.num_tokens = split.rows
        rows, gathered_rows = split.rows, split.cp * split.rows
        if kernel in ("sdpa", "masked") and heads * rows * gathered_rows > attention._max_scores(device):
            kernel = "grouped"
        self.kernel = kernel
        mine = slice(split.cp_rank * rows, (split.cp_rank + 1) * rows)
        if kernel in attention.FLASH_KERNELS:
            cu_q, cu_k, key_rows, self.max_q, self.max_k = split.varlen_bounds()
            self.cu_q = to_device(cu_q, device, torch.int32)
            self.cu_k = to_device(cu_k, device, torch.int32)
            self.key_rows = to_device(key_rows, device)
        elif kernel == "flex":
            # Both sides padded to the block size; every padding query sees one padding key
            # of its own (extra key rows after the gathered ones).
            block = attention.FLEX_BLOCK
            self.padded_q = -(-rows // block) * block
            self.padded_k = -(-(gathered_rows + self.padded_q - rows) // block) * block
            extra = split.num_sequences + gathered_rows + torch.arange(self.padded_k - gathered_rows)
            k_ids = torch.cat([split.row_ids, extra])
            k_pos = torch.cat([split.row_positions, torch.zeros(extra.numel(), dtype=torch.int64)])
            q_ids = torch.cat([split.row_ids[mine], extra[:self.padded_q - rows]])
            q_pos = torch.cat([split.row_positions[mine], torch.zeros(self.padded_q - rows, dtype=torch.int64)])
            self.block_mask = attention.flex_document_mask(
                *(to_device(x, device) for x in (q_ids, q_pos, k_ids, k_pos)), device)
        elif kernel in ("sdpa", "masked"):
            allowed = to_device(attention.document_mask(split.row_ids[mine], split.row_positions[mine], split.row_ids,
                                                         split.row_positions), device)
            if kernel == "sdpa":
                self.allowed = allowed
            else:
                self.blocked = ~allowed
        else:
            groups, inverse = split.shape_groups()
            self.groups = [(to_device(queries, device), to_device(keys, device), to_device(~allowed, device))
                           for queries, keys, allowed in groups]
            self.inverse = to_device(inverse, device)

    def prepare(self, dtype: torch.dtype) -> None:
        """Nothing to build ahead: no kernel here caches anything per call (``PackAttention.prepare``)."""

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
        if sp.num_local == 0:
            # The gather's backward is a collective: a rank holding no query of this pack must
            # still enter it, so its output joins the graph (as a zero).
            return q.new_zeros(q.shape) + kv[:0].sum()
        k_all, v_all = kv[:, :hkv], kv[:, hkv:]
        if self.kernel in attention.FLASH_KERNELS:
            picked = kv.index_select(0, self.key_rows)
            out = attention._flash_kernel(q[:sp.num_local], picked[:, :hkv], picked[:, hkv:], self.cu_q, self.cu_k,
                                          self.max_q, self.max_k, self.kernel)
        elif self.kernel == "flex":
            out = attention._flex_kernel(q, k_all, v_all, self.block_mask, self.padded_q, self.padded_k)
        elif self.kernel == "sdpa":
            out = attention._sdpa_kernel(q, k_all, v_all, self.allowed)
        elif self.kernel == "masked":
            out = attention._masked_kernel(q, k_all, v_all, self.blocked)
        else:
            outs = [attention._context_blocks(q[queries], k_all[keys], v_all[keys], blocked).reshape(-1, q.shape[1], d)
                    for queries, keys, blocked in self.groups]
            outs.append(q.new_zeros((sp.rows - sp.num_local, q.shape[1], d)))
            return torch.cat(outs).index_select(0, self.inverse)
        return F.pad(out[:sp.num_local], (0, 0, 0, 0, 0, sp.rows - sp.num_local))
