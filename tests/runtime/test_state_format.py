"""`state_format`, the torch-free state bytes: `encode_state` writes what `to_bytes` writes,
byte for byte, for a window state (version 3) and a gla+conv one (version 1);
`decode_state` reads both back and refuses what `from_bytes` refuses with the same error
class; the module imports no torch; the numpy ring rotation equals the torch one."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.runtime.checkpoint import load_model
from agent.runtime.model import build_model
from agent.runtime.native.engine import rotate_ring_keys as rotate_ring_keys_np
from agent.runtime.state import RecurrentState, tensor_bytes
from agent.runtime.state_format import (
    StateCorruptError,
    StateError,
    StateModelMismatchError,
    decode_state,
    encode_state,
    read_state_metadata,
)
from agent.runtime.window import rotate_ring_keys
from tests.runtime.test_window import window_config

REPO = Path(__file__).resolve().parents[2]
N_TOKENS = 17


def random_state(model, seed: int) -> RecurrentState:
    """A batch-1 state of `model` with random floats and its positions at N_TOKENS."""
    state = model.new_state(1)
    gen = torch.Generator().manual_seed(seed)
    for t in state.tensors.values():
        if t.is_floating_point():
            t.copy_(torch.randn(t.shape, generator=gen))
        else:
            t.fill_(N_TOKENS)
    state.n_tokens = N_TOKENS
    return state


@pytest.fixture(scope="module")
def window():
    config = window_config()
    return random_state(build_model(config, seed=0), seed=1), config


@pytest.fixture(scope="module")
def tiny():
    lm = load_model("tiny")
    return random_state(lm.model, seed=2), lm.config


def raw_tensors(state: RecurrentState) -> list[tuple[str, str, tuple[int, ...], bytes]]:
    return [(n, "F32" if t.is_floating_point() else "I64", tuple(t.shape), tensor_bytes(t)) for n, t in state.tensors.items()]


@pytest.fixture(params=["window", "tiny"])
def case(request):
    state, config = request.getfixturevalue(request.param)
    return request.param, state, config


# ---- the writer ------------------------------------------------------------------------------


def test_encode_state_writes_what_to_bytes_writes(case):
    kind, state, config = case
    for kw in (dict(), dict(architecture=config.architecture(), extra={"stream_hash": "abc", "b": "1"})):
        want = state.to_bytes(fingerprint="fp", **kw)
        assert encode_state(raw_tensors(state), n_tokens=N_TOKENS, fingerprint="fp", **kw) == want
    version = read_state_metadata(want)["format_version"]
    assert version == {"window": "3", "tiny": "1"}[kind]


def test_encode_state_takes_any_byte_buffer(window):
    """bytearray, a memoryview of bytes, and a numpy array's (typed) memoryview all count bytes."""
    state, _ = window
    want = state.to_bytes(fingerprint="fp")
    as_views = [(n, c, s, memoryview(bytearray(raw))) for n, c, s, raw in raw_tensors(state)]
    as_arrays = [(n, c, s, memoryview(state.tensors[n].numpy())) for n, c, s, _ in raw_tensors(state)]
    assert encode_state(as_views, n_tokens=N_TOKENS, fingerprint="fp") == want
    assert encode_state(as_arrays, n_tokens=N_TOKENS, fingerprint="fp") == want


def test_encode_state_refuses_what_does_not_fit(window):
    state, _ = window
    tensors = raw_tensors(state)
    name, code, shape, raw = tensors[0]
    with pytest.raises(ValueError, match="bytes, not the"):
        encode_state([(name, code, shape, raw[:-4]), *tensors[1:]], n_tokens=N_TOKENS, fingerprint="fp")
    with pytest.raises(ValueError, match="dtype 'F16'"):
        encode_state([(name, "F16", shape, raw), *tensors[1:]], n_tokens=N_TOKENS, fingerprint="fp")
    with pytest.raises(StateCorruptError, match="read 17 tokens but its host count is 16"):
        encode_state(tensors, n_tokens=N_TOKENS - 1, fingerprint="fp")


# ---- the reader ------------------------------------------------------------------------------


def test_decode_state_round_trips(case):
    _, state, config = case
    blob = state.to_bytes(fingerprint="fp", architecture=config.architecture(), extra={"k": "v"})
    decoded = decode_state(blob, fingerprint="fp", architecture=config.architecture())
    assert decoded.n_tokens == N_TOKENS and decoded.meta == read_state_metadata(blob)
    assert decoded.version == int(decoded.meta["format_version"]) and not decoded.unrotated_keys
    assert list(decoded.tensors) == state.names
    for name, (code, shape, raw) in decoded.tensors.items():
        t = state.tensors[name]
        assert code == ("F32" if t.is_floating_point() else "I64") and shape == tuple(t.shape)
        assert bytes(raw) == tensor_bytes(t)
    again = encode_state([(n, *entry) for n, entry in decoded.tensors.items()], n_tokens=decoded.n_tokens,
                         fingerprint="fp", architecture=config.architecture(), extra={"k": "v"})
    assert again == blob


def test_from_bytes_reads_what_encode_state_writes(case):
    _, state, config = case
    blob = encode_state(raw_tensors(state), n_tokens=N_TOKENS, fingerprint="fp", architecture=config.architecture())
    back = RecurrentState.from_bytes(blob, config=config, fingerprint="fp")
    assert back.names == state.names and back.n_tokens == N_TOKENS
    assert all(torch.equal(back.tensors[n], state.tensors[n]) for n in state.names)
    name = back.names[0]
    back.tensors[name].add_(1.0)  # copies, writable in place (the decode step's use), not views of the blob
    assert not torch.equal(back.tensors[name], state.tensors[name])
    assert bytes(decode_state(blob).tensors[name][2]) == tensor_bytes(state.tensors[name])


