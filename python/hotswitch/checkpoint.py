"""Checkpoints independent of the layout: every parameter and optimizer state is stored by
logical name and full shape, as boxes of the full tensor, so a checkpoint saved under one
home layout and world loads into any other the model allows.

Layout of a checkpoint directory ``ROOT/step_00000042``::

    metadata.json              format, step, tensor specs, the manifest of every box file
                               (tensor, state, box, bytes, CRC-32), scalar optimizer state,
                               optimizer hyperparameters, the data position, user extras
    boxes/<state>/<tensor>/<lo>_<hi>.bin   raw little-endian elements of one box, row-major
    rng/rank_00003.pt          each rank's RNG states (restored when the world is the same)

``read_tensors`` and ``write_tensors`` read and write the full tensors of one process (model
conversion, ``python -m hotswitch.convert``); a checkpoint that ``write_tensors`` made holds
the weights only, and the optimizer that loads it keeps its own settings and starts afresh.

Each box is written once, by one rank that holds it (no rank gathers the model). A save
goes to a temporary directory renamed to ``step_N`` only once every rank has written and
``metadata.json`` is complete, then ``ROOT/latest`` names it: a crash during a save leaves
the previous checkpoint loadable. A load checks every file it reads (size and CRC-32) and
refuses a corrupt, truncated or mismatched checkpoint naming the file and the tensor, on
every rank, before any state changes.
"""

import io
import os
import shutil
import zlib
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist

from hotswitch import _C
from hotswitch._boxes import local_views, owned_pieces
from hotswitch._checks import read_json_object
from hotswitch._errors import as_fault
from hotswitch.logging import get_logger
from hotswitch._checkpoint_state import CheckpointError, _agree, _commit, _publish, _states

__all__ = ["CKPT_FORMATS", "CheckpointError", "latest_checkpoint", "load", "read_tensors", "save", "write_tensors"]

FORMAT = "hotswitch-checkpoint-1"
_log = get_logger("checkpoint")


def _box_name(lo, hi) -> str:
    return "-".join(map(str, lo)) + "_" + "-".join(map(str, hi))


def _buffers(runtime, tensors: List[torch.Tensor]) -> List[torch.Tensor]:
    """Local buffers in placement order (one flat buffer for ZeRO)."""
    return [t.reshape(-1) if runtime.zero else t for t in tensors]


CKPT_FORMATS = ("hotswitch", "torch_dist")


def save(runtime, root: str, data_state: Optional[dict] = None, extra: Optional[dict] = None,
         ckpt_format: str = "hotswitch") -> str:
    """Saves the runtime's master weights, optimizer state, step, RNG states and
    ``data_state`` (e.g. the sampler's ``state_dict()``) under ``root/step_<N>``; returns that
    path. Collective over the runtime's group. Raises ``CheckpointError`` on every rank when
    any rank fails to write (e.g. a full disk), ``hs.SwitchFault``/``SwitchTimeout`` when a
    peer dies or stalls; either way the previous checkpoint stays loadable.

    ``ckpt_format``: ``"hotswitch"`` (this module's format) or ``"torch_dist"``
    (``torch.distributed.checkpoint``, ``hotswitch.dist_checkpoint``); ``load`` reads both."""
    if ckpt_format not in CKPT_FORMATS:
        raise ValueError(f"ckpt_format {ckpt_format!r} is not one of {', '.join(CKPT_FORMATS)}")
    if not isinstance(root, (str, os.PathLike)):
        raise ValueError(f"checkpoint directory must be a path, got {type(root).__name__}")
    try:
        if ckpt_format == "torch_dist":
            from hotswitch import dist_checkpoint
            return dist_checkpoint.save(runtime, root, data_state, extra)
        return _save(runtime, root, data_state, extra)
    except (ValueError, _C.SwitchFault):
        raise
    except RuntimeError as e:
        raise as_fault(e, f"rank {runtime.rank}, saving checkpoint step {runtime.step} under {root}") from e


