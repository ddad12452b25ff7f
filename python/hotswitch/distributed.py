"""Joining the job's process group under torchrun or ``python -m hotswitch.launch``."""

import os
from datetime import timedelta
from typing import Optional

__all__ = ["INIT_METHOD_ENV", "init_distributed"]

INIT_METHOD_ENV = "HOTSWITCH_INIT_METHOD"


def init_distributed(backend: Optional[str] = None, timeout_s: float = 300.0):
    """Initialises the default process group from the launcher's environment.

    ``backend`` defaults to NCCL when CUDA is available, else gloo. Under
    ``hotswitch.launch`` the ranks meet through its file store; under torchrun through
    ``env://``. Returns ``(rank, world_size, local_rank)``; ValueError when the environment
    names no rank or world size.
    """
    import torch
    import torch.distributed as dist

    for name in ("RANK", "WORLD_SIZE"):
        value = os.environ.get(name)
        if value is None or not value.isdigit():
            raise ValueError(f"environment variable {name} is {value!r}; start the script with "
                             "torchrun or python -m hotswitch.launch")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)
    if not 0 <= rank < world:
        raise ValueError(f"RANK({rank}) must lie in [0, WORLD_SIZE({world}))")
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if not dist.is_initialized():
        dist.init_process_group(backend, init_method=os.environ.get(INIT_METHOD_ENV, "env://"),
                                rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s))
    return rank, world, local_rank
