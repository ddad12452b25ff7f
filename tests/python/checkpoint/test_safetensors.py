"""The safetensors module: bitwise round trips of every dtype, the bytes it writes checked
against the format's specification, files of an independent writer read back, and every
header that lies refused naming the file and the tensor."""

import json
import struct

import numpy as np
import pytest
import torch

from hotswitch import safetensors as st


def _tensors():
    g = torch.Generator().manual_seed(0)
    bits = torch.randint(-2**15, 2**15, (5, 3), generator=g, dtype=torch.int16)
    return {
        "w.bf16": bits.view(torch.bfloat16),  # every bit pattern, NaN payloads included
        "w.f16": torch.randn(4, 2, generator=g).half(),
        "w.f32": torch.randn(3, 1, 2, generator=g),
        "w.f64": torch.randn(2, generator=g, dtype=torch.float64),
        "ids": torch.arange(-3, 4),
        "i32": torch.tensor([[1, -2]], dtype=torch.int32),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 7),
    }


def _bitwise_equal(a, b):
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    width = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
    return torch.equal(a.contiguous().view(width), b.contiguous().view(width)) if a.numel() else True


def test_round_trip_is_bitwise_and_the_bytes_follow_the_spec(tmp_path):
    tensors = _tensors()
    path = str(tmp_path / "m.safetensors")
    st.save_file(tensors, path, metadata={"format": "pt"})
    loaded, meta = st.load_file(path)
    assert meta == {"format": "pt"} and list(loaded) == list(tensors)
    for k in tensors:
        assert _bitwise_equal(loaded[k], tensors[k]), k
    # The specification, read here with struct and json alone.
    raw = open(path, "rb").read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0 and raw[8:8 + n].rstrip(b" ") == raw[8:8 + n].rstrip()
    header = json.loads(raw[8:8 + n])
    assert header.pop("__metadata__") == {"format": "pt"}
    buffer = raw[8 + n:]
    names = {"BF16": "<i2", "F16": "<f2", "F32": "<f4", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I8": "i1",
             "U8": "u1", "BOOL": "?"}
    for name, entry in header.items():
        begin, end = entry["data_offsets"]
        t = tensors[name]
        assert entry["shape"] == list(t.shape)
        expect = t.view(torch.int16).numpy() if t.dtype == torch.bfloat16 else t.numpy()
        assert np.frombuffer(buffer[begin:end], dtype=names[entry["dtype"]]).tobytes() == \
            expect.astype(expect.dtype.newbyteorder("<")).tobytes(), name
    ends = sorted(tuple(e["data_offsets"]) for e in header.values())
    assert ends[0][0] == 0 and ends[-1][1] == len(buffer)


def _write(path, header, buffer, pad=0):
    raw = json.dumps(header).encode() + b" " * pad
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + buffer)
    return str(path)


def test_reads_an_independent_writers_file(tmp_path):
    a = np.arange(6, dtype="<f4").reshape(2, 3)
    b = np.array([7, 8], dtype="<i8")
    # Header entries out of buffer order, unpadded, with metadata.
    path = _write(tmp_path / "x.safetensors", {
        "b": {"dtype": "I64", "shape": [2], "data_offsets": [24, 40]},
        "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
        "__metadata__": {"source": "test"}}, a.tobytes() + b.tobytes())
    loaded, meta = st.load_file(path)
    assert meta == {"source": "test"}
    assert torch.equal(loaded["a"], torch.from_numpy(a)) and torch.equal(loaded["b"], torch.from_numpy(b))


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}}


@pytest.mark.parametrize("change,buffer,needle", [
    ({"b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, 12, "tensor 'b' at [4, 8] overlaps tensor 'a'"),
    ({"b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 16]}}, 16,
     "tensor 'b': data_offsets [8, 16] hold 8 bytes, its shape [1] of F32 needs 4"),
    ({"b": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}, 12, "outside the 12-byte buffer"),
    ({"b": {"dtype": "F32", "shape": [1], "data_offsets": [12, 16]}}, 16, "a hole of 4 bytes before tensor 'b'"),
    ({}, 20, "8 bytes at the end belong to no tensor"),
    ({"b": {"dtype": "F32", "shape": [1], "data_offsets": [9, 8]}}, 12, "tensor 'b': data_offsets [9, 8] outside"),
    ({"b": {"dtype": "U16", "shape": [2], "data_offsets": [8, 12]}}, 12, "tensor 'b': dtype 'U16' is not one of"),
    ({"b": {"dtype": "F32", "shape": [-1], "data_offsets": [8, 12]}}, 12, "shape [-1] must be a list"),
    ({"b": {"dtype": "F32", "shape": [1]}}, 12, "tensor 'b': expected dtype, shape and data_offsets"),
    ({"__metadata__": {"k": 1}}, 12, "__metadata__ must map strings to strings"),
])
def test_headers_that_lie_are_refused_naming_the_file_and_tensor(tmp_path, change, buffer, needle):
    path = _write(tmp_path / "bad.safetensors", {**GOOD, **change}, b"\x00" * buffer)
    with pytest.raises(ValueError) as e:
        st.load_file(path)
    assert needle in str(e.value) and path in str(e.value), str(e.value)


def test_broken_files_are_refused(tmp_path):
    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x01\x00")
    with pytest.raises(ValueError, match="too short for the 8-byte header length"):
        st.load_file(str(short))
    long = tmp_path / "long.safetensors"
    long.write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(ValueError, match="header length 1000 exceeds the 2 bytes after it"):
        st.load_file(str(long))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(struct.pack("<Q", 4) + b"{no]")
    with pytest.raises(ValueError, match="the header is not UTF-8 JSON"):
        st.load_file(str(garbage))
    listed = tmp_path / "list.safetensors"
    listed.write_bytes(struct.pack("<Q", 2) + b"[]")
    with pytest.raises(ValueError, match="must be a JSON object"):
        st.load_file(str(listed))
    with pytest.raises(ValueError, match="cannot read safetensors file"):
        st.load_file(str(tmp_path / "missing.safetensors"))


def test_save_refuses_what_the_format_cannot_hold(tmp_path):
    with pytest.raises(ValueError, match="'__metadata__' is reserved"):
        st.save_file({"__metadata__": torch.zeros(1)}, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="tensor 'c' must be a torch.Tensor of"):
        st.save_file({"c": torch.zeros(1, dtype=torch.complex64)}, str(tmp_path / "a"))
    with pytest.raises(ValueError, match="metadata must map strings to strings"):
        st.save_file({"a": torch.zeros(1)}, str(tmp_path / "a"), metadata={"n": 1})
