"""The parallel model: a LLaMA-style decoder whose TP, CP, PP and DP execution follows a layout.

``TransformerConfig`` describes the model; ``ParallelGroups`` makes a layout's process
groups; ``ParallelTransformer`` holds this rank's shards and runs micro-batches
(``MicroBatch``, packed sequences with ``cu_seqlens``) under the 1F1B pipeline schedule.
Static training under one layout, the single-process reference, is
``hotswitch.testing.reference``.
"""

from hotswitch.model.batch import MicroBatch, count_targets, split_replicas
from hotswitch.model.config import TransformerConfig
from hotswitch.model.groups import ParallelGroups
from hotswitch.model.init import init_full, init_shards
from hotswitch.model.transformer import ParallelTransformer

__all__ = [
    "MicroBatch",
    "ParallelGroups",
    "ParallelTransformer",
    "TransformerConfig",
    "count_targets",
    "init_full",
    "init_shards",
    "split_replicas",
]
