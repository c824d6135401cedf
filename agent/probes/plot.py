"""A PNG plot of a probe report, drawn with a tiny pure-Python rasterizer (zlib + struct).

Why not matplotlib: it is not a dependency, the plot is two panels of lines, and a
~150-line encoder keeps `laplace probe run --plot` working on any install. Top panel: mean
top-1 accuracy over probes vs log distance, one line per filler, the chance line dashed
and each filler's slowest-head half-life as a dotted vertical. Bottom panel: every head's
measured retention on the first filler (layer 0 darkest).
"""

from __future__ import annotations

import math
import struct
import zlib
from pathlib import Path
from typing import Any

Color = tuple[int, int, int]
PALETTE: list[Color] = [(31, 119, 180), (214, 39, 40), (44, 160, 44), (148, 103, 189), (255, 127, 14), (23, 190, 207)]
GREY: Color = (150, 150, 150)
BLACK: Color = (20, 20, 20)

# 3x5 glyphs, rows top to bottom, 3 bits each (4 = left pixel).
_FONT = {
    "0": "75557", "1": "26227", "2": "71747", "3": "71717", "4": "55711", "5": "74717", "6": "74757", "7": "71111",
    "8": "75757", "9": "75717", "a": "25755", "b": "65656", "c": "74447", "d": "65556", "e": "74647", "f": "74644",
    "g": "74557", "h": "55755", "i": "72227", "j": "11157", "k": "55655", "l": "44447", "m": "57755", "n": "65555",
    "o": "75557", "p": "75744", "q": "75711", "r": "65655", "s": "74717", "t": "72222", "u": "55557", "v": "55552",
    "w": "55775", "x": "55255", "y": "55222", "z": "71247", "%": "51245", "-": "00700", ".": "00002", "/": "11244",
    " ": "00000", "=": "07070", ":": "02020",
}


def encode_png(width: int, height: int, rgb: bytes | bytearray) -> bytes:
    """An 8-bit RGB PNG of `rgb` (rows top to bottom, 3 bytes a pixel)."""
    if len(rgb) != width * height * 3:
        raise ValueError("pixel buffer does not match the image size")

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    stride = width * 3
    raw = b"".join(b"\x00" + bytes(rgb[y * stride : (y + 1) * stride]) for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")


class Canvas:
    def __init__(self, width: int, height: int) -> None:
        self.w, self.h = width, height
        self.px = bytearray(b"\xff" * (width * height * 3))

    def dot(self, x: int, y: int, c: Color) -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            i = (y * self.w + x) * 3
            self.px[i : i + 3] = bytes(c)

    def line(self, x0: float, y0: float, x1: float, y1: float, c: Color, dash: int = 0, width: int = 1) -> None:
        n = int(max(abs(x1 - x0), abs(y1 - y0))) + 1
        for i in range(n + 1):
            if dash and (i // dash) % 2:
                continue
            t = i / n
            x, y = round(x0 + t * (x1 - x0)), round(y0 + t * (y1 - y0))
            for k in range(width):
                self.dot(x, y + k, c)

    def box(self, x: int, y: int, size: int, c: Color) -> None:
        for dy in range(-size, size + 1):
            for dx in range(-size, size + 1):
                self.dot(x + dx, y + dy, c)

    def text(self, x: int, y: int, s: str, c: Color = BLACK, scale: int = 2) -> None:
        for ch in s.lower():
            rows = _FONT.get(ch, _FONT[" "])
            for r, bits in enumerate(rows):
                for b in range(3):
                    if int(bits) >> (2 - b) & 1:
                        for sy in range(scale):
                            for sx in range(scale):
                                self.dot(x + b * scale + sx, y + r * scale + sy, c)
            x += 4 * scale

    def png(self) -> bytes:
        return encode_png(self.w, self.h, self.px)


def _dlabel(d: int) -> str:
    return str(d) if d < 1024 else f"{d // 1024}k"


def plot_report(report: dict[str, Any], path: str | Path, width: int = 900, panel: int = 300) -> Path:
    """Write the two-panel PNG for `report` to `path`."""
    ds: list[int] = report["suite"]["distances"]
    fillers: list[str] = report["suite"]["fillers"]
    pos = [d for d in ds if d > 0] or [64]
    lo, hi = math.log2(pos[0]) - 1, math.log2(pos[-1])
    left, right, top = 60, width - 20, 30
    canvas = Canvas(width, 2 * panel + 120)

    def xof(d: float) -> float:
        v = math.log2(d) if d > 0 else lo
        return left + (v - lo) / max(hi - lo, 1e-9) * (right - left)

    def axes(y0: int, title: str, ylabels: list[tuple[float, str]]) -> None:
        canvas.text(left, y0 - 22, title)
        canvas.line(left, y0, left, y0 + panel, BLACK)
        canvas.line(left, y0 + panel, right, y0 + panel, BLACK)
        for frac, label in ylabels:
            y = y0 + panel * (1 - frac)
            canvas.line(left - 4, y, right, y, (230, 230, 230))
            canvas.text(4, int(y) - 5, label)
        for d in ds:
            x = xof(d)
            canvas.line(x, y0 + panel, x, y0 + panel + 4, BLACK)
            canvas.text(int(x) - 8, y0 + panel + 8, _dlabel(d))

    # Top: mean top-1 over probes per filler.
    y0 = top
    axes(y0, "top-1 vs distance", [(0.0, "0%"), (0.5, "50%"), (1.0, "100%")])
    cells = report["cells"]
    chance = cells[0]["chance"] if cells else 0.05
    canvas.line(left, y0 + panel * (1 - chance), right, y0 + panel * (1 - chance), GREY, dash=6)
    ledger = report["state_metrics"].get("ledger") or {}
    for i, f in enumerate(fillers):
        color = PALETTE[i % len(PALETTE)]
        pts = []
        for d in ds:
            vals = [c["top1"] for c in cells if c["filler"] == f and c["distance"] == d]
            if vals:
                pts.append((xof(d), y0 + panel * (1 - sum(vals) / len(vals))))
        for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
            canvas.line(xa, ya, xb, yb, color, width=2)
        for x, y in pts:
            canvas.box(int(x), int(y), 2, color)
        hl = (ledger.get(f) or {}).get("predicted_d50")
        if hl and math.isfinite(hl) and pos[0] / 2 <= hl <= pos[-1]:
            canvas.line(xof(hl), y0, xof(hl), y0 + panel, color, dash=3)
        canvas.box(right - 150, y0 + 8 + 14 * i, 4, color)
        canvas.text(right - 140, y0 + 3 + 14 * i, f)
    # Bottom: per-head retention on the first filler with a ledger.
    y1 = top + panel + 60
    axes(y1, "head retention", [(0.0, "0"), (0.5, "0.5"), (1.0, "1")])
    first = next((ledger[f] for f in fillers if f in ledger), None)
    if first:
        rows = first["retention"]
        keys = [d for d in ds if str(d) in rows]
        n_layers = len(rows[str(keys[0])]) if keys else 0
        for li in range(n_layers):
            shade = int(200 * li / max(1, n_layers - 1))
            color = (shade, shade, 255 - shade // 2)
            for hi_ in range(len(rows[str(keys[0])][li])):
                pts = [(xof(d), y1 + panel * (1 - rows[str(d)][li][hi_])) for d in keys]
                for (xa, ya), (xb, yb) in zip(pts, pts[1:]):
                    canvas.line(xa, ya, xb, yb, color)
    out = Path(path)
    out.write_bytes(canvas.png())
    return out
