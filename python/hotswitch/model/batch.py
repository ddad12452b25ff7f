"""Micro-batches of packed variable-length sequences."""

import dataclasses
from typing import List, Sequence

import torch

__all__ = ["MicroBatch", "split_replicas", "count_targets", "to_device"]


def to_device(t: torch.Tensor, device, dtype=None) -> torch.Tensor:
    """``t``, built on the host, on ``device`` (and in ``dtype`` when given). On CUDA the copy
    goes through pinned memory without blocking: a copy from pageable memory synchronises the
    stream, so building a pack's tensors would wait for all the work queued before it (the
    last step's optimizer, say) and leave the device idle while the rest is built. Pinned
    blocks come from PyTorch's caching host allocator, which keeps each until its copy is
    done. Elsewhere it is ``t.to(device)`` (``t`` itself when it is there already)."""
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    device = torch.device(device)
    if device.type != "cuda" or t.device.type != "cpu":
        return t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


@dataclasses.dataclass
class MicroBatch:
    """Sequences packed end to end, in the ``cu_seqlens`` convention of flash-attention.

    ``tokens``: int64 ``[T]``, the token ids of all sequences one after another.
    ``cu_seqlens``: int64 ``[n + 1]``, ``0 = cu[0] < cu[1] < ... < cu[n] = T``; sequence
    ``i`` is ``tokens[cu[i]:cu[i + 1]]``. Each sequence attends only to itself, causally,
    with positions restarting at 0; the target of a token is the next token of its
    sequence, so the last token of each sequence has none.
    """

    tokens: torch.Tensor
    cu_seqlens: torch.Tensor

    def __post_init__(self):
        self.check()

    @classmethod
    def from_sequences(cls, sequences: Sequence[Sequence[int]]) -> "MicroBatch":
        """Packs token-id sequences (lists or 1-D tensors, each non-empty) into one micro-batch."""
        seqs = [torch.as_tensor(s, dtype=torch.int64).reshape(-1) for s in sequences]
        lengths = [len(s) for s in seqs]
        cu = torch.zeros(len(seqs) + 1, dtype=torch.int64)
        if seqs:
            cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int64), 0)
        tokens = torch.cat(seqs) if seqs else torch.zeros(0, dtype=torch.int64)
        return cls(tokens, cu)

    def check(self, vocab_size: int = 0, max_positions: int = 0) -> None:
        """Raises ``ValueError`` unless this is a well-formed, non-empty pack (token ids in
        ``[0, vocab_size)`` and sequences no longer than ``max_positions`` when given)."""
        t, cu = self.tokens, self.cu_seqlens
        for name, x in (("tokens", t), ("cu_seqlens", cu)):
            if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.dtype != torch.int64:
                raise ValueError(f"micro-batch {name} must be a 1-D int64 tensor, got "
                                 f"{getattr(x, 'dtype', type(x).__name__)} of shape "
                                 f"{tuple(getattr(x, 'shape', ()))}")
        if cu.numel() < 2:
            raise ValueError(f"micro-batch has no sequence: cu_seqlens {cu.tolist()}")
        lengths = cu[1:] - cu[:-1]
        if int(cu[0]) != 0 or int(cu[-1]) != t.numel() or int(lengths.min()) < 1:
            raise ValueError(f"micro-batch cu_seqlens must rise strictly from 0 to the token count "
                             f"{t.numel()}, got {cu.tolist()}")
        if vocab_size and t.numel() and (int(t.min()) < 0 or int(t.max()) >= vocab_size):
            raise ValueError(f"micro-batch token ids span [{int(t.min())}, {int(t.max())}], "
                             f"outside [0, vocab_size({vocab_size}))")
        longest = int(lengths.max())
        if max_positions and longest > max_positions:
            raise ValueError(f"micro-batch sequence of length {longest} exceeds "
                             f"max_position_embeddings({max_positions})")

    @property
    def lengths(self) -> List[int]:
        return (self.cu_seqlens[1:] - self.cu_seqlens[:-1]).tolist()

    @property
    def num_tokens(self) -> int:
        return int(self.tokens.numel())

    @property
    def num_sequences(self) -> int:
        return int(self.cu_seqlens.numel()) - 1

    @property
    def num_targets(self) -> int:
        """Tokens that have a target: all but the last of each sequence."""
        return self.num_tokens - self.num_sequences


def split_replicas(micro_batches: Sequence[MicroBatch], dp: int) -> List[List[MicroBatch]]:
    """Deals a global batch's micro-batches to ``dp`` data replicas round-robin (replica
    ``d`` gets ``micro_batches[d::dp]``; a replica may get none)."""
    if isinstance(dp, bool) or not isinstance(dp, int) or dp < 1:
        raise ValueError(f"dp must be a positive int, got {dp!r}")
    return [list(micro_batches[d::dp]) for d in range(dp)]


def count_targets(micro_batches: Sequence[MicroBatch]) -> int:
    """Target tokens of a list of micro-batches (the loss normaliser of a global batch)."""
    return sum(mb.num_targets for mb in micro_batches)
