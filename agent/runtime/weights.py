"""Reading `model.safetensors` tensor by tensor into the form the model will run in (fp32,
bf16 or int8), so the peak memory of a load is the final model plus one block.

A tensor kept in the file's own dtype is memory-mapped (`MappedFile`): no copy is made,
loading costs no reading, pages are read from the page cache (shared by every process
running the model) as the first forward touches them, and `MADV_WILLNEED` starts the
kernel's read-ahead at once, so a cold start overlaps the disk with the rest of the
start-up. The mapping is private and copy-on-write: a parameter written in place (training)
gets its own pages and never changes the file.

A tensor converted on the way (bf16 from an fp32 file, int8 rows) is read with plain file
reads in blocks of rows instead: pages of a mapping a process has touched count in its
resident set until it unmaps them, so mapping a 5.6 GB file to convert it would put 5.6 GB
in the peak whatever is kept. The header is parsed here (the safetensors format is an
8-byte length, a JSON header and the raw little-endian bytes); nothing is unpickled.

While reading, the weights' digest is computed exactly as `checkpoint.weights_digest`
would compute it over the model loaded in `digest_dtype` (tensors in name order, each as
`name:shape:dtype` then its bytes), so a quantized model's fingerprint still derives from
its fp32 weights without ever holding them. `DigestCache` (torch-free, in `files`) keeps it
beside the file, keyed by the file's identity and change time, so a load whose tensors are
all mapped reads none of them. `PreparedCache` does the same for an int8 load's rows and scales: kept in a
safetensors file beside the weights (`.laplace-int8-rows-v1.safetensors`, about a quarter
of an fp32 file), mapped by the next load instead of read and quantized again.
"""

from __future__ import annotations

import hashlib
import json
import math
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Iterator

import torch
from torch import Tensor

from agent.runtime.files import DigestCache, file_identity

__all__ = ["BLOCK_BYTES", "Digest", "DigestCache", "MappedFile", "PreparedCache", "TensorInfo", "WeightsFormatError",
           "blocks", "read_header", "read_tensor"]  # DigestCache lives in `files` (torch-free)

_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "F64": torch.float64,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8}
BLOCK_BYTES = 8 << 20  # rows read at a time: about 8 MB (one buffer a load, beside the model)


