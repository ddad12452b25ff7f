"""Checkpoints in ``torch.distributed.checkpoint`` (DCP) format: what torchtitan and
Megatron-LM's ``--ckpt-format torch_dist`` write, and what any DCP reader opens.

Every rank writes the boxes of the full tensors it owns under the current home layout (each
box once, as for hotswitch's own format), as chunks of one global tensor per parameter and
per optimizer state:

    model/<tensor name>                 the master weights, full shape, fp32 (or the model's dtype)
    optim/<state>/<tensor name>         Adam's exp_avg and exp_avg_sq, shaped like the parameter
    rng/rank_00003                      each rank's RNG states (bytes)

``hotswitch.json`` beside DCP's ``.metadata`` holds the rest as hotswitch's format does (step,
specs, scalar optimizer state, hyperparameters, data position, extras). A load reads the
boxes of the current layout, whatever layout and world saved them: DCP's resharding maps
each local box onto the saved chunks. The save is written into a temporary directory and
renamed once complete, then ``ROOT/latest`` names it, as for hotswitch's format; a load
checks every tensor's shape and dtype and that the saved chunks cover every box, and refuses
(``CheckpointError``, on every rank, nothing changed) a checkpoint of another model, a
partial one or one whose files DCP cannot read.
"""

import io
import os
import shutil
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, MetadataIndex,
                                                   TensorProperties, TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, ReadItem, SavePlan,
                                                  SavePlanner, TensorWriteData, WriteItem, WriteItemType)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import create_default_global_save_plan

from hotswitch._boxes import local_views, owned_pieces
from hotswitch._checkpoint_state import CheckpointError, _agree, _commit, _publish, _states
from hotswitch._checks import read_json_object
from hotswitch.logging import get_logger

__all__ = ["DCP_FORMAT", "MARKER", "is_dcp_checkpoint", "load", "save"]

DCP_FORMAT = "hotswitch-dcp-1"
MARKER = "hotswitch.json"
_log = get_logger("checkpoint")


def is_dcp_checkpoint(path: str) -> bool:
    return os.path.isfile(os.path.join(path, ".metadata"))


def _fqn(state: str, tensor: str) -> str:
    return f"model/{tensor}" if state == "param" else f"optim/{state}/{tensor}"


class _BoxSavePlanner(SavePlanner):
    """Writes exactly the given items: ``(WriteItem, data)`` pairs."""

    def __init__(self, items: List[Tuple[WriteItem, object]]):
        self.items = items
        self.data = {(w.index.fqn, tuple(w.index.offset) if w.index.offset is not None else None): d
                     for w, d in items}

    def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False) -> None:
        self.is_coordinator = is_coordinator

    def create_local_plan(self) -> SavePlan:
        return SavePlan([w for w, _ in self.items])

    def create_global_plan(self, all_plans):
        return create_default_global_save_plan(all_plans)

    def finish_plan(self, new_plan: SavePlan) -> SavePlan:
        return new_plan

    def resolve_data(self, write_item: WriteItem):
        index = write_item.index
        return self.data[(index.fqn, tuple(index.offset) if index.offset is not None else None)]