def load(runtime, path: str, optimizer: bool = True, rng: bool = True, reset_step: bool = False) -> dict:
    """Loads a checkpoint (a ``step_N`` directory, or a root holding ``latest``) into the
    runtime, whatever home layout and world it was saved under. Collective. Returns
    ``{"step", "data_state", "extra"}``. Raises ``CheckpointError`` on every rank, with the
    runtime unchanged, when any rank finds the checkpoint missing, corrupt, truncated or of
    another model (naming the file and the tensor).

    Megatron-LM's options: ``optimizer=False`` (``--no-load-optim``) loads the weights only,
    the optimizer and loss scaler starting afresh; ``rng=False`` (``--no-load-rng``) keeps
    this process's RNG states; ``reset_step=True`` (with both off: ``--finetune``) starts
    counting steps at 0, and the data position returned is None."""
    try:
        if isinstance(path, (str, os.PathLike)):
            path = os.fspath(path)
            if not os.path.isfile(os.path.join(path, "metadata.json")) and os.path.isfile(os.path.join(path, "latest")):
                path = latest_checkpoint(path) or path
            from hotswitch import dist_checkpoint
            if dist_checkpoint.is_dcp_checkpoint(path):
                return dist_checkpoint.load(runtime, path, optimizer, rng, reset_step)
        return _load(runtime, path, optimizer, rng, reset_step)
    except (ValueError, _C.SwitchFault):
        raise
    except RuntimeError as e:
        raise as_fault(e, f"rank {runtime.rank}, loading checkpoint {path}") from e


