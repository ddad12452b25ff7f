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

__all__ = [
    "CostModel",
    "HardwareProfile",
    "Layout",
    "ModelConfig",
    "ParamSpec",
    "Planner",
    "PlanCache",
    "SwitchFault",
    "SwitchResult",
    "SwitchTimeout",
    "TensorSet",
    "Topology",
    "get_logger",
    "llama_tensor_set",
    "plan_switch",
    "set_log_level",
    "shard_tensors",
    "switch",
]
