"""The torch-free engine behind the chat layer: `laplace chat` and `laplace ask` on the C
engine (`native.engine`), with no torch in the process (issue 35).

- `ArrayState`: the engine's state as the chat layer handles a state: the host's count
  `n_tokens`, `clone`, `nbytes`, `positions`, and the stored blob written and read through
  `state_format` (the torch `RecurrentState`'s writer and reader), so the two runtimes'
  blobs are the same bytes and either opens a session the other wrote.
- `EngineRunner`: `decoding.Runner` over an `Engine`: segmented prefill that never changes
  the state it is given (the engine works in place: the runner clones first), one token in
  place, numpy logits and a `numpy.random.Generator` (`sampling.sample_array`).
- `EngineModel`: what the chat layer reads of a loaded model (tokenizer, template, config,
  card, name, fingerprint); the fingerprint is the torch loader's, computed from the digests
  cached in the directory (`modeldir.cached_fingerprint`), so a session does not care which
  runtime wrote it. `open_engine_model` loads one, or says why it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from agent.runtime.config import LaplaceConfig
from agent.runtime.decoding import Runner, segment_length
from agent.runtime.native.engine import Engine, EngineState, EngineUnavailable, np_dtype, rotate_ring_keys
from agent.runtime.sampling import make_rng
from agent.runtime.state_format import StateCorruptError, StateModelMismatchError, decode_state, encode_state
from agent.runtime.templates import AnyTemplate, load_chat_template
from agent.runtime.tokenizer import Tokenizer

POSITIONS = "pos"  # the torch state's positions tensor [1, B] (state.POSITIONS)
_CODES = {np.dtype(np.float32): "F32", np.dtype(np.int64): "I64", np.dtype(np.uint16): "BF16"}  # uint16: bf16 bits (`np_dtype`)


class ArrayState:
    """A batch-1 engine state with the host's token count (see the module docstring)."""

    def __init__(self, inner: EngineState, n_tokens: int = 0) -> None:
        self.inner = inner
        self.n_tokens = n_tokens

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        return self.inner.tensors

    @property
    def positions(self) -> np.ndarray:
        """[1] int64: tokens read, by the model's own count (`RecurrentState.positions`)."""
        return np.array([self.inner.positions], dtype=np.int64)

    @property
    def nbytes(self) -> int:
        return self.inner.nbytes + 8  # and the positions tensor the stored form holds

    def clone(self) -> "ArrayState":
        return ArrayState(self.inner.clone(), self.n_tokens)

    def check_positions(self) -> None:
        if self.inner.positions != self.n_tokens:
            raise StateCorruptError(f"state says it read {self.inner.positions} tokens but its host count is "
                                    f"{self.n_tokens}; replay the transcript into a fresh state")

    def to_bytes(self, *, fingerprint: str, extra: dict[str, str] | None = None, architecture: str | None = None) -> bytes:
        """`RecurrentState.to_bytes`' bytes for the same numbers: the layer tensors in their
        declared order, then pos [1, 1]."""
        self.check_positions()
        pos = np.array([[self.inner.positions]], dtype=np.int64)
        items = [*self.inner.tensors.items(), (POSITIONS, pos)]
        return encode_state([(n, _CODES[t.dtype], tuple(t.shape), memoryview(np.ascontiguousarray(t)).cast("B")) for n, t in items],
                            n_tokens=self.n_tokens, fingerprint=fingerprint, architecture=architecture, extra=extra)


def load_array_state(data: bytes, spec: dict[str, tuple[tuple[int, ...], str]], *, config: LaplaceConfig,
                     fingerprint: str | None) -> ArrayState:
    """A stored blob as an `ArrayState`, checked as `RecurrentState.from_bytes` checks it:
    format, checksum, model (architecture and fingerprint), every tensor's shape against
    `spec` (the engine's `state_spec()`), and its positions against its token count."""
    blob = decode_state(data, fingerprint=fingerprint, architecture=config.architecture())
    want = {**spec, POSITIONS: ((1, 1), "int64")}
    if set(blob.tensors) != set(want):
        raise StateModelMismatchError(f"state holds {sorted(blob.tensors)}, not this model's {sorted(want)}; "
                                      "load the original model, or replay the transcript into a fresh state for this one")
    arrays: dict[str, np.ndarray] = {}
    for name, (code, shape, raw) in blob.tensors.items():
        wshape, wdtype = want[name]
        if tuple(shape) != tuple(wshape) or code != _CODES[np_dtype(wdtype)]:
            raise StateModelMismatchError(f"state tensor {name} is {code} {tuple(shape)}, not this model's {tuple(wshape)}; "
                                          "load the original model, or replay the transcript into a fresh state for this one")
        arrays[name] = np.frombuffer(raw, dtype=np_dtype(wdtype)).reshape(shape).copy()  # stepped in place: never the blob's bytes
    if blob.unrotated_keys:  # an older blob's ring keys at their tokens' angles: rotate them to their slots'
        arrays["win_k"] = rotate_ring_keys(arrays["win_k"], config.rope_theta)
    pos = int(arrays.pop(POSITIONS)[0, 0])
    state = ArrayState(EngineState({n: arrays[n] for n in spec}, pos), blob.n_tokens)
    state.check_positions()
    return state