def _save(runtime, root: str, data_state: Optional[dict] = None, extra: Optional[dict] = None) -> str:
    """See ``save``."""
    group, rank = runtime.control, runtime.rank
    if not isinstance(root, (str, os.PathLike)):
        raise ValueError(f"checkpoint directory must be a path, got {type(root).__name__}")
    root = os.fspath(root)
    name = f"step_{runtime.step:08d}"
    nonce = [os.urandom(4).hex() if rank == 0 else None]
    dist.broadcast_object_list(nonce, src=0, group=group)
    tmp = os.path.join(root, f".{name}.tmp-{nonce[0]}")
    manifest, message, rng_entry = [], "", None
    try:
        state_dict = runtime.state_dict()
        tensors, scalars = _states(state_dict)
        writes = owned_pieces(runtime.tensor_set, runtime.home, runtime.home_placement).get(rank, set())
        os.makedirs(os.path.join(tmp, "rng"), exist_ok=True)
        specs = runtime.tensor_set.specs
        for state, local in tensors.items():
            for t, lo, hi, view in local_views(runtime.tensor_set, runtime.home, runtime.home_placement, rank,
                                           _buffers(runtime, local)):
                if (t, lo, hi) not in writes:
                    continue
                spec = specs[t]
                runtime.hooks.fire("save")
                rel = os.path.join("boxes", state, spec.name, _box_name(lo, hi) + ".bin")
                path = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                data = view.detach().cpu().contiguous().numpy().tobytes()
                with open(path, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                manifest.append({"state": state, "tensor": spec.name, "lo": list(lo), "hi": list(hi),
                                 "file": rel, "bytes": len(data), "crc32": zlib.crc32(data)})
        buf = io.BytesIO()
        torch.save({"torch": torch.get_rng_state(),
                    "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}, buf)
        data = buf.getvalue()
        rel = os.path.join("rng", f"rank_{rank:05d}.pt")
        with open(os.path.join(tmp, rel), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        rng_entry = {"rank": rank, "file": rel, "bytes": len(data), "crc32": zlib.crc32(data)}
        ok = True
    except (OSError, ValueError, RuntimeError) as e:
        ok, message = False, f"{type(e).__name__}: {e}"
    everyone: List[Optional[tuple]] = [None] * runtime.world
    dist.all_gather_object(everyone, (ok, message, manifest, rng_entry), group=group)
    failed = [(r, m) for r, (good, m, _, _) in enumerate(everyone) if not good]
    if failed:
        if rank == 0:  # every rank is done writing: the partial directory goes
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"saving {os.path.join(root, name)} failed: " +
                              "; ".join(f"rank {r}: {m}" for r, m in failed))
    ok, message = True, ""
    if rank == 0:
        try:
            entries = sorted((e for _, _, m, _ in everyone for e in m), key=lambda e: (e["state"], e["tensor"], e["lo"]))
            meta = {
                "format": FORMAT,
                "step": runtime.step,
                "skipped": state_dict["skipped"],
                "grad_scaler": state_dict["grad_scaler"],
                "world": runtime.world,
                "home": runtime.home.name,
                "zero": runtime.zero,
                "specs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in runtime.tensor_set.specs],
                "states": sorted(tensors),
                "scalars": scalars,
                "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                 for g in state_dict["optimizer"]["param_groups"]],
                "data_state": data_state,
                "extra": extra,
                "recent": runtime.recent_batches(),
                "manifest": entries,
                "rng": [r for _, _, _, r in everyone],
            }
            _publish(tmp, root, name, meta)
        except (OSError, TypeError, ValueError) as e:
            ok, message = False, f"{type(e).__name__}: {e}"
            shutil.rmtree(tmp, ignore_errors=True)  # the previous checkpoint stays the latest
    _agree(ok, message, group)
    _log.info("rank %d: saved %s (%d boxes written here)", rank, name, len(manifest))
    return os.path.join(root, name)


def latest_checkpoint(root: str) -> Optional[str]:
    """The checkpoint ``root/latest`` names, or None when there is none."""
    try:
        with open(os.path.join(root, "latest")) as f:
            name = f.read().strip()
    except OSError:
        return None
    path = os.path.join(root, name)
    return path if name and os.path.isdir(path) else None


def _open(path: str):
    """(the checkpoint directory, its metadata) of ``path``: a ``step_N`` directory, or a root
    whose ``latest`` names one."""
    if not os.path.exists(os.path.join(path, "metadata.json")) and os.path.exists(os.path.join(path, "latest")):
        found = latest_checkpoint(path)
        if found is None:
            raise CheckpointError(f"{path}/latest names no checkpoint directory")
        path = found
    return path, _read_metadata(path)


def _read_metadata(path: str) -> dict:
    meta_path = os.path.join(path, "metadata.json")
    meta = read_json_object(meta_path, "checkpoint metadata", CheckpointError)
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{meta_path} is not a {FORMAT} checkpoint (format {meta.get('format')!r})")
    return meta


class _Reader:
    """Reads box files once each, checking their size and CRC-32."""

    def __init__(self, path: str):
        self.path = path
        self.cache: Dict[str, np.ndarray] = {}

    def read(self, entry: dict, dtype) -> np.ndarray:
        rel = entry["file"]
        if rel not in self.cache:
            data = self.read_bytes(entry)
            shape = [b - a for a, b in zip(entry["lo"], entry["hi"])]
            self.cache[rel] = np.frombuffer(data, dtype=dtype).reshape(shape)
        return self.cache[rel]

    def read_bytes(self, entry: dict) -> bytes:
        """The bytes of one box file, size and CRC-32 checked."""
        full = os.path.join(self.path, entry["file"])
        try:
            with open(full, "rb") as f:
                data = f.read()
        except OSError as e:
            raise CheckpointError(f"cannot read {full} (tensor {entry['tensor']}, {entry['state']}): "
                                  f"{e.strerror}") from None
        if len(data) != entry["bytes"]:
            raise CheckpointError(f"{full} (tensor {entry['tensor']}, {entry['state']}) has {len(data)} bytes, "
                                  f"expected {entry['bytes']}: truncated or overwritten")
        if zlib.crc32(data) != entry["crc32"]:
            raise CheckpointError(f"{full} (tensor {entry['tensor']}, {entry['state']}) fails its CRC-32 check: "
                                  "corrupt")
        return data


def _fill(reader: _Reader, entries: List[dict], lo, hi, out: torch.Tensor, what: str) -> None:
    """Copies box [lo, hi) of a tensor from the files of ``entries`` into ``out``."""
    covered = 0
    dtype = torch.empty(0, dtype=out.dtype).numpy().dtype
    for e in entries:
        a = [max(x, y) for x, y in zip(lo, e["lo"])]
        b = [min(x, y) for x, y in zip(hi, e["hi"])]
        if any(x >= y for x, y in zip(a, b)):
            continue
        src = reader.read(e, dtype)
        src_box = tuple(slice(x - o, y - o) for x, y, o in zip(a, b, e["lo"]))
        dst_box = tuple(slice(x - o, y - o) for x, y, o in zip(a, b, lo))
        out[dst_box] = torch.from_numpy(src[src_box].copy())
        covered += int(np.prod([y - x for x, y in zip(a, b)]))
    need = int(np.prod([y - x for x, y in zip(lo, hi)]))
    if covered != need:
        raise CheckpointError(f"{reader.path}: {what} box {list(lo)}..{list(hi)} is covered by {covered} of "
                              f"{need} elements in the manifest: missing tensor data")


def _load(runtime, path: str, load_optimizer: bool = True, load_rng: bool = True, reset_step: bool = False) -> dict:
    """See ``load``."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"checkpoint path must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    group, rank = runtime.control, runtime.rank
    new_states, meta, message, rng_states = None, None, "", None
    try:
        path, meta = _open(path)
        specs = {s.name: s for s in runtime.tensor_set.specs}
        saved = {s["name"]: s for s in meta["specs"]}
        for name, spec in specs.items():
            if name not in saved:
                raise CheckpointError(f"{path}/metadata.json has no tensor {name!r}: another model")
            if saved[name]["shape"] != list(spec.shape) or saved[name]["dtype"] != spec.dtype:
                raise CheckpointError(f"{path}/metadata.json: tensor {name!r} is {saved[name]['shape']} "
                                      f"{saved[name]['dtype']}, the model's is {list(spec.shape)} {spec.dtype}")
        extra_names = sorted(set(saved) - set(specs))
        if extra_names:
            raise CheckpointError(f"{path}/metadata.json holds tensors the model lacks: {extra_names[:5]}")
        by_tensor: Dict[tuple, List[dict]] = {}
        for e in meta["manifest"]:
            by_tensor.setdefault((e["state"], e["tensor"]), []).append(e)
        reader = _Reader(path)
        current = runtime.state_dict()
        masters = current["params"]
        new_states = {}
        specs = runtime.tensor_set.specs
        for state in (meta["states"] if load_optimizer else [s for s in meta["states"] if s == "param"]):
            local = [torch.empty_like(p) for p in masters]
            for t, lo, hi, view in local_views(runtime.tensor_set, runtime.home, runtime.home_placement, rank,
                                           _buffers(runtime, local)):
                name = specs[t].name
                _fill(reader, by_tensor.get((state, name), []), lo, hi, view, f"tensor {name!r} ({state})")
            if runtime.zero:
                # ZeRO padding beyond the last tensor belongs to nobody: zero it.
                covered = torch.zeros(local[0].numel(), dtype=torch.bool)
                for t, lo, hi, view in local_views(runtime.tensor_set, runtime.home, "zero", rank, [covered]):
                    view.fill_(True)
                local[0].view(-1)[~covered] = 0
            new_states[state] = local
        if "param" not in new_states:
            raise CheckpointError(f"{path}/metadata.json lists no parameters")
        groups = current["optimizer"]["param_groups"]
        if meta["param_groups"] is not None and load_optimizer and len(meta["param_groups"]) != len(groups):
            raise CheckpointError(f"{path}/metadata.json has {len(meta['param_groups'])} optimizer parameter groups, "
                                  f"the runtime's optimizer {len(groups)}")
        rng_states = None
        if load_rng and meta["world"] == runtime.world and meta.get("rng"):
            entry = meta["rng"][rank]
            with open(os.path.join(path, entry["file"]), "rb") as f:
                data = f.read()
            if len(data) != entry["bytes"] or zlib.crc32(data) != entry["crc32"]:
                raise CheckpointError(f"{os.path.join(path, entry['file'])}: RNG states of rank {rank} are corrupt "
                                      f"({len(data)} bytes, CRC32 {zlib.crc32(data)}; expected {entry['bytes']} "
                                      f"bytes, CRC32 {entry['crc32']})")
            rng_states = torch.load(io.BytesIO(data))
        ok = True
    except CheckpointError as e:
        ok, message = False, str(e)
    except (OSError, KeyError, TypeError, ValueError) as e:
        ok, message = False, f"{path}: malformed checkpoint ({type(e).__name__}: {e})"
    _agree(ok, message, group)

    return _commit(runtime, path, meta, new_states, rng_states, load_optimizer, reset_step)


def _torch_dtype(name: str, where: str) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise CheckpointError(f"{where}: dtype {name!r} is not a torch dtype")
    return dtype


def read_tensors(path: str, state: str = "param") -> Tuple[Dict[str, torch.Tensor], dict]:
    """The full tensors of one state of a checkpoint (``"param"``: the weights), name -> tensor
    of the spec's full shape and dtype in spec order, and the checkpoint's metadata. Not
    collective: one process reads every box (for conversion and inspection; a runtime
    loads with ``load``). ``path``: a ``step_N`` directory or a root holding ``latest``.
    ``CheckpointError`` naming the file and the tensor for a missing, corrupt or incomplete
    checkpoint."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"checkpoint path must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    path, meta = _open(path)
    try:
        if state not in meta["states"]:
            raise CheckpointError(f"{path}/metadata.json has no state {state!r} (states: {meta['states']})")
        entries: Dict[str, List[dict]] = {}
        for e in meta["manifest"]:
            if e["state"] == state:
                entries.setdefault(e["tensor"], []).append(e)
        reader = _Reader(path)
        out: Dict[str, torch.Tensor] = {}
        for spec in meta["specs"]:
            name, shape = spec["name"], list(spec["shape"])
            dtype = _torch_dtype(spec["dtype"], f"{path}/metadata.json: tensor {name!r}")
            full = torch.empty(shape, dtype=dtype)
            covered = 0
            for e in entries.get(name, []):
                box = [b - a for a, b in zip(e["lo"], e["hi"])]
                if len(box) != len(shape) or any(a < 0 or b > n for a, b, n in zip(e["lo"], e["hi"], shape)):
                    raise CheckpointError(f"{path}: box {e['lo']}..{e['hi']} of tensor {name!r} lies outside its "
                                          f"shape {shape}")
                data = reader.read_bytes(e)
                if len(data) != int(np.prod(box)) * full.element_size():
                    raise CheckpointError(f"{path}/{e['file']}: {len(data)} bytes for box {box} of {dtype} "
                                          f"(tensor {name!r})")
                if data:  # bytes first, then a view as the dtype: numpy has no bfloat16
                    raw = torch.from_numpy(np.frombuffer(data, dtype=np.uint8).copy())
                    full[tuple(slice(a, b) for a, b in zip(e["lo"], e["hi"]))] = raw.view(dtype).reshape(box)
                covered += int(np.prod(box))
            if covered != full.numel():
                raise CheckpointError(f"{path}: tensor {name!r} ({state}) has {covered} of {full.numel()} elements "
                                      "in the manifest: missing or overlapping boxes")
            out[name] = full
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"{path}: malformed checkpoint ({type(e).__name__}: {e})") from None
    return out, meta


def write_tensors(root: str, tensors: Dict[str, torch.Tensor], step: int = 0, extra: Optional[dict] = None) -> str:
    """Writes full tensors (name -> CPU tensor) as a weights-only checkpoint ``root/step_N``
    (one box per tensor; ``latest`` names it) and returns its path. Not collective: one
    process writes. ``Runtime.load_checkpoint`` loads it under any layout and world when the
    names, shapes and dtypes are the model's; its optimizer keeps its settings and starts
    with no state."""
    if not isinstance(root, (str, os.PathLike)):
        raise ValueError(f"checkpoint directory must be a path, got {type(root).__name__}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an int >= 0, got {step!r}")
    if not isinstance(tensors, dict) or not tensors:
        raise ValueError("tensors must be a non-empty dict of name -> torch.Tensor")
    root = os.fspath(root)
    name = f"step_{step:08d}"
    tmp = os.path.join(root, f".{name}.tmp-{os.urandom(4).hex()}")
    manifest, specs = [], []
    try:
        for tensor, t in tensors.items():
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"tensor {tensor!r} is a {type(t).__name__}, expected a torch.Tensor")
            data = t.detach().cpu().contiguous()
            width = data.element_size()
            raw = data.view(torch.uint8) if width == 1 else \
                data.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[width])
            blob = raw.numpy().tobytes()
            lo, hi = [0] * data.dim(), list(data.shape)
            rel = os.path.join("boxes", "param", tensor, _box_name(lo, hi) + ".bin")
            os.makedirs(os.path.dirname(os.path.join(tmp, rel)), exist_ok=True)
            with open(os.path.join(tmp, rel), "wb") as f:
                f.write(blob)
            manifest.append({"state": "param", "tensor": tensor, "lo": lo, "hi": hi, "file": rel,
                             "bytes": len(blob), "crc32": zlib.crc32(blob)})
            specs.append({"name": tensor, "shape": hi, "dtype": str(data.dtype).replace("torch.", "")})
        meta = {"format": FORMAT, "step": step, "world": 1, "home": "dp1", "zero": False, "specs": specs,
                "states": ["param"], "scalars": {}, "param_groups": None, "data_state": None, "extra": extra,
                "manifest": manifest, "rng": []}
        final = _publish(tmp, root, name, meta)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final
