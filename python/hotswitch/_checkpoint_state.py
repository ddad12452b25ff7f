"""What both checkpoint formats share (``hotswitch.checkpoint``, ``hotswitch.dist_checkpoint``):
the error, the runtime's states to save, agreeing on failures, publishing a completed
directory and committing loaded states to the runtime."""

import json
import os
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from hotswitch.logging import get_logger

__all__ = ["CheckpointError"]

_log = get_logger("checkpoint")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: missing, corrupt, truncated or of another model."""


def _states(state_dict: dict) -> Tuple[Dict[str, List[torch.Tensor]], Dict[str, object]]:
    """The tensors of a ``Runtime.state_dict()`` to save by state name ('param', then one per
    optimizer state tensor shaped like its parameter), as lists of local buffers in master
    order, and the scalar optimizer state (equal for every parameter)."""
    masters = state_dict["params"]
    tensors = {"param": list(masters)}
    scalars: Dict[str, object] = {}
    # The optimizer's state_dict keys its state by the parameter's index, which is the master order.
    per_param = [state_dict["optimizer"]["state"].get(i, {}) for i in range(len(masters))]
    keys = sorted(per_param[0]) if per_param else []
    for state in per_param:
        if sorted(state) != keys:
            raise ValueError(f"optimizer state keys differ between parameters: {keys} vs {sorted(state)}")
    for key in keys:
        values = [state[key] for state in per_param]
        if all(isinstance(v, torch.Tensor) and v.shape == p.shape for v, p in zip(values, masters)) \
                and values[0].dim() > 0:
            tensors[key] = [v.detach() for v in values]
        elif all(not isinstance(v, torch.Tensor) or v.dim() == 0 for v in values):
            plain = [float(v) if isinstance(v, torch.Tensor) else v for v in values]
            if any(v != plain[0] for v in plain):
                raise ValueError(f"optimizer state {key!r} differs between parameters ({plain[0]} vs others); "
                                 "layout-independent checkpoints need it equal")
            scalars[key] = {"value": plain[0], "tensor": isinstance(values[0], torch.Tensor),
                            "dtype": str(values[0].dtype).replace("torch.", "") if isinstance(values[0], torch.Tensor)
                            else None}
        else:
            raise ValueError(f"optimizer state {key!r} is neither shaped like its parameter nor a scalar; "
                             "layout-independent checkpoints cannot store it")
    return tensors, scalars


def _agree(ok: bool, message: str, group) -> None:
    """Raises on every rank when any rank failed, with the failing ranks' messages."""
    everyone: List[Optional[Tuple[bool, str]]] = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, (ok, message), group=group)
    failed = [(r, m) for r, (good, m) in enumerate(everyone) if not good]
    if failed:
        raise CheckpointError("; ".join(f"rank {r}: {m}" for r, m in failed))


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _publish(tmp: str, root: str, name: str, meta: dict, filename: str = "metadata.json") -> str:
    """Completes a checkpoint written into ``tmp``: its metadata, then the directory renamed to
    ``root/name`` and ``root/latest`` pointed at it, each step synced to disk, so a crash leaves
    either the previous checkpoint or this one as the latest. Returns the final path."""
    with open(os.path.join(tmp, filename), "w") as f:
        json.dump(meta, f)
        f.flush()
        os.fsync(f.fileno())
    _fsync_dir(tmp)
    final = os.path.join(root, name)
    if os.path.exists(final):
        shutil.rmtree(final)
    os.rename(tmp, final)
    latest = os.path.join(root, ".latest.tmp")
    with open(latest, "w") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(latest, os.path.join(root, "latest"))
    _fsync_dir(root)
    return final


def _commit(runtime, path: str, meta: dict, new_states: dict, rng_states, load_optimizer: bool,
            reset_step: bool) -> dict:
    """Every rank has read everything it needs: the runtime takes the loaded states."""
    rank = runtime.rank
    groups = runtime.optimizer.state_dict()["param_groups"]
    if meta["param_groups"] is None or not load_optimizer:  # weights only: the optimizer's own settings
        meta["param_groups"] = [{} for _ in groups]
    params = new_states.pop("param")
    opt_state = {}
    for i in range(len(params)):
        state = {key: values[i] for key, values in new_states.items()}
        for key, sc in (meta["scalars"] if load_optimizer else {}).items():
            state[key] = torch.tensor(sc["value"], dtype=getattr(torch, sc["dtype"])) if sc["tensor"] else sc["value"]
        if state:
            opt_state[i] = state
    param_groups = []
    for group_state, saved in zip(groups, meta["param_groups"]):
        merged = dict(group_state)
        for k, v in saved.items():
            merged[k] = tuple(v) if isinstance(group_state.get(k), tuple) else v
        param_groups.append(merged)
    runtime.load_state_dict({"step": 0 if reset_step else meta["step"], "params": params,
                             "optimizer": {"state": opt_state, "param_groups": param_groups},
                             "skipped": 0 if reset_step else meta.get("skipped", 0),
                             "grad_scaler": meta.get("grad_scaler") if load_optimizer else None})
    runtime.resume_home(meta.get("home"), meta.get("recent"))
    if rng_states is not None:
        torch.set_rng_state(rng_states["torch"])
        if rng_states.get("cuda") is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng_states["cuda"])
    _log.info("rank %d: loaded %s (step %d, saved under %s on %d ranks)", rank, path, meta["step"],
              meta["home"], meta["world"])
    return {"step": 0 if reset_step else meta["step"], "data_state": None if reset_step else meta["data_state"],
            "extra": meta["extra"]}
