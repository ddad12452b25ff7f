"""hotswitch: per-step parallel layouts and planned hot switching for LLM training.

Vocabulary (see DESIGN.md): a *layout* is one parallel strategy over the world (degrees
dp, tp, pp, cp and a rank order); a *placement* says which index boxes of each tensor a
rank holds under a layout (``"sharded"``, ``"zero"`` or ``"partial"``); a *plan* lists the
transfers between two placements; a *switch* executes one.
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed  # noqa: F401  (registers the ProcessGroup types the extension takes)

from hotswitch._C import (  # noqa: E402
    CostModel,
    HardwareProfile,
    Layout,
    ModelConfig,
    ParamSpec,
    Placement,
    Planner,
    PlanCache,
    SwitchFault,
    SwitchTimeout,
    Topology,
)
from hotswitch.logging import get_logger, set_log_level  # noqa: E402
from hotswitch.hardware import load_profile, save_profile  # noqa: E402
from hotswitch.specs import llama_tensor_set, shard_tensors  # noqa: E402
from hotswitch.redistribute import (  # noqa: E402
    SwitchResult,
    TensorSet,
    plan_switch,
    switch,
)
from hotswitch.model import (  # noqa: E402
    MicroBatch,
    ParallelGroups,
    ParallelTransformer,
    StaticTrainer,
    TransformerConfig,
    count_targets,
    init_full,
    init_shards,
    split_replicas,
    train_static,
)
from hotswitch.runtime import PhaseResult, Runtime, StepResult  # noqa: E402
from hotswitch.checkpoint import CheckpointError  # noqa: E402
from hotswitch.distributed import init_distributed  # noqa: E402
from hotswitch.calibrate import calibrate  # noqa: E402

__all__ = [
    "CheckpointError",
    "CostModel",
    "HardwareProfile",
    "Layout",
    "MicroBatch",
    "ModelConfig",
    "ParallelGroups",
    "ParallelTransformer",
    "ParamSpec",
    "PhaseResult",
    "Placement",
    "Planner",
    "PlanCache",
    "Runtime",
    "StaticTrainer",
    "StepResult",
    "SwitchFault",
    "SwitchResult",
    "SwitchTimeout",
    "TensorSet",
    "Topology",
    "TransformerConfig",
    "calibrate",
    "count_targets",
    "get_logger",
    "init_distributed",
    "init_full",
    "init_shards",
    "llama_tensor_set",
    "plan_switch",
    "set_log_level",
    "shard_tensors",
    "split_replicas",
    "switch",
    "train_static",
]
