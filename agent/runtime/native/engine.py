"""A batch-1 runtime without torch: a window-mixer model's step and prefill from its files,
with numpy for a prefill's matmuls and `decode.c` for everything else (issue 35).

`import torch` alone takes ~1.7 s and ~220 MB of resident memory here: more than the int8
default model's weights (135 MB), and more than llama.cpp's whole process on the same model.
This engine runs the step of `native/decode.py` (the same C kernels for the window mixer,
the norms and the GLU) on weights mapped from the model directory, so a process that only
decodes never imports torch:

- int8: the rows and scales of the directory's prepared cache (`.laplace-int8-rows-v1`,
  written by the first int8 load; valid only for the weights file it was made from), read by
  `laplace_matmul_i8` (with AVX-512 VNNI: activation rows rounded to int16, int32 sums; else
  fp32 sums) for decode and, with VNNI, prefill rows; without VNNI a prefill widens them to
  fp32 a matrix at a time for numpy's GEMM. `quant.Int8Linear` rounds activations and outputs
  to bf16 instead: the two agree to ~2^-8, and the torch step stays the reference;
- fp32: the weights file itself, mapped; every matmul is numpy's.

The state is the torch state's tensors under the same names and shapes (`config.state_spec`)
as numpy arrays, plus the count of tokens read. A memory of evicted tokens (`memory.py`) runs
in the window kernel (`laplace_window_memory`) with the "novelty" policy. What it does not
cover (the other memory policies, other mixers, biases, a missing or stale int8 cache) raises
`EngineUnavailable`: the torch runtime runs those. The torch path's forward and step stay
the reference it is tested against (tests/runtime/test_native_engine.py, test_native_memory.py).
"""

from __future__ import annotations

import json
import mmap
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if "numpy" not in sys.modules:
    # numpy's OpenBLAS keeps its idle threads spinning for ~2^28 cycles after each GEMM: in a
    # prefill they took a core from the window kernel's second thread between the matmuls
    # (fp32 prefill of 512 tokens: 2.18 s, 1.77 s with this). Read once, when OpenBLAS loads.
    os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")
import numpy as np  # noqa: E402

from agent.runtime import native
from agent.runtime.config import LaplaceConfig
from agent.runtime.files import file_identity
from agent.runtime.state_spec import MEMORY_NAMES, MEMORY_TENSORS, StateSpec, layer_rows, memory_slots_of, stacked_window_spec

INT8_CACHE = ".laplace-int8-rows-v1.safetensors"  # weights.PreparedCache's file for quant.QUANT_SCHEME
INT8_SCHEME = "int8-rows-v1"
GATED_EPS = 1e-6  # window_decode.GATED_EPS (tested equal)
NOVELTY_SPAN = 8  # memory.NOVELTY_SPAN (tested equal; memory.py imports torch)
TWIN = 1e-4  # memory.TWIN (tested equal)
# The memory policies the kernel scores ("recall" needs the branch's read, "attention" the softmax's weights).
MEMORY_POLICIES = ("novelty",)
# Rows per prefill pass, so its activations stay bounded at any prompt length: int8 128 (~4 MB:
# its peak RSS is the tight one, and the VNNI matmul is as fast on 128 rows), fp32 512 (numpy's
# GEMM: 484 tokens/s against 388 with 128 on the default model; ~16 MB).
PREFILL_CHUNK = {"int8": 128, "fp32": 512}

FEW_ROWS = 8  # up to this many rows, an int8 matmul reads the int8 rows directly (any number with VNNI)
_NP = {"F32": np.float32, "I8": np.int8, "I64": np.int64, "U8": np.uint8, "F16": np.float16}


def np_dtype(name: str) -> Any:
    """The numpy dtype of a state dtype name ("bfloat16": its bits, uint16)."""
    return np.dtype(np.uint16) if name == "bfloat16" else np.dtype(name)


class EngineUnavailable(Exception):
    """This model or directory cannot run on the torch-free engine; the message says why."""


