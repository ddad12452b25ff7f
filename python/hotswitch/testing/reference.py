"""Training under one static layout: AdamW over the local shards.

The reference for every parity check: the same code at world 1 is plain single-device
training of the whole batch.
"""

import time
from typing import List, Optional, Sequence, Tuple

import torch

from hotswitch import _C
from hotswitch.model.batch import MicroBatch, count_targets, split_replicas
from hotswitch.model.comm import all_reduce
from hotswitch.model.config import TransformerConfig
from hotswitch.model.groups import ParallelGroups
from hotswitch.model.transformer import ParallelTransformer

__all__ = ["StaticTrainer", "train_static"]


class StaticTrainer:
    """One optimizer step per global batch under the model's layout.

    ``step`` runs this replica's micro-batches, reduces the gradients over the data replicas
    and applies AdamW (``lr``, ``betas``, ``eps``, ``weight_decay``, as torch.optim.AdamW) to
    the local shards. With ``zero=True`` the optimizer state is sharded over the dp group
    (the ``"zero"`` placement): gradients are reduce-scattered, each rank updates its chunk,
    and the parameters are all-gathered back.
    """

    def __init__(self, model: ParallelTransformer, lr: float = 1e-3, betas=(0.9, 0.95),
                 eps: float = 1e-8, weight_decay: float = 0.0, zero: bool = False):
        if not isinstance(model, ParallelTransformer):
            raise ValueError(f"model must be a hotswitch.ParallelTransformer, got {type(model).__name__}")
        self.model = model
        self.zero = bool(zero)
        options = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        if self.zero:
            self.master = torch.nn.Parameter(model.zero_chunk())
            self.optimizer = torch.optim.AdamW([self.master], **options)
        else:
            self.master = None
            self.optimizer = torch.optim.AdamW(list(model.named_shards().values()), **options)
        self.last_step_seconds = 0.0

    def step(self, micro_batches: Sequence[MicroBatch], num_targets: int) -> float:
        """One training step. ``micro_batches``: this data replica's share of the global batch
        (the same list on every rank of the replica); ``num_targets``: target tokens of the
        whole global batch. Returns the global batch's mean loss (on every rank).
        Collective over the world."""
        if isinstance(num_targets, bool) or not isinstance(num_targets, int) or num_targets < 1:
            raise ValueError(f"num_targets must be a positive int (target tokens of the global batch), "
                             f"got {num_targets!r}")
        start = time.perf_counter()
        model = self.model
        model.zero_grad()
        loss_sum, _ = model.forward_backward(list(micro_batches), 1.0 / num_targets)
        if self.zero:
            self.master.grad = model.reduce_gradients(zero=True)
            self.optimizer.step()
            model.load_zero_chunks(self.master.detach())
        else:
            model.reduce_gradients()
            self.optimizer.step()
        total = torch.tensor([loss_sum], dtype=torch.float64, device=model.device)
        all_reduce(total, model.groups.dp_group)
        self.last_step_seconds = time.perf_counter() - start
        return float(total[0]) / num_targets


def train_static(config: TransformerConfig, layout: "_C.Layout", batches: Sequence[Sequence[MicroBatch]],
                 steps: Optional[int] = None, lr: float = 1e-3, seed: int = 0, zero: bool = False,
                 weight_decay: float = 0.0, eps: float = 1e-8, groups: Optional[ParallelGroups] = None
                 ) -> Tuple[List[float], ParallelTransformer]:
    """Trains a freshly initialised model under ``layout`` for ``steps`` (default: one per
    batch; batches repeat cyclically). Each batch is a global batch's micro-batches; data
    replica ``d`` runs ``batch[d::dp]``. ``lr``, ``eps``, ``weight_decay``: AdamW's. Returns the mean loss of each step and the model.
    Collective over the world."""
    config.validate(layout)
    for i, batch in enumerate(batches):
        if count_targets(batch) < 1:
            raise ValueError(f"batch {i} has no target tokens")
    if groups is None:
        groups = ParallelGroups(layout)
    model = ParallelTransformer(config, layout, groups, seed=seed)
    trainer = StaticTrainer(model, lr=lr, eps=eps, weight_decay=weight_decay, zero=zero)
    losses = []
    for step in range(len(batches) if steps is None else steps):
        batch = batches[step % len(batches)]
        mine = split_replicas(batch, layout.dp)[groups.dp_rank]
        losses.append(trainer.step(mine, count_targets(batch)))
    return losses, model
