"""Read character vectors out of an installed R package's lazy-load data (Rdata.rdx / .rdb).

R keeps a package's `data/` objects as one `.rdb` file of compressed serialized objects and a
`.rdx` index (itself a gzip-serialized list naming each object's offset and length). This is
the small subset of R's XDR serialization (format 2 and 3) needed to read that index and
character vectors: enough for janeaustenr, without R installed.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import struct
import zlib
from typing import Any

_SPECIAL = {254: None, 253: "<globalenv>", 252: "<unbound>", 251: "<missing>", 250: "<basenamespace>",
            242: "<emptyenv>", 241: "<baseenv>"}


class _Reader:
    def __init__(self, data: bytes) -> None:
        if data[:2] != b"X\n":
            raise ValueError("not an XDR R serialization")
        self.d, self.i = data, 2
        self.refs: list[Any] = []
        version = self.int()
        self.int(), self.int()  # writer and minimal reader R versions
        if version == 3:
            n = self.int()  # the native encoding's name follows
            self.i += n

    def int(self) -> int:
        (v,) = struct.unpack_from(">i", self.d, self.i)
        self.i += 4
        return v

    def length(self) -> int:
        n = self.int()
        if n == -1:
            hi, lo = self.int(), self.int()
            n = (hi << 32) + (lo & 0xFFFFFFFF)
        return n

    def item(self) -> Any:
        flags = self.int()
        typ, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if typ in _SPECIAL:
            return _SPECIAL[typ]
        if typ == 255:  # REFSXP
            idx = flags >> 8 or self.int()
            return self.refs[idx - 1]
        if typ in (247, 248, 249):  # PERSISTSXP, PACKAGESXP, NAMESPACESXP: a string vector
            self.int()
            val = [self.item() for _ in range(self.int())]
            self.refs.append(val)
            return val
        if typ == 1:  # SYMSXP
            val = ("sym", self.item())
            self.refs.append(val)
            return val
        if typ == 4:  # ENVSXP
            env: dict[str, Any] = {}
            self.refs.append(env)
            self.int()
            env.update(enclos=self.item(), frame=self.item(), hashtab=self.item(), attrib=self.item())
            return env
        if typ in (2, 3, 5, 6, 17):  # pairlist-like: attr?, tag?, car, cdr
            attr = self.item() if has_attr else None
            tag = self.item() if has_tag else None
            node = {"tag": tag, "car": self.item(), "cdr": self.item(), "attr": attr}
            return node
        if typ == 9:  # CHARSXP
            n = self.int()
            if n == -1:
                return None
            s = self.d[self.i:self.i + n].decode("utf-8", "replace")
            self.i += n
            return s
        if typ in (10, 13):  # LGLSXP, INTSXP
            n = self.length()
            val: Any = RVector(struct.unpack_from(f">{n}i", self.d, self.i))
            self.i += 4 * n
        elif typ == 14:  # REALSXP
            n = self.length()
            val = RVector(struct.unpack_from(f">{n}d", self.d, self.i))
            self.i += 8 * n
        elif typ in (16, 19, 20):  # STRSXP, VECSXP, EXPRSXP
            val = RVector(self.item() for _ in range(self.length()))
        elif typ == 24:  # RAWSXP
            n = self.length()
            val = RVector(self.d[self.i:self.i + n])
            self.i += n
        else:
            raise ValueError(f"R serialization type {typ} is not supported")
        if has_attr:
            node = self.item()
            while isinstance(node, dict):
                tag = node["tag"]
                val.attrs[tag[1] if isinstance(tag, tuple) else str(tag)] = node["car"]
                node = node["cdr"]
        return val


class RVector(list):
    """An R vector: its values, and its attributes (names, class, ...) in `attrs`."""

    def __init__(self, values: Any = ()) -> None:
        super().__init__(values)
        self.attrs: dict[str, Any] = {}


def unserialize(data: bytes) -> Any:
    return _Reader(data).item()


def _decompress(blob: bytes) -> bytes:
    """One .rdb entry: a 4-byte length, then zlib data, or a type byte and bzip2 / xz data."""
    kind = blob[4:5]
    if kind == b"2":
        return bz2.decompress(blob[5:])
    if kind == b"X":
        return lzma.decompress(blob[5:])
    if kind == b"0":
        return blob[5:]
    return zlib.decompress(blob[4:])


def lazyload_objects(rdx: bytes, rdb: bytes) -> dict[str, Any]:
    """Every object of a lazy-load database, by name."""
    index = unserialize(gzip.decompress(rdx))  # list(variables=, references=, compressed=)
    variables = index[0]
    out = {}
    for name, (offset, length) in zip(variables.attrs["names"], variables):
        blob = rdb[int(offset):int(offset) + int(length)]
        out[name] = unserialize(_decompress(blob))
    return out