class _BoxLoadPlanner(LoadPlanner):
    """Reads the given boxes (``fqn -> [(lo, view)]``) and byte keys from a checkpoint, DCP
    resharding each box onto the saved chunks; counts the elements each box received."""

    def __init__(self, boxes: Dict[str, List[Tuple[tuple, torch.Tensor]]], byte_keys: List[str]):
        self.boxes, self.byte_keys = boxes, byte_keys
        self.views = {(fqn, tuple(lo)): view for fqn, entries in boxes.items() for lo, view in entries}
        self.received: Dict[Tuple[str, tuple], int] = {}
        self.bytes: Dict[str, object] = {}

    def set_up_planner(self, state_dict, metadata=None, is_coordinator=False) -> None:
        self.metadata = metadata

    def create_local_plan(self) -> LoadPlan:
        items: List[ReadItem] = []
        for fqn, entries in self.boxes.items():
            md = self.metadata.state_dict_metadata[fqn]
            for lo, view in entries:
                chunk = ChunkStorageMetadata(offsets=torch.Size(lo), sizes=view.shape)
                items += create_read_items_for_chunk_list(fqn, md, [chunk])
        for key in self.byte_keys:
            index = MetadataIndex(key)
            items.append(ReadItem(type=LoadItemType.BYTE_IO, dest_index=index, dest_offsets=torch.Size((0,)),
                                  storage_index=index, storage_offsets=torch.Size((0,)), lengths=torch.Size((0,))))
        return LoadPlan(items)

    def create_global_plan(self, global_plan):
        return global_plan

    def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
        return new_plan

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        self.bytes[read_item.dest_index.fqn] = torch.load(value, weights_only=False)

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        key = (read_item.dest_index.fqn, tuple(read_item.dest_index.offset))
        view = self.views[key]
        for dim, (offset, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
            view = view.narrow(dim, offset, length)
        self.received[key] = self.received.get(key, 0) + view.numel()
        return view

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        pass


def _reason(e: BaseException) -> str:
    """One line per failing rank of DCP's exception (its text holds whole tracebacks)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"rank {r}: {type(x).__name__}: {str(x).splitlines()[0] if str(x) else ''}"
                         for r, x in sorted(failures.items()))
    return f"{type(e).__name__}: {e}"


def save(runtime, root: str, data_state: Optional[dict] = None, extra: Optional[dict] = None) -> str:
    """Saves as ``hotswitch.checkpoint.save`` does, in DCP format; returns the path."""
    group, rank = runtime.control, runtime.rank
    root = os.fspath(root)
    name = f"step_{runtime.step:08d}"
    nonce = [os.urandom(4).hex() if rank == 0 else None]
    dist.broadcast_object_list(nonce, src=runtime._root, group=group)
    tmp = os.path.join(root, f".{name}.tmp-{nonce[0]}")
    state_dict = runtime.state_dict()
    tensors, scalars = _states(state_dict)
    writes = owned_pieces(runtime.tensor_set, runtime.home, runtime.home_placement).get(rank, set())
    items: List[Tuple[WriteItem, object]] = []
    specs = runtime.tensor_set.specs
    for state, local in tensors.items():
        buffers = [t.reshape(-1) if runtime.zero else t for t in local]
        for t, lo, hi, view in local_views(runtime.tensor_set, runtime.home, runtime.home_placement, rank, buffers):
            if (t, lo, hi) not in writes:
                continue
            spec = specs[t]
            data = view.detach().cpu().contiguous().clone()
            fqn = _fqn(state, spec.name)
            items.append((WriteItem(index=MetadataIndex(fqn, torch.Size(lo)), type=WriteItemType.SHARD,
                                    tensor_data=TensorWriteData(
                                        chunk=ChunkStorageMetadata(offsets=torch.Size(lo), sizes=data.shape),
                                        properties=TensorProperties(dtype=data.dtype),
                                        size=torch.Size(spec.shape))), data))
    rng = io.BytesIO()
    torch.save({"torch": torch.get_rng_state(),
                "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}, rng)
    rng.seek(0)
    items.append((WriteItem(index=MetadataIndex(f"rng/rank_{rank:05d}"), type=WriteItemType.BYTE_IO), rng))
    ok, message = True, ""
    try:
        if rank == 0:
            os.makedirs(tmp, exist_ok=True)
        dist.barrier(group=group)
        dcp.save({}, storage_writer=dcp.FileSystemWriter(tmp), planner=_BoxSavePlanner(items), process_group=group)
    except (Exception, CheckpointException) as e:  # DCP gathers every rank's failure, raised everywhere
        ok, message = False, _reason(e)
    try:
        _agree(ok, message, group)
    except CheckpointError as e:
        if rank == 0:  # every rank is done writing: the partial directory goes
            shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(f"saving {os.path.join(root, name)} failed: {e}") from None
    if rank == 0:
        meta = {
            "format": DCP_FORMAT, "step": runtime.step, "skipped": state_dict["skipped"],
            "grad_scaler": state_dict["grad_scaler"], "world": runtime.world, "home": runtime.home.name,
            "zero": runtime.zero,
            "specs": [{"name": s.name, "shape": list(s.shape), "dtype": s.dtype} for s in runtime.tensor_set.specs],
            "states": sorted(tensors), "scalars": scalars,
            "param_groups": [{k: v for k, v in g.items() if k != "params"}
                             for g in state_dict["optimizer"]["param_groups"]],
            "data_state": data_state, "extra": extra, "recent": runtime.recent_batches(),
        }
        try:
            _publish(tmp, root, name, meta, MARKER)
        except (OSError, TypeError, ValueError) as e:
            ok, message = False, f"{type(e).__name__}: {e}"
            shutil.rmtree(tmp, ignore_errors=True)
    try:
        _agree(ok, message, group)
    except CheckpointError as e:
        raise CheckpointError(f"saving {os.path.join(root, name)} failed: {e}") from None
    _log.info("rank %d: saved %s in DCP format (%d boxes written here)", rank, name, len(items) - 1)
    return os.path.join(root, name)


def load(runtime, path: str, load_optimizer: bool = True, load_rng: bool = True, reset_step: bool = False) -> dict:
    """Loads a DCP checkpoint as ``hotswitch.checkpoint.load`` does (the same options)."""
    group, rank = runtime.control, runtime.rank
    ok, message, meta, planner, new_states = True, "", None, None, {}
    try:
        meta = read_json_object(os.path.join(path, MARKER), "checkpoint metadata", CheckpointError)
        if meta.get("format") != DCP_FORMAT:
            raise CheckpointError(f"{path}/{MARKER} is not a {DCP_FORMAT} checkpoint (format {meta.get('format')!r})")
        try:
            saved_md = dcp.FileSystemReader(path).read_metadata().state_dict_metadata
        except Exception as e:
            raise CheckpointError(f"{path}/.metadata: DCP cannot read it ({type(e).__name__}: {e})") from None
        states = meta["states"] if load_optimizer else ["param"]
        for state in states:
            for spec in runtime.tensor_set.specs:
                fqn = _fqn(state, spec.name)
                md = saved_md.get(fqn)
                if not isinstance(md, TensorStorageMetadata):
                    raise CheckpointError(f"{path}: no tensor {fqn!r}: a checkpoint of another model or a partial one")
                dtype = str(md.properties.dtype).replace("torch.", "")
                if list(md.size) != list(spec.shape) or dtype != spec.dtype:
                    raise CheckpointError(f"{path}: tensor {fqn!r} is {list(md.size)} {dtype}, the model's is "
                                          f"{list(spec.shape)} {spec.dtype}: a checkpoint of another model")
        extra = sorted({k.split("/", 1)[1] if k.startswith("model/") else k.split("/", 2)[-1]
                        for k in saved_md if k.startswith(("model/", "optim/"))}
                       - {s.name for s in runtime.tensor_set.specs})
        if extra:
            raise CheckpointError(f"{path} holds tensors the model lacks: {extra[:5]}")
        masters = runtime.state_dict()["params"]
        boxes: Dict[str, List[Tuple[tuple, torch.Tensor]]] = {}
        specs = runtime.tensor_set.specs
        for state in states:
            local = [torch.empty_like(p) for p in masters]
            buffers = [t.reshape(-1) if runtime.zero else t for t in local]
            for t, lo, hi, view in local_views(runtime.tensor_set, runtime.home, runtime.home_placement, rank,
                                               buffers):
                boxes.setdefault(_fqn(state, specs[t].name), []).append((tuple(lo), view))
            if runtime.zero:  # ZeRO padding beyond the last tensor belongs to nobody
                local[0].view(-1).zero_()
            new_states[state] = local
        rng_key = f"rng/rank_{rank:05d}"
        byte_keys = [rng_key] if load_rng and meta["world"] == runtime.world and rng_key in saved_md and \
            isinstance(saved_md[rng_key], BytesStorageMetadata) else []
        planner = _BoxLoadPlanner(boxes, byte_keys)
    except CheckpointError as e:
        ok, message = False, str(e)
    except (OSError, KeyError, TypeError, ValueError) as e:
        ok, message = False, f"{path}: malformed checkpoint ({type(e).__name__}: {e})"
    _agree(ok, message, group)
    try:
        dcp.load({}, storage_reader=dcp.FileSystemReader(path), planner=planner, process_group=group)
        short = [f"{fqn} at {list(lo)}" for fqn, entries in planner.boxes.items() for lo, view in entries
                 if planner.received.get((fqn, lo), 0) != view.numel()]
        if short:
            raise CheckpointError(f"{path}: the saved chunks do not cover {short[:3]}: a partial checkpoint")
    except CheckpointError as e:
        ok, message = False, str(e)
    except (Exception, CheckpointException) as e:  # DCP's exception carries every rank's failure
        ok, message = False, f"{path}: DCP could not read it ({_reason(e)})"
    _agree(ok, message, group)

    return _commit(runtime, path, meta, new_states, planner.bytes.get(f"rng/rank_{rank:05d}"),
                   load_optimizer, reset_step)