def test_the_fixtures_written_by_earlier_code_decode():
    data = REPO / "tests" / "runtime" / "data"
    v1 = decode_state((data / "state_v1_tiny.laplace-state").read_bytes())
    assert v1.version == 1 and list(v1.tensors) == ["gla", "conv"] and v1.n_tokens == 40
    v2 = decode_state((data / "state_v2_window.laplace-state").read_bytes())
    assert v2.version == 2 and v2.unrotated_keys and v2.n_tokens == 23


def flip(blob: bytes, at: int) -> bytes:
    bad = bytearray(blob)
    bad[at] ^= 0x01
    return bytes(bad)


BAD = {
    "empty": lambda b: b[:0],
    "in-length": lambda b: b[:5],
    "in-header": lambda b: b[:200],
    "last-byte": lambda b: b[:-1],
    "one-more-byte": lambda b: b + b"\0",
    "payload-flipped": lambda b: flip(b, len(b) - 100),
    "length-flipped": lambda b: flip(b, 0),
    "not-json": lambda b: b[:8] + b"[" + b[9:],
    "not-a-state": lambda b: b.replace(b'"format":"laplace-state"', b'"format":"laplace-other"'),
    "version-9": lambda b: re.sub(rb'"format_version":"\d"', b'"format_version":"9"', b),
    "dtype": lambda b: b.replace(b'"dtype":"F32"', b'"dtype":"F16"', 1),
    "offsets": lambda b: b.replace(b'"data_offsets":[0,', b'"data_offsets":[8,', 1),
}


@pytest.mark.parametrize("how", list(BAD))
def test_a_bad_blob_is_refused_as_from_bytes_refuses_it(case, how):
    _, state, config = case
    blob = state.to_bytes(fingerprint="fp", architecture=config.architecture())
    bad = BAD[how](blob)
    assert bad != blob
    with pytest.raises(StateError) as by_state:
        RecurrentState.from_bytes(bad, config=config)
    with pytest.raises(StateError) as by_format:
        decode_state(bad, architecture=config.architecture())
    assert by_format.type is by_state.type is StateCorruptError
    assert str(by_format.value) == str(by_state.value) and "replay the transcript" in str(by_format.value)


def test_the_host_count_must_agree_with_the_positions(window, tiny):
    """n_tokens is metadata, outside the checksum: a window state's positions hold it to the
    truth; a gla/conv state has none, so its count is taken as written."""
    for (state, config), refused in [(window, True), (tiny, False)]:
        bad = state.to_bytes(fingerprint="fp").replace(b'"n_tokens":"17"', b'"n_tokens":"16"')
        if not refused:
            assert decode_state(bad).n_tokens == RecurrentState.from_bytes(bad, config=config).n_tokens == 16
            continue
        with pytest.raises(StateCorruptError, match="read 17 tokens but its host count is 16") as by_state:
            RecurrentState.from_bytes(bad, config=config)
        with pytest.raises(StateCorruptError) as by_format:
            decode_state(bad)
        assert str(by_format.value) == str(by_state.value)


def test_another_model_or_architecture_is_refused_as_from_bytes_refuses_it(window, tiny):
    state, config = window
    blob = state.to_bytes(fingerprint="fp", architecture=config.architecture())
    other = config.replace(window=8)
    for kw, fmt_kw, match in [(dict(fingerprint="other"), dict(fingerprint="other"), "written by model"),
                              (dict(config=other), dict(architecture=other.architecture()), "written by a window")]:
        with pytest.raises(StateError, match=match) as by_state:
            RecurrentState.from_bytes(blob, **kw)
        with pytest.raises(StateError, match=match) as by_format:
            decode_state(blob, **fmt_kw)
        assert by_format.type is by_state.type is StateModelMismatchError
        assert str(by_format.value) == str(by_state.value)
    # A blob without an architecture, and a caller without one, pass: the shapes are the caller's.
    assert decode_state(state.to_bytes(fingerprint="fp"), architecture="gla/whatever").n_tokens == N_TOKENS
    assert decode_state(blob).n_tokens == N_TOKENS


# ---- no torch, and the v2 ring rotation in numpy -----------------------------------------------


def test_state_format_imports_no_torch():
    code = "import agent.runtime.state_format, sys; assert 'torch' not in sys.modules and 'numpy' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


@pytest.mark.parametrize("sign", [1, -1])
@pytest.mark.parametrize("theta", [100.0, 10000.0, 500000.0])
def test_numpy_ring_rotation_equals_the_torch_one(sign, theta):
    win_k = torch.randn(3, 1, 2, 4 + 64, 16, generator=torch.Generator().manual_seed(int(theta) + sign))
    want = rotate_ring_keys(win_k, theta, sign)
    got = rotate_ring_keys_np(win_k.numpy(), theta, sign)
    assert got.dtype == np.float32 and got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.numpy(), rtol=0, atol=1e-6)


def test_a_version_2_blob_rotated_in_numpy_loads_as_from_bytes_loads_it():
    from tests.runtime.test_window import window_model

    config = window_model(combine="softmax").config
    blob = (REPO / "tests" / "runtime" / "data" / "state_v2_window.laplace-state").read_bytes()
    decoded = decode_state(blob)
    _, shape, raw = decoded.tensors["win_k"]
    keys = rotate_ring_keys_np(np.frombuffer(raw, dtype=np.float32).reshape(shape), config.rope_theta)
    want = RecurrentState.from_bytes(blob, config=config).win_k
    np.testing.assert_allclose(keys, want.numpy(), rtol=0, atol=1e-6)
