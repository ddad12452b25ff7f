"""Reads and writes the safetensors format (https://github.com/huggingface/safetensors,
"Format" in its README), the files Hugging Face models are shipped in:

    u64 little-endian   N, the header's length in bytes
    N bytes             a UTF-8 JSON object: per tensor name
                        {"dtype": "F32" | "BF16" | ..., "shape": [...], "data_offsets": [begin, end]},
                        and optionally "__metadata__": {str: str}; may end in spaces (padding)
    the rest            the byte buffer: each tensor's elements, little-endian, row-major, at
                        [begin, end) relative to the buffer's start

The buffer must be indexed entirely: the tensors' ranges, sorted, cover it with no hole and
no overlap, and each range holds exactly ``numel * itemsize`` bytes. A header that lies
about any of that is refused with a ValueError naming the file and the tensor.
"""

import json
import os
import struct
from typing import Dict, Optional, Tuple

import numpy as np
import torch

__all__ = ["DTYPES", "load_file", "read_header", "save_file"]

# safetensors dtype name -> torch dtype
DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}
_NAMES = {v: k for k, v in DTYPES.items()}
_MAX_HEADER = 100 * 2**20  # the reference implementation's limit


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty(0, dtype=dtype).element_size()


def read_header(path: str) -> Tuple[Dict[str, dict], Dict[str, str], int]:
    """``(tensors, metadata, buffer_start)`` of a safetensors file, every entry checked:
    ``tensors`` maps each name to ``{"dtype": torch dtype, "shape": [...], "data_offsets":
    [begin, end]}``. ValueError naming the file (and the tensor) when it is missing,
    truncated, or its header lies."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"safetensors path must be a path, got {type(path).__name__}")
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            prefix = f.read(8)
            if len(prefix) < 8:
                raise ValueError(f"{path}: {size} bytes, too short for the 8-byte header length of a safetensors file")
            (n,) = struct.unpack("<Q", prefix)
            if n > min(size - 8, _MAX_HEADER):
                raise ValueError(f"{path}: header length {n} exceeds the {size - 8} bytes after it"
                                 + (f" (or the {_MAX_HEADER}-byte limit)" if n > _MAX_HEADER else ""))
            raw = f.read(n)
    except OSError as e:
        raise ValueError(f"cannot read safetensors file {path!r}: {e.strerror}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: the header is not UTF-8 JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{path}: the header must be a JSON object, got {type(header).__name__}")
    buffer_start = 8 + n
    buffer_size = size - buffer_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                 for k, v in metadata.items()):
        raise ValueError(f"{path}: __metadata__ must map strings to strings, got {metadata!r}")
    tensors: Dict[str, dict] = {}
    for name, entry in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise ValueError(f"{where}: expected dtype, shape and data_offsets, got {entry!r}")
        if entry["dtype"] not in DTYPES:
            raise ValueError(f"{where}: dtype {entry['dtype']!r} is not one of {', '.join(DTYPES)}")
        shape, offsets = entry["shape"], entry["data_offsets"]
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                  for d in shape):
            raise ValueError(f"{where}: shape {shape!r} must be a list of non-negative ints")
        if not (isinstance(offsets, list) and len(offsets) == 2
                and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
            raise ValueError(f"{where}: data_offsets {offsets!r} must be [begin, end]")
        begin, end = offsets
        if not 0 <= begin <= end <= buffer_size:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}] outside the {buffer_size}-byte buffer")
        dtype = DTYPES[entry["dtype"]]
        need = int(np.prod(shape, dtype=np.int64)) * _itemsize(dtype)
        if end - begin != need:
            raise ValueError(f"{where}: data_offsets [{begin}, {end}] hold {end - begin} bytes, its shape {shape} "
                             f"of {entry['dtype']} needs {need}")
        tensors[name] = {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}
    position, last = 0, None
    for name, entry in sorted(tensors.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, end = entry["data_offsets"]
        if begin < position:
            raise ValueError(f"{path}: tensor {name!r} at [{begin}, {end}] overlaps tensor {last!r} "
                             f"(ending at {position})")
        if begin > position:
            raise ValueError(f"{path}: a hole of {begin - position} bytes before tensor {name!r} at [{begin}, {end}]")
        position, last = end, name
    if position != buffer_size:
        raise ValueError(f"{path}: the tensors cover {position} of the {buffer_size}-byte buffer; "
                         f"{buffer_size - position} bytes at the end belong to no tensor")
    return tensors, dict(metadata), buffer_start


def load_file(path: str) -> Tuple[Dict[str, torch.Tensor], Dict[str, str]]:
    """``(name -> tensor, metadata)`` of a safetensors file, each tensor read into its own
    memory. ValueError as ``read_header``."""
    tensors, metadata, start = read_header(path)
    out: Dict[str, torch.Tensor] = {}
    with open(path, "rb") as f:
        for name, entry in tensors.items():
            begin, end = entry["data_offsets"]
            raw = np.empty(end - begin, dtype=np.uint8)
            f.seek(start + begin)
            if f.readinto(memoryview(raw)) != end - begin:
                raise ValueError(f"{path}: tensor {name!r} was cut short while reading (the file changed)")
            # Bytes first, then a view as the dtype: torch has every dtype, numpy lacks bfloat16.
            t = torch.from_numpy(raw)
            out[name] = t.view(entry["dtype"]).reshape(entry["shape"]) if t.numel() else \
                torch.zeros(entry["shape"], dtype=entry["dtype"])
    return out, metadata


def save_file(tensors: Dict[str, torch.Tensor], path: str, metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes ``tensors`` (name -> CPU tensor of a dtype of ``DTYPES``) to ``path`` in the
    safetensors format, in the given order, the header padded with spaces to a multiple of 8
    bytes. Written to a temporary file, then renamed."""
    if not isinstance(tensors, dict) or not all(isinstance(k, str) for k in tensors):
        raise ValueError("tensors must be a dict of str -> torch.Tensor")
    if "__metadata__" in tensors:
        raise ValueError("'__metadata__' is reserved in safetensors headers; name the tensor otherwise")
    if metadata is not None and not (isinstance(metadata, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in metadata.items())):
        raise ValueError(f"metadata must map strings to strings, got {metadata!r}")
    header: Dict[str, object] = {}
    if metadata:
        header["__metadata__"] = dict(metadata)
    blobs = []
    offset = 0
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.dtype not in _NAMES:
            raise ValueError(f"tensor {name!r} must be a torch.Tensor of "
                             f"{', '.join(str(d) for d in DTYPES.values())}, got "
                             f"{t.dtype if isinstance(t, torch.Tensor) else type(t).__name__}")
        data = t.detach().cpu().contiguous()
        # Bytes through a same-width integer view: numpy has no bfloat16.
        raw = data.view(torch.uint8) if data.element_size() == 1 else \
            data.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[data.element_size()])
        blob = raw.numpy().astype(raw.numpy().dtype.newbyteorder("<"), copy=False).tobytes() if data.numel() else b""
        header[name] = {"dtype": _NAMES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(blob)]}
        blobs.append(blob)
        offset += len(blob)
    raw_header = json.dumps(header, separators=(",", ":")).encode("utf-8")
    raw_header += b" " * (-len(raw_header) % 8)
    tmp = f"{os.fspath(path)}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(raw_header)))
        f.write(raw_header)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)