class WeightsFormatError(ValueError):
    """The file is not a readable safetensors file."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute file offset of the first byte
    nbytes: int


def read_header(f: BinaryIO) -> dict[str, TensorInfo]:
    """name -> TensorInfo of every tensor in a safetensors file opened for binary reading."""
    head = f.read(8)
    if len(head) != 8:
        raise WeightsFormatError("file is shorter than a safetensors header")
    n = int.from_bytes(head, "little")
    try:
        header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WeightsFormatError(f"safetensors header is not valid JSON ({exc})") from None
    if not isinstance(header, dict):
        raise WeightsFormatError("safetensors header is not a JSON object")
    out = {}
    for name, spec in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = _DTYPES[spec["dtype"]]
            shape = tuple(int(d) for d in spec["shape"])
            a, b = (int(x) for x in spec["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise WeightsFormatError(f"safetensors entry {name!r} is malformed") from None
        size = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if b - a != size or a < 0:
            raise WeightsFormatError(f"safetensors entry {name!r} holds {b - a} bytes, not the {size} its shape needs")
        out[name] = TensorInfo(name, dtype, shape, 8 + n + a, size)
    end = max((i.start + i.nbytes for i in out.values()), default=0)
    have = os.fstat(f.fileno()).st_size
    if end > have:
        raise WeightsFormatError(f"file is truncated: its header needs {end} bytes, it has {have}")
    return out


def _readinto(f: BinaryIO, t: Tensor) -> None:
    """Fill contiguous CPU tensor `t` with the next t.nbytes bytes of `f`."""
    raw = t.view(-1).view(torch.uint8).numpy()
    got = f.readinto(memoryview(raw))
    if got != raw.nbytes:
        raise WeightsFormatError(f"file ends early ({got} of {raw.nbytes} bytes)")


def blocks(f: BinaryIO, info: TensorInfo, dtype: torch.dtype, block_bytes: int | None = None, *,
           scratch: Tensor | None = None) -> Iterator[tuple[int, Tensor]]:
    """(first row, rows [r, D...] as `dtype`) over the tensor, about `block_bytes` (default
    BLOCK_BYTES) of the file read at a time. Each block is valid until the next is asked
    for: all are read into one buffer, `scratch` (uint8, at least a block's bytes: one a
    caller reuses for every tensor it reads) or one made for the call. (A fresh buffer per
    block, and per tensor, left freed holes in glibc's heap between the tensors kept,
    resident for the rest of the process.) A block of another dtype is converted (a copy);
    a caller that copies it anyway asks for the file's dtype and lets its copy convert."""
    block_bytes = BLOCK_BYTES if block_bytes is None else block_bytes
    rows = info.shape[0] if info.shape else 1
    row_shape = info.shape[1:] if info.shape else ()
    row_bytes = max(1, info.nbytes // max(rows, 1))
    step = max(1, min(rows, block_bytes // row_bytes))
    need = step * row_bytes
    buf = scratch[:need] if scratch is not None and scratch.numel() >= need else torch.empty(need, dtype=torch.uint8)
    f.seek(info.start)
    for r in range(0, rows, step):
        n = min(step, rows - r)
        raw = buf[: n * row_bytes].view(info.dtype).view(n, *row_shape)
        _readinto(f, raw)
        yield r, raw if raw.dtype == dtype else raw.to(dtype)


def read_tensor(f: BinaryIO, info: TensorInfo, dtype: torch.dtype, digest: "Digest | None" = None, *,
                column_major: bool = False, out: Tensor | None = None, scratch: Tensor | None = None) -> Tensor:
    """The whole tensor as `dtype`: read straight into it when the file holds that dtype,
    else a block at a time into `scratch` (see `blocks`), each block converted as it is
    copied in (no converted copy of a block is made). `column_major` (2-D only): the same
    values and shape, stored transposed (strides (1, rows)), filled block by block so no
    second copy is made. `out`: a contiguous tensor of that shape and dtype to fill (rows
    of a fused matrix) instead of a new one."""
    if out is not None:
        if tuple(out.shape) != info.shape or out.dtype != dtype or not out.is_contiguous() or column_major:
            raise ValueError(f"{info.name}: cannot read {info.shape} {dtype} into {tuple(out.shape)} {out.dtype}")
    elif column_major and len(info.shape) == 2:
        out = torch.empty(info.shape[::-1], dtype=dtype).t()
        if digest is not None:
            digest.begin(info.name, info.shape, dtype)
        for r, block in blocks(f, info, info.dtype, scratch=scratch):
            rows = out[r : r + block.shape[0]]
            rows.copy_(block)
            if digest is not None:
                digest.update(rows)
        return out
    out = torch.empty(info.shape, dtype=dtype) if out is None else out
    if info.dtype == dtype:
        f.seek(info.start)
        _readinto(f, out)
        if digest is not None:
            digest.tensor(info.name, out)
        return out
    flat = out.view(info.shape[0] if info.shape else 1, -1)
    for r, block in blocks(f, info, info.dtype, scratch=scratch):
        flat[r : r + block.shape[0]].copy_(block.reshape(block.shape[0], -1))
    if digest is not None:
        digest.tensor(info.name, out)
    return out


class Digest:
    """`checkpoint.weights_digest`, fed tensor by tensor (and block by block) in name order."""

    def __init__(self) -> None:
        self._h = hashlib.sha256()

    def begin(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self._h.update(f"{name}:{shape}:{dtype}".encode())

    def update(self, t: Tensor) -> None:
        if t.numel():
            self._h.update(t.contiguous().view(-1).view(torch.uint8).numpy())

    def tensor(self, name: str, t: Tensor) -> None:
        self.begin(name, tuple(t.shape), t.dtype)
        self.update(t)

    def hexdigest(self) -> str:
        return self._h.hexdigest()


class MappedFile:
    """A private, copy-on-write memory map of a safetensors file, and tensors that are views
    of it. Each tensor keeps the mapping alive; the mapping outlives this object."""

    def __init__(self, path: str | Path) -> None:
        with open(path, "rb") as f:
            self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        if hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_WILLNEED"):  # start reading ahead now
            self._mm.madvise(mmap.MADV_WILLNEED)

    @staticmethod
    def can_map(info: TensorInfo) -> bool:
        """Whether a tensor can be a view of the file: aligned to its element size and
        stored in this machine's byte order (safetensors is little-endian)."""
        size = torch.empty(0, dtype=info.dtype).element_size()
        return sys.byteorder == "little" and info.start % size == 0 and info.nbytes > 0

    def tensor(self, info: TensorInfo) -> Tensor:
        """The tensor `info` names, as a view of the mapping (no copy)."""
        n = info.nbytes // torch.empty(0, dtype=info.dtype).element_size()
        return torch.frombuffer(self._mm, dtype=info.dtype, count=n, offset=info.start).view(info.shape)

    def release(self, info: TensorInfo) -> None:
        """Give back the pages of a tensor that was copied out (the decode layout's head),
        so they stop counting in this process's resident set. Only whole pages inside the
        tensor are dropped; none was written, so a later read would fetch the file again."""
        if not (hasattr(self._mm, "madvise") and hasattr(mmap, "MADV_DONTNEED")):
            return
        page = mmap.PAGESIZE
        start = -(-info.start // page) * page
        end = (info.start + info.nbytes) // page * page
        if end > start:
            self._mm.madvise(mmap.MADV_DONTNEED, start, end - start)


_CODES = {v: k for k, v in _DTYPES.items()}
_ALIGN = 64  # every tensor of a prepared file starts at a multiple of this: the int8 kernel's aligned loads
_PAD = "__pad__."  # padding entries, so the file is valid safetensors (no holes) and each tensor aligned


class PreparedCache:
    """Tensors derived from a model's weights file (its int8 rows and scales), kept in one
    safetensors file beside it so the next load maps them instead of deriving them again.

    The file is valid only for the weights file it was made from (`file_identity`, as
    `DigestCache`) and for the derivation `scheme` (a name the deriving code changes when
    its arithmetic changes); either differing, or any tensor missing, extra or of another
    shape or dtype, is a miss and the caller derives the tensors from the weights again.
    Every tensor starts on a 64-byte boundary, so a view of the mapping is as aligned as a
    fresh allocation. A directory that cannot be written simply has no cache."""

    def __init__(self, file: str | Path, *, scheme: str, enabled: bool = True) -> None:
        self.file = Path(file)
        self.scheme = scheme
        self.path = self.file.parent / f".laplace-{scheme}.safetensors"
        self.enabled = enabled
        self._key = file_identity(self.file)

    def load(self, expected: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> tuple[dict[str, Tensor], MappedFile, dict[str, TensorInfo]] | None:
        """(name -> a view of the mapped file, the mapping, name -> its TensorInfo) when
        the cache holds exactly `expected` (name -> (shape, dtype)) for this weights file;
        else None."""
        if not self.enabled:
            return None
        try:
            with open(self.path, "rb") as f:
                head = f.read(8)
                meta = json.loads(f.read(int.from_bytes(head, "little"))).get("__metadata__") if len(head) == 8 else None
                if not isinstance(meta, dict) or meta.get("source") != self._key or meta.get("scheme") != self.scheme:
                    return None
                f.seek(0)
                infos = {n: i for n, i in read_header(f).items() if not n.startswith(_PAD)}
            if {n: (i.shape, i.dtype) for n, i in infos.items()} != {n: (tuple(s), d) for n, (s, d) in expected.items()}:
                return None
            if not all(MappedFile.can_map(i) and i.start % _ALIGN == 0 for i in infos.values()):
                return None
            mapped = MappedFile(self.path)
        except (OSError, ValueError, AttributeError, MemoryError):  # absent, unreadable or malformed: a miss
            return None
        return {n: mapped.tensor(i) for n, i in infos.items()}, mapped, infos

    def save(self, tensors: dict[str, Tensor]) -> None:
        """Write `tensors` (contiguous CPU, non-empty), replacing any older cache atomically."""
        if not self.enabled:
            return
        header: dict[str, object] = {"__metadata__": {"source": self._key, "scheme": self.scheme}}
        order: list[Tensor | int] = []  # a tensor, or a count of padding bytes
        offset = 0
        for name in sorted(tensors):
            t = tensors[name]
            pad = -offset % _ALIGN
            if pad:
                header[f"{_PAD}{len(header)}"] = {"dtype": "U8", "shape": [pad], "data_offsets": [offset, offset + pad]}
                order.append(pad)
                offset += pad
            n = t.numel() * t.element_size()
            header[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + n]}
            order.append(t)
            offset += n
        raw = json.dumps(header).encode()
        raw += b" " * (-(8 + len(raw)) % _ALIGN)  # the data then starts aligned; safetensors allows trailing spaces
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(len(raw).to_bytes(8, "little"))
                f.write(raw)
                for item in order:
                    if isinstance(item, int):
                        f.write(bytes(item))
                    else:
                        f.write(memoryview(item.contiguous().view(-1).view(torch.uint8).numpy()))
            tmp.replace(self.path)
        except OSError:  # a read-only directory or a full disk: no cache, the next load derives them again
            tmp.unlink(missing_ok=True)