class EngineRunner:
    """`decoding.Runner` on the torch-free engine (see the module docstring)."""

    device = "cpu"

    def __init__(self, engine: Engine, segment_len: int | None = None) -> None:
        self.segment_len = segment_length(engine.config.chunk_size, segment_len)
        self.engine = engine
        self.config = engine.config
        self._spec = engine.state_spec()

    def new_state(self) -> ArrayState:
        return ArrayState(self.engine.new_state())

    def load_state(self, data: bytes, *, config: Any, fingerprint: str) -> ArrayState:
        return load_array_state(data, self._spec, config=config, fingerprint=fingerprint)

    def prefill(self, ids: Sequence[int], state: ArrayState | None = None, progress: Any = None) -> tuple[np.ndarray, ArrayState]:
        """Fold `ids` segment by segment into a copy of `state` (a fresh state when None)."""
        if len(ids) == 0:
            raise ValueError("prefill needs at least one token")
        new = state.clone() if state is not None else self.new_state()
        all_ids = np.asarray(list(ids), dtype=np.int64)
        logits = None
        for start in range(0, len(all_ids), self.segment_len):
            logits = self.engine.prefill(all_ids[start : start + self.segment_len], new.inner)
            if progress is not None:
                progress(min(start + self.segment_len, len(all_ids)), len(all_ids))
        new.n_tokens += len(all_ids)
        new.check_positions()
        assert logits is not None
        return logits, new

    def step_token(self, token: int, state: ArrayState) -> np.ndarray:
        logits = self.engine.step(token, state.inner)
        state.n_tokens += 1
        return logits

    def new_generator(self, seed: int | None) -> np.random.Generator:
        return make_rng(seed)


_: type[Runner] = EngineRunner  # the chat layer's protocol, checked by type checkers


@dataclass
class EngineModel:
    """What the chat layer reads of a loaded model (`checkpoint.LoadedModel`'s fields but
    the torch module), for a model the engine runs."""

    engine: Engine
    tokenizer: Tokenizer
    template: AnyTemplate
    name: str
    path: Path
    fingerprint: str
    weights: str  # "int8" | "fp32"
    card: dict[str, Any] = field(default_factory=dict)
    _twin: Any = field(default=None, repr=False)

    @property
    def config(self) -> LaplaceConfig:
        return self.engine.config

    def torch_twin(self, state: ArrayState) -> tuple[Any, Any]:
        """(this model loaded by torch, `state` as its `RecurrentState`): for what only the
        torch runtime does (the probes behind the TUI's /check). The model loads once, on
        first use, and must have this fingerprint; the state crosses as its stored bytes."""
        from agent.runtime.checkpoint import load_model_dir
        from agent.runtime.state import RecurrentState

        if self._twin is None:
            lm = load_model_dir(self.path, quant="int8" if self.weights == "int8" else None, decode_layout=True)
            if lm.fingerprint != self.fingerprint:
                raise StateModelMismatchError(f"{self.path} changed on disk since this chat opened it; restart the chat")
            self._twin = lm
        blob = state.to_bytes(fingerprint=self.fingerprint, architecture=self.config.architecture())
        return self._twin, RecurrentState.from_bytes(blob, config=self.config, fingerprint=self.fingerprint)


def open_engine_model(path: Path, *, weights: str, threads: int = 2) -> EngineModel:
    """The model directory `path` on the engine, or EngineUnavailable saying why not (the
    caller then loads it with torch, which also writes the caches this needs)."""
    from agent.runtime.modeldir import cached_fingerprint, read_config

    quant = "int8" if weights == "int8" else None
    fp = cached_fingerprint(path, quant)
    if fp is None:
        raise EngineUnavailable(f"{path}: the weights' digest is not cached yet; one load with the torch runtime caches it")
    config, card = read_config(path)
    why = Engine.unsupported(config)
    if why:
        raise EngineUnavailable(why)
    engine = Engine.load(path, weights=weights, threads=threads)
    try:
        tokenizer = Tokenizer.from_file(path / "tokenizer.json")
        template = load_chat_template(path / "chat_template.json")
    except Exception as exc:  # tokenizers raises its own Exception type; the torch loader words the error
        raise EngineUnavailable(f"tokenizer or chat template in {path}: {exc}") from None
    if tokenizer.vocab_size > config.vocab_size:
        raise EngineUnavailable(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {config.vocab_size}")
    card = {**card, "weights": quant} if quant else card
    return EngineModel(engine, tokenizer, template, name=card.get("name", path.name), path=path, fingerprint=fp,
                       weights=weights, card=card)
