"""Checkpoint tensors read one at a time, straight into their destination.

A ``WeightSource`` is a read-only mapping from HF tensor names to tensors that knows
every name, shape and dtype up front (from file headers) and reads a tensor's data
only when asked, into a tensor the caller owns (a parameter, or rows of a fused
one), casting on the way. Loading a model from it never holds a second copy.

Safetensors files are read with plain ``readinto`` rather than ``safe_open``:
safe_open memory-maps the file, and every page it touches stays resident in this
process (counted in its RSS) until the handle closes, so a float32 checkpoint
loaded into a float32 model would peak at about twice the model.
"""
from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Callable, Iterable, Optional

import torch

# Casts go through a bounded buffer, so a 1 GB embedding never needs a 1 GB temporary.
CHUNK_BYTES = 4 << 20

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U8": torch.uint8, "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
_DTYPE_CODES = {v: k for k, v in SAFETENSORS_DTYPES.items()}


class WeightSource(Mapping):
    """Name -> tensor, read lazily; ``read_into`` fills a caller-owned tensor.
    Subclasses keep one entry per tensor in ``entries``."""

    entries: dict

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def keep(self, names: set[str]) -> None:
        """Forget every tensor not in ``names``."""
        for name in [n for n in self.entries if n not in names]:
            del self.entries[name]

    def shape(self, name: str) -> tuple[int, ...]:
        raise NotImplementedError

    def dtype(self, name: str) -> torch.dtype:
        raise NotImplementedError

    def read_into(self, name: str, out: torch.Tensor) -> None:
        """Copy tensor ``name`` into ``out`` (same shape; any dtype and device)."""
        raise NotImplementedError

    def __getitem__(self, name: str) -> torch.Tensor:
        out = torch.empty(self.shape(name), dtype=self.dtype(name))
        self.read_into(name, out)
        return out


class TensorDictSource(WeightSource):
    """Tensors already in memory (tests, small models)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.entries = dict(tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.entries[name].shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.entries[name].dtype

    def read_into(self, name: str, out: torch.Tensor) -> None:
        out.copy_(self.entries[name])


@dataclass(frozen=True)
class _Entry:
    path: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute file offset of the data
    nbytes: int


def read_safetensors_header(path: str) -> dict[str, _Entry]:
    """Name -> where its data lies; ValueError for a malformed file."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError("file too short for a safetensors header")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise ValueError("header length beyond the end of the file")
        header = json.loads(f.read(n))
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info["dtype"])
        begin, end = info["data_offsets"]
        shape = tuple(int(d) for d in info["shape"])
        if dtype is None or end - begin != math.prod(shape) * dtype.itemsize or 8 + n + end > size:
            raise ValueError(f"bad header entry for {name}")
        entries[name] = _Entry(path, dtype, shape, 8 + n + begin, end - begin)
    return entries


def _fill(f, buf: torch.Tensor) -> None:
    view = memoryview(buf.reshape(-1).view(torch.uint8).numpy())
    while view:
        got = f.readinto(view)
        if not got:
            raise ValueError("file ended inside a tensor")
        view = view[got:]


class SafetensorsSource(WeightSource):
    """The tensors of one or more safetensors files, read with ``readinto``."""

    def __init__(self, paths: Iterable[str], skip: Optional[Callable[[str], bool]] = None) -> None:
        self.entries: dict[str, _Entry] = {}
        for path in paths:
            for name, entry in read_safetensors_header(path).items():
                if skip is None or not skip(name):
                    self.entries[name] = entry

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entries[name].shape

    def dtype(self, name: str) -> torch.dtype:
        return self.entries[name].dtype

    def read_into(self, name: str, out: torch.Tensor) -> None:
        e = self.entries[name]
        if tuple(out.shape) != e.shape:
            raise ValueError(f"{name}: shape {e.shape} does not fit {tuple(out.shape)}")
        with open(e.path, "rb", buffering=0) as f:
            f.seek(e.start)
            if out.dtype == e.dtype and out.device.type == "cpu" and out.is_contiguous() and out.numel():
                _fill(f, out)  # straight into the parameter
                return
            if not out.is_contiguous():  # not a row range of a parameter: read, then one copy
                tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
                self.read_into(name, tmp)
                out.copy_(tmp)
                return
            flat, total = out.view(-1), math.prod(e.shape)
            step = max(1, CHUNK_BYTES // e.dtype.itemsize)
            for lo in range(0, total, step):
                buf = torch.empty(min(step, total - lo), dtype=e.dtype)
                _fill(f, buf)
                flat[lo:lo + buf.numel()].copy_(buf)


def save_safetensors(path: str, source: WeightSource) -> None:
    """Write ``source`` as one safetensors file, one tensor in memory at a time."""
    header, offset = {}, 0
    for name in source.keys():
        nbytes = math.prod(source.shape(name)) * source.dtype(name).itemsize
        header[name] = {"dtype": _DTYPE_CODES[source.dtype(name)], "shape": list(source.shape(name)),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # data starts 8-byte aligned, as safetensors writes it
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in source.keys():
            tensor = source[name].contiguous()
            if tensor.numel():
                f.write(tensor.reshape(-1).view(torch.uint8).numpy())