class Mapped:
    """A safetensors file mapped read-only: `array(name)` is a numpy view of its bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) != 8:
                raise EngineUnavailable(f"{path}: too short to be safetensors")
            n = int.from_bytes(head, "little")
            if n > os.fstat(f.fileno()).st_size - 8:
                raise EngineUnavailable(f"{path}: its header runs past the end of the file (truncated?)")
            try:
                header = json.loads(f.read(n))
                meta = header.pop("__metadata__", None) or {}
                for info in header.values():
                    lo, hi = info["data_offsets"]
                    info["dtype"], info["shape"] = str(info["dtype"]), [int(x) for x in info["shape"]]
                    if not 0 <= lo <= hi:
                        raise ValueError
            except (ValueError, TypeError, KeyError, AttributeError):
                raise EngineUnavailable(f"{path}: its safetensors header is not readable (damaged?)") from None
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.meta: dict[str, str] = meta
        self.base = 8 + n
        self.infos: dict[str, dict[str, Any]] = header

    def array(self, name: str) -> np.ndarray:
        info = self.infos.get(name)
        if info is None:
            raise EngineUnavailable(f"{self.path.name} has no tensor {name!r}")
        if info["dtype"] not in _NP:
            raise EngineUnavailable(f"{self.path.name}: {name} is {info['dtype']}, which the engine does not read")
        lo, hi = info["data_offsets"]
        dtype = np.dtype(_NP[info["dtype"]])
        if self.base + hi > len(self.map) or hi - lo != dtype.itemsize * int(np.prod(info["shape"], dtype=np.int64)):
            raise EngineUnavailable(f"{self.path.name}: {name}'s bytes do not fit the file (truncated?)")
        return np.frombuffer(self.map, dtype=dtype, count=(hi - lo) // dtype.itemsize, offset=self.base + lo).reshape(info["shape"])


@dataclass
class Matrix:
    """One bias-free projection [N, K]: int8 rows and their scales, or fp32."""

    weight: np.ndarray
    scale: np.ndarray | None

    def __post_init__(self) -> None:
        self.rows, self.cols = self.weight.shape
        self.w_ptr = self.weight.ctypes.data  # the step passes these to C as they are
        self.s_ptr = None if self.scale is None else self.scale.ctypes.data

    def into(self, lib: Any, x: np.ndarray, out: np.ndarray, threads: int, scratch: np.ndarray | None = None,
             c_rows: int = FEW_ROWS) -> None:
        """out[T, N] = x[T, K] @ weight.T (times the scales): C for int8's rows up to `c_rows`,
        numpy else (int8 widened to fp32 first, exactly, into `scratch` when given: one buffer
        reused rather than a fresh allocation's page faults per matrix)."""
        if self.scale is None:
            np.matmul(x, self.weight.T, out=out)
        elif x.shape[0] <= c_rows:
            lib.laplace_matmul_i8(x.ctypes.data, x.shape[0], x.shape[1], self.w_ptr, self.s_ptr, self.rows, out.ctypes.data,
                                  out.strides[0] // 4, threads)
        else:
            wide = np.empty(self.weight.shape, np.float32) if scratch is None else scratch[: self.weight.size].reshape(self.weight.shape)
            np.copyto(wide, self.weight, casting="unsafe")
            np.matmul(x, wide.T, out=out)
            out *= self.scale


@dataclass
class Layer:
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    q: Matrix
    k: Matrix
    v: Matrix
    o: Matrix
    gate: Matrix  # w1
    up: Matrix  # w3
    down: Matrix  # w2
    branch: dict[str, np.ndarray]  # decay_w, decay_b, mix, q_map, k_map (fp32, contiguous; empty: no branch)

    def __post_init__(self) -> None:
        self.norm_ptrs = (self.attn_norm.ctypes.data, self.ffn_norm.ctypes.data)

    def matrices(self) -> tuple[Matrix, ...]:
        return (self.q, self.k, self.v, self.o, self.gate, self.up, self.down)


class EngineState:
    """The recurrent state of one sequence: the torch state's layer tensors by name ([L, 1, ...]
    fp32, `config.state_spec`) and the count of tokens read."""

    def __init__(self, tensors: dict[str, np.ndarray], positions: int = 0) -> None:
        self.tensors = tensors
        self.positions = positions

    def clone(self) -> "EngineState":
        return EngineState({n: t.copy() for n, t in self.tensors.items()}, self.positions)

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


def rope_cos_sin(positions: np.ndarray, dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """`layers.rope_cos_sin` in numpy: fp32 inverse frequencies and angles, halves repeated."""
    inv = np.float32(1.0) / (np.float32(theta) ** (np.arange(0, dim, 2).astype(np.float32) / np.float32(dim)))
    ang = positions.astype(np.float32)[..., None] * inv
    emb = np.concatenate([ang, ang], -1)
    return np.cos(emb), np.sin(emb)


def rotate_ring_keys(win_k: np.ndarray, theta: float, sign: int = 1) -> np.ndarray:
    """`window.rotate_ring_keys` in numpy: ring keys [..., S + W, D] rotated to their slots'
    angles (sign -1: back), for a version-2 state blob read without torch."""
    D = win_k.shape[-1]
    cos, sin = rope_cos_sin(sign * np.arange(win_k.shape[-2]), D, theta)
    half = np.concatenate([-win_k[..., D // 2 :], win_k[..., : D // 2]], axis=-1)
    return (win_k * cos + half * sin).astype(win_k.dtype, copy=False)


def step_tables(S: int, W: int, D: int, theta: float) -> tuple[np.ndarray, ...]:
    """`window_decode.step_tables`'s cos3, sin3, row and bias (see there), for the kernel."""
    t = np.arange(S + 2 * W)[:, None]
    slot_t = np.where(t < S, t, S + (t - S) % W)
    angles = np.concatenate([np.minimum(t, S + W - 1), slot_t, slot_t + W], 1)
    cos, sin = rope_cos_sin(angles, D, theta)
    sign = np.concatenate([-np.ones(D // 2, np.float32), np.ones(D // 2, np.float32)])
    s = np.arange(S + W)[None, :]
    sink = s < S
    p = np.where(s <= slot_t, t - (slot_t - s), t - (slot_t - s) - W)
    valid = np.where(sink, s <= t, p >= S)
    row = np.where(sink, 0, np.where(s <= slot_t, 1, 2)).astype(np.int64)
    bias = np.where(valid, 0.0, -np.inf).astype(np.float32)
    return (np.ascontiguousarray(cos, np.float32), np.ascontiguousarray(sin * sign, np.float32),
            np.ascontiguousarray(row), np.ascontiguousarray(bias))


def memory_table(S: int, W: int, D: int, theta: float, at: int | None = None) -> np.ndarray:
    """`window_decode.StepTables`' cos_mem, sin_mem [D] (the angle the memory is read at: `at`, None: W)
    and cos_ring, sin_ring [W, D] (the window slots' angles), sin signed, stacked [2 + 2W, D]."""
    sign = np.concatenate([-np.ones(D // 2, np.float32), np.ones(D // 2, np.float32)])
    cos_m, sin_m = rope_cos_sin(np.array([W if at is None else at]), D, theta)
    cos_r, sin_r = rope_cos_sin(np.arange(S, S + W), D, theta)
    return np.ascontiguousarray(np.concatenate([cos_m, sin_m * sign, cos_r, sin_r * sign]), np.float32)


class Engine:
    """A loaded model: `new_state()`, `prefill(ids, state)` and `step(token, state)` -> logits."""

    def __init__(self, config: LaplaceConfig, layers: list[Layer], embed: Matrix, head: Matrix, norm: np.ndarray,
                 threads: int, files: list[Mapped]) -> None:
        lib = native.library()
        if lib is None:
            raise EngineUnavailable(f"the C kernels are not available: {native.status()}")
        self.lib, self.config, self.layers, self.embed, self.head, self.norm = lib, config, layers, embed, head, norm
        self.threads = threads
        self.files = files  # the mappings every array above views
        c = config
        self.tables = step_tables(c.sinks, c.window, c.head_k_dim, c.rope_theta)
        self.static = [self._window_args(i) for i in range(c.n_layers)]
        # With a memory, laplace_window_memory takes these after laplace_window's arguments (and the state's).
        # Each memory group's table, at the distance its layers read the memory at (kept: the kernel reads their addresses).
        at = sorted({c.memory_read_at_layer(i) for i in range(c.n_layers)}) if c.memory_slots else []
        self.mem_tables = {d: memory_table(c.sinks, c.window, c.head_k_dim, c.rope_theta, d) for d in at}
        self.mem_static = [(self.mem_tables[c.memory_read_at_layer(i)].ctypes.data, NOVELTY_SPAN, 1.0 - TWIN) if at else ()
                           for i in range(c.n_layers)]
        # Each layer's memory: its stacked tensors' names (mem_k & co. or rest_k & co.), its row and M; or None.
        self.mem_rows = [None if "mem_k" not in rows else (tuple(rows[n][0] for n in MEMORY_NAMES), rows["mem_k"][1], memory_slots_of(c, i))
                         for i, rows in enumerate(layer_rows(c, self.state_spec()))]
        # With the VNNI form of the int8 matmul, a prefill's rows take it too (else numpy's GEMM).
        self.c_rows = 1 << 30 if lib.laplace_matmul_i8_vnni() else FEW_ROWS
        self.norm_eps = c.final_norm_eps if c.final_norm_eps is not None else c.norm_eps

    # ---- loading ----------------------------------------------------------------------------

    @classmethod
    def load(cls, model_dir: str | Path, *, weights: str = "int8", threads: int = 2,
             config: LaplaceConfig | None = None) -> "Engine":
        """The model in `model_dir` with int8 (the prepared cache) or fp32 weights. `config`,
        when given, replaces the directory's (the same weights: a memory's slots and policy
        switched by `dataclasses.replace`, as `laplace bench window-memory` does)."""
        root = Path(model_dir)
        if config is None:
            try:
                meta = json.loads((root / "config.json").read_text(encoding="utf-8"))
                config = LaplaceConfig.from_dict(meta["model"])
            except (OSError, ValueError, KeyError, TypeError) as e:
                raise EngineUnavailable(f"{root}: no readable config.json ({e})") from None
        c = config
        why = cls.unsupported(c)
        if why:
            raise EngineUnavailable(why)
        if weights not in ("int8", "fp32"):
            raise EngineUnavailable(f"weights must be int8 or fp32, got {weights!r}")
        file = root / "model.safetensors"
        try:
            full = Mapped(file)
        except (OSError, ValueError) as e:
            raise EngineUnavailable(f"{file}: not readable ({e})") from None
        if any(n.endswith(".bias") for n in full.infos):
            raise EngineUnavailable("a projection with a bias: the engine runs bias-free models only")
        files = [full]
        if weights == "int8":
            try:
                q = Mapped(root / INT8_CACHE)
            except (OSError, ValueError) as e:
                raise EngineUnavailable(f"no int8 cache in {root} ({e}); one int8 load with the torch runtime writes it") from None
            if q.meta.get("scheme") != INT8_SCHEME or q.meta.get("source") != file_identity(file):
                raise EngineUnavailable(f"{root / INT8_CACHE} was made from another weights file; one int8 load with the torch runtime writes it again")
            files.append(q)

        def matrix(name: str) -> Matrix:
            if weights == "int8":
                return Matrix(files[1].array(name + ".weight"), np.ascontiguousarray(files[1].array(name + ".scale")))
            w = full.array(name + ".weight")
            if w.dtype != np.float32:
                raise EngineUnavailable(f"{name} is {w.dtype}, not float32")
            return Matrix(w, None)

        def f32(name: str) -> np.ndarray:
            return np.ascontiguousarray(full.array(name), dtype=np.float32)

        layers = []
        for i in range(c.n_layers):
            p = f"blocks.{i}."
            branch: dict[str, np.ndarray] = {}
            if c.gla_branch:
                b = p + "attn.gla_branch."
                branch = {"decay_w": f32(b + "decay_weight"), "decay_b": f32(b + "decay_bias"),
                          "mix": f32(b + ("log_beta" if c.combine == "softmax" else "gate"))}
                if c.feature_map != "elu":
                    branch |= {"q_map": f32(b + "q_map"), "k_map": f32(b + "k_map")}
            layers.append(Layer(f32(p + "attn_norm.weight"), f32(p + "ffn_norm.weight"),
                                *(matrix(p + f"attn.{n}_proj") for n in "qkvo"),
                                *(matrix(p + f"ffn.{n}") for n in ("w1", "w3", "w2")), branch))
        embed = matrix("embed")
        head = embed if c.tie_embeddings else matrix("lm_head")
        return cls(config, layers, embed, head, f32("norm.weight"), threads, files)

    @staticmethod
    def unsupported(c: LaplaceConfig) -> str | None:
        """Why the engine cannot run a model of config `c`, or None."""
        if c.mixer != "window":
            return f"the engine runs window-mixer models; this one's mixer is {c.mixer}"
        if c.memory_slots and c.memory_policy not in MEMORY_POLICIES:
            return (f"the engine's memory keeps tokens by the \"novelty\" policy only; this model's memory_policy is "
                    f"{c.memory_policy!r} (the torch runtime runs it)")
        if not c.ffn_dim or c.head_k_dim != c.head_v_dim or c.kv_heads > 64:
            return "the engine needs a GLU feed-forward, equal key and value head sizes, and at most 64 kv heads"
        return None

    # ---- running ----------------------------------------------------------------------------

    def state_spec(self) -> StateSpec:
        """`config.state_spec(1)` without "pos" (which the engine keeps as an int): the
        window mixer's own declaration, stacked over the layers (the memory's over the
        layers that keep one). numpy has no bf16: the memory's bf16 arrays are uint16 bits."""
        return stacked_window_spec(self.config, 1)

    def new_state(self) -> EngineState:
        return EngineState({n: np.zeros(shape, dtype=np_dtype(dtype)) for n, (shape, dtype) in self.state_spec().items()})

    def _embed(self, ids: np.ndarray) -> np.ndarray:
        rows = self.embed.weight[ids].astype(np.float32)
        return rows * self.embed.scale[ids][:, None] if self.embed.scale is not None else rows

    def _window_args(self, i: int) -> tuple[list[Any], list[Any]]:
        """laplace_window's arguments for layer i that never change: those after the ring
        (tables, shapes) and those after the branch state (its parameters), as ints."""
        c, br = self.config, self.layers[i].branch
        cos3, sin3, row, bias = self.tables
        mid = [cos3.ctypes.data, sin3.ctypes.data, row.ctypes.data, bias.ctypes.data]
        shape = [c.n_heads, c.kv_heads, c.head_k_dim, c.sinks, c.window]
        if not br:
            tail = [c.d_model, None, None, None, None, 0, 1.0, None, 1.0, 0, GATED_EPS]
        else:
            qm, km = br.get("q_map"), br.get("k_map")
            tail = [c.d_model, br["decay_w"].ctypes.data, br["decay_b"].ctypes.data, None if qm is None else qm.ctypes.data,
                    None if km is None else km.ctypes.data, 0 if qm is None else qm.shape[-1], float(c.gate_normalizer),
                    br["mix"].ctypes.data, c.feature_size**-0.5 if c.qk_scale else 1.0, int(c.combine != "softmax"), GATED_EPS]
        return mid, [shape, tail]

    @staticmethod
    def _state_ptrs(state: EngineState) -> tuple[Any, ...]:
        """The state's ring and branch addresses and their per-layer strides (bytes), then each
        stacked memory tensor's (address, stride) by name."""
        t = state.tensors
        wk, wv, gla = t["win_k"], t["win_v"], t.get("gla")
        mem = {n: (a.ctypes.data, a.strides[0]) for n, a in t.items() if n in MEMORY_TENSORS}
        return (wk.ctypes.data, wv.ctypes.data, None if gla is None else gla.ctypes.data, wk.strides[0],
                0 if gla is None else gla.strides[0], mem)

    def _window(self, i: int, ptrs: tuple[Any, ...], t0: int, T: int, qkv: tuple[int, int],
                xin: tuple[int, int], y: tuple[int, int]) -> None:
        """The window mixer of layer i over T rows of qkv (fp32) from position t0: y written,
        the layer's ring (and branch state, memory) advanced in place. qkv, xin, y: (address,
        row stride in floats); ptrs: `_state_ptrs`."""
        mid, (shape, tail) = self.static[i]
        kp, vp, gp, ring, branch, mem = ptrs
        args = (qkv[0], 0, None, qkv[1], kp + i * ring, vp + i * ring, *mid, t0, T, *shape,
                None if gp is None else gp + i * branch, xin[0], xin[1], *tail, y[0], y[1], self.threads)
        own = self.mem_rows[i]
        if own is None:
            rc = self.lib.laplace_window(*args)
        else:
            names, r, slots = own
            rc = self.lib.laplace_window_memory(*args, *(mem[n][0] + r * mem[n][1] for n in names), slots, *self.mem_static[i])
        if rc != 0:
            raise EngineUnavailable(f"the window kernel refused the shapes of layer {i}")

    def prefill(self, ids: list[int] | np.ndarray, state: EngineState) -> np.ndarray:
        """Reads `ids` into `state` (in place) and returns the last token's logits [vocab]."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("prefill takes one non-empty row of token ids")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"a token id is outside the vocabulary (0..{self.config.vocab_size - 1})")
        chunk = PREFILL_CHUNK["fp32" if self.embed.scale is None else "int8"]
        for at in range(0, ids.size, chunk):
            h = self._rows(ids[at : at + chunk], state)
        out = np.empty((1, self.head.rows), np.float32)
        self.head.into(self.lib, np.ascontiguousarray(h[-1:]), out, self.threads)
        return out[0]

    def _rows(self, ids: np.ndarray, state: EngineState) -> np.ndarray:
        """The rows `ids` through every layer (the state advanced): their final-normed hidden
        rows [T, d_model]. The norms and the GLU's middle are C over all rows at once."""
        c, lib, n = self.config, self.lib, self.threads
        T, d, f = ids.size, c.d_model, c.ffn_dim
        x = np.ascontiguousarray(self._embed(ids), dtype=np.float32)
        kv = c.kv_heads * c.head_k_dim
        h = np.empty((T, d), np.float32)
        qkv = np.empty((T, c.key_dim + 2 * kv), np.float32)
        y = np.empty((T, c.value_dim), np.float32)
        o = np.empty((T, d), np.float32)
        gu = np.empty((T, 2 * f), np.float32)
        a = np.empty((T, f), np.float32)
        xp, hp, op = x.ctypes.data, h.ctypes.data, o.ctypes.data
        ptrs = self._state_ptrs(state)
        QKV, HR, YR = ((a.ctypes.data, a.strides[0] // 4) for a in (qkv, h, y))  # (address, row stride)
        wide = None  # int8 rows widened for numpy's GEMM: one buffer for every matrix of the pass
        if self.embed.scale is not None and T > self.c_rows:
            wide = np.empty(max(m.weight.size for m in self.layers[0].matrices()), np.float32)
        rows = self.c_rows
        for i, L in enumerate(self.layers):
            lib.laplace_add_norm_rows(xp, None if i == 0 else op, T, d, L.norm_ptrs[0], c.norm_eps, hp)
            L.q.into(lib, h, qkv[:, : c.key_dim], n, wide, rows)
            L.k.into(lib, h, qkv[:, c.key_dim : c.key_dim + kv], n, wide, rows)
            L.v.into(lib, h, qkv[:, c.key_dim + kv :], n, wide, rows)
            self._window(i, ptrs, state.positions, T, QKV, HR, YR)
            L.o.into(lib, y, o, n, wide, rows)
            lib.laplace_add_norm_rows(xp, op, T, d, L.norm_ptrs[1], c.norm_eps, hp)
            L.gate.into(lib, h, gu[:, :f], n, wide, rows)
            L.up.into(lib, h, gu[:, f:], n, wide, rows)
            lib.laplace_silu_mul_rows(gu.ctypes.data, T, f, a.ctypes.data)
            L.down.into(lib, a, o, n, wide, rows)
        lib.laplace_add_norm_rows(xp, op, T, d, self.norm.ctypes.data, self.norm_eps, hp)
        state.positions += T
        return h

    def step(self, token: int, state: EngineState) -> np.ndarray:
        """One token into `state` (in place): its logits [vocab]. The decode step: every call
        but the embedding row is a C kernel (the matmuls too with int8 weights), with the
        arrays' addresses taken once per step (a numpy call costs more than a layer's norm)."""
        c, lib, n = self.config, self.lib, self.threads
        if not 0 <= token < c.vocab_size:
            raise ValueError(f"token {token} is outside the vocabulary (0..{c.vocab_size - 1})")
        d, f, nq = c.d_model, c.ffn_dim, c.key_dim
        kv = c.kv_heads * c.head_k_dim
        x = self._embed(np.array([token]))
        h = np.empty((1, d), np.float32)
        qkv = np.empty((1, nq + 2 * kv), np.float32)
        y = np.empty((1, c.value_dim), np.float32)
        gu = np.empty((1, 2 * f), np.float32)
        a = np.empty((1, f), np.float32)
        prev = np.empty((1, d), np.float32)
        xp = x.ctypes.data
        # (array, address) of each operand: C takes the address, numpy (fp32 weights) the array.
        H, Y, A, P = ((t, t.ctypes.data) for t in (h, y, a, prev))
        Q, K, V = ((v, v.ctypes.data) for v in (qkv[:, :nq], qkv[:, nq : nq + kv], qkv[:, nq + kv :]))
        G, U = ((v, v.ctypes.data) for v in (gu[:, :f], gu[:, f:]))
        ptrs, t = self._state_ptrs(state), state.positions

        def mm(m: Matrix, src: tuple[np.ndarray, int], dst: tuple[np.ndarray, int]) -> None:
            if m.s_ptr is not None:
                lib.laplace_matmul_i8(src[1], 1, m.cols, m.w_ptr, m.s_ptr, m.rows, dst[1], m.rows, n)
            else:  # fp32: numpy's GEMV (OpenBLAS) on the mapped weights
                np.matmul(src[0], m.weight.T, out=dst[0])

        for i, L in enumerate(self.layers):
            lib.laplace_add_norm(xp, None if i == 0 else P[1], 0, None, d, L.norm_ptrs[0], c.norm_eps, H[1], None, 0)
            mm(L.q, H, Q)
            mm(L.k, H, K)
            mm(L.v, H, V)
            self._window(i, ptrs, t, 1, (Q[1], 0), (H[1], 0), (Y[1], 0))
            mm(L.o, Y, P)
            lib.laplace_add_norm(xp, P[1], 0, None, d, L.norm_ptrs[1], c.norm_eps, H[1], None, 0)
            mm(L.gate, H, G)
            mm(L.up, H, U)
            lib.laplace_silu_mul(G[1], 0, None, f, A[1], 0)
            mm(L.down, A, P)
        lib.laplace_add_norm(xp, P[1], 0, None, d, self.norm.ctypes.data, self.norm_eps, H[1], None, 0)
        out = np.empty((1, self.head.rows), np.float32)
        self.head.into(lib, h, out, n)
        state.positions += 1
        return out[0]
