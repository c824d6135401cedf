"""The pure-Python PNG writer: a valid file whose pixels decode back exactly."""

from __future__ import annotations

import struct
import zlib

import pytest

from agent.probes.plot import Canvas, encode_png, plot_report


def _decode(png: bytes) -> tuple[int, int, bytes]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, size = 8, b"", None
    while pos < len(png):
        (n,) = struct.unpack(">I", png[pos : pos + 4])
        kind, data = png[pos + 4 : pos + 8], png[pos + 8 : pos + 8 + n]
        (crc,) = struct.unpack(">I", png[pos + 8 + n : pos + 12 + n])
        assert crc == zlib.crc32(kind + data) & 0xFFFFFFFF
        if kind == b"IHDR":
            size = struct.unpack(">II", data[:8])
            assert data[8:10] == b"\x08\x02"  # 8-bit RGB
        elif kind == b"IDAT":
            idat += data
        pos += 12 + n
    w, h = size
    raw = zlib.decompress(idat)
    rows = [raw[y * (3 * w + 1) : (y + 1) * (3 * w + 1)] for y in range(h)]
    assert all(r[0] == 0 for r in rows)  # filter type none
    return w, h, b"".join(r[1:] for r in rows)


def test_png_round_trips_pixels():
    c = Canvas(7, 5)
    c.line(0, 0, 6, 4, (255, 0, 0))
    w, h, px = _decode(c.png())
    assert (w, h) == (7, 5) and px == bytes(c.px)
    assert px[0:3] == b"\xff\x00\x00" and px[-3:] == b"\xff\x00\x00"
    with pytest.raises(ValueError):
        encode_png(2, 2, b"\x00" * 5)


def test_plot_report_draws_lines(tmp_path):
    report = {
        "suite": {"distances": [0, 64, 128], "fillers": ["noise"]},
        "cells": [{"filler": "noise", "distance": d, "top1": v, "chance": 0.05} for d, v in [(0, 1.0), (64, 0.5), (128, 0.1)]],
        "state_metrics": {"ledger": {"noise": {"predicted_d50": 100.0, "retention": {
            "0": [[1.0, 1.0]], "64": [[0.5, 0.9]], "128": [[0.25, 0.8]]}}}},
    }
    path = plot_report(report, tmp_path / "p.png")
    w, h, px = _decode(path.read_bytes())
    blue = bytes((31, 119, 180))
    assert sum(px[i : i + 3] == blue for i in range(0, len(px), 3)) > 100
