"""hotswitch: per-step parallel layouts and planned hot switching for LLM training.

Vocabulary (``docs/architecture.md``): a *layout* is one parallel strategy over the world
(degrees dp, tp, pp, cp and a rank order); a *placement* says which index boxes of each tensor
a rank holds under a layout (``"sharded"``, ``"zero"`` or ``"partial"``); a *redistribution
plan* lists the transfers between two placements and a *switch* executes one; a *step plan*
cuts one step's sequences into *phases*, each a bucket of lengths under one layout.

This module is the public API. Subpackages: ``model`` (the parallel transformer),
``calibration`` (fitting the cost model, offline and online), ``analysis`` (simulations,
plots, the MILP reference), ``testing`` (multi-process harness, faults, the static reference
trainer) and ``cli`` (the command-line programs).
"""

import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed  # noqa: F401  (registers the ProcessGroup types the extension takes)

# The extension uses torch's C++ API, which changes between releases: it runs only under the
# torch it was compiled against.
try:
    from hotswitch import _C
except ImportError as e:
    raise ImportError(f"hotswitch's extension does not load under torch {torch.__version__} ({e}); rebuild it "
                      "against this torch: pip install --no-build-isolation . (or script/build)") from e
if _C.TORCH_VERSION != torch.__version__:
    raise ImportError(f"hotswitch's extension was built against torch {_C.TORCH_VERSION}, but this Python imports "
                      f"torch {torch.__version__}; rebuild it against this torch: pip install --no-build-isolation . "
                      "(or script/build)")

from hotswitch._C import (  # noqa: E402
    CostModel,
    HardwareProfile,
    Layout,
    ModelConfig,
    ParamSpec,
    Placement,
    PlannedPhase,
    Planner,
    StepPlan,
    SwitchFault,
    SwitchTimeout,
    Topology,
)
from hotswitch.logging import get_logger, set_log_level  # noqa: E402
from hotswitch.hardware import load_hardware, load_profile, save_profile  # noqa: E402
from hotswitch.specs import llama_tensor_set, shard_tensors  # noqa: E402
from hotswitch.redistribute import SwitchResult, TensorSet, plan_switch, switch  # noqa: E402
from hotswitch.model import (  # noqa: E402
    MicroBatch,
    ParallelGroups,
    ParallelTransformer,
    TransformerConfig,
    count_targets,
    init_shards,
    split_replicas,
)
from hotswitch.config import RuntimeConfig  # noqa: E402
from hotswitch.runtime import NonFiniteLoss, PhaseResult, Runtime, StepResult  # noqa: E402
from hotswitch.checkpoint import CheckpointError  # noqa: E402
from hotswitch.distributed import init_distributed, spawn  # noqa: E402
from hotswitch.calibration import calibrate  # noqa: E402

# The public API: what a training script needs. Everything else stays importable from its
# module (hotswitch.model, hotswitch.calibration, hotswitch.logging, ...).
__all__ = [
    "CheckpointError",
    "CostModel",
    "HardwareProfile",
    "Layout",
    "ModelConfig",
    "NonFiniteLoss",
    "ParamSpec",
    "PhaseResult",
    "Placement",
    "Planner",
    "Runtime",
    "RuntimeConfig",
    "StepPlan",
    "StepResult",
    "SwitchFault",
    "SwitchResult",
    "SwitchTimeout",
    "TensorSet",
    "Topology",
    "TransformerConfig",
    "init_distributed",
    "llama_tensor_set",
    "load_hardware",
    "plan_switch",
    "switch",
]
