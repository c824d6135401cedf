"""State bytes and model directories: round trips, and clear errors for every bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from agent.runtime.checkpoint import ModelLoadError, load_model, load_model_dir, save_model_dir
from agent.runtime.config import PRESETS
from agent.runtime.state import RecurrentState, StateCorruptError, StateModelMismatchError, read_state_metadata


@pytest.fixture(scope="module")
def loaded():
    return load_model("tiny")


@pytest.fixture
def blob(loaded):
    _, state = loaded.model(torch.randint(0, 200, (1, 30)))
    return state.to_bytes(fingerprint=loaded.fingerprint, extra={"stream_hash": "abc"})


def test_round_trip_keeps_tensors_and_metadata(loaded, blob):
    state = RecurrentState.from_bytes(blob, config=loaded.config, fingerprint=loaded.fingerprint)
    assert state.n_tokens == 30
    meta = read_state_metadata(blob)
    assert meta["fingerprint"] == loaded.fingerprint and json.loads(meta["extra"]) == {"stream_hash": "abc"}
    assert meta["dtype"] == "float32" and meta["format_version"] == "1"
    assert state.to_bytes(fingerprint=loaded.fingerprint, extra={"stream_hash": "abc"}) == blob


def test_flipped_byte_in_payload_fails_checksum(loaded, blob):
    bad = bytearray(blob)
    bad[-100] ^= 0x01
    with pytest.raises(StateCorruptError, match="checksum"):
        RecurrentState.from_bytes(bytes(bad), fingerprint=loaded.fingerprint)


@pytest.mark.parametrize("cut", [0, 5, 200, -1], ids=["empty", "in-length", "in-header", "last-byte"])
def test_truncated_bytes_are_corrupt(blob, cut):
    with pytest.raises(StateCorruptError, match="replay the transcript"):
        RecurrentState.from_bytes(blob[:cut])


def test_not_a_state(tmp_path):
    path = tmp_path / "x.safetensors"
    save_file({"gla": torch.zeros(1)}, str(path))
    with pytest.raises(StateCorruptError, match="not a laplace state"):
        RecurrentState.from_bytes(path.read_bytes())


def test_other_model_is_refused(loaded, blob):
    other = load_model("tiny", seed=1)
    assert other.fingerprint != loaded.fingerprint
    with pytest.raises(StateModelMismatchError, match="written by model"):
        RecurrentState.from_bytes(blob, fingerprint=other.fingerprint)
    with pytest.raises(StateModelMismatchError, match="does not fit"):
        RecurrentState.from_bytes(blob, config=PRESETS["laplace-small"])


def test_model_dir_round_trip_and_fingerprint(loaded, tmp_path):
    save_model_dir(loaded, tmp_path / "m", card={"name": "t"})
    again = load_model_dir(tmp_path / "m")
    assert again.fingerprint == loaded.fingerprint
    ids = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(again.model(ids)[0], loaded.model(ids)[0])
    assert load_model(str(tmp_path / "m")).card == {"name": "t"}


def _break(tmp_path, loaded, how):
    d = save_model_dir(loaded, tmp_path / "m")
    st = load_file(str(d / "model.safetensors"))
    if how == "missing-file":
        (d / "tokenizer.json").unlink()
    elif how == "missing-tensor":
        st.pop("norm.weight")
        save_file(st, str(d / "model.safetensors"))
    elif how == "extra-tensor":
        st["bogus"] = torch.zeros(2)
        save_file(st, str(d / "model.safetensors"))
    elif how == "mis-shaped":
        st["embed.weight"] = torch.zeros(3, 3)
        save_file(st, str(d / "model.safetensors"))
    elif how == "truncated-weights":
        raw = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    elif how == "bad-config":
        (d / "config.json").write_text("{not json")
    elif how == "future-version":
        meta = json.loads((d / "config.json").read_text())
        meta["format_version"] = 99
        (d / "config.json").write_text(json.dumps(meta))
    return d


@pytest.mark.parametrize(
    "how,match",
    [
        ("missing-file", "missing tokenizer.json"),
        ("missing-tensor", "missing tensors"),
        ("extra-tensor", "unexpected tensors"),
        ("mis-shaped", "mis-shaped embed.weight"),
        ("truncated-weights", "unreadable"),
        ("bad-config", "not valid JSON"),
        ("future-version", "upgrade laplace"),
    ],
)
def test_broken_model_dirs_fail_clearly(loaded, tmp_path, how, match):
    d = _break(tmp_path, loaded, how)
    with pytest.raises(ModelLoadError, match=match):
        load_model_dir(d)


def test_unknown_model_name_lists_known(tmp_path):
    with pytest.raises(ModelLoadError, match="tiny"):
        load_model("no-such-model", models_dir=tmp_path)
    with pytest.raises(ModelLoadError, match="has no weights"):
        load_model("laplace-3b")


# ---- named tensors: old blobs still load; a window model's state round-trips ------------

V1_BLOB = Path(__file__).parent / "data" / "state_v1_tiny.laplace-state"


def test_a_version_1_blob_written_before_named_tensors_still_loads():
    """tests/runtime/data/state_v1_tiny.laplace-state was written by the gla/conv-only code
    (the tiny preset after 40 tokens); it loads, matches a recomputation, and re-serializes
    to the very same bytes (so stored sessions keep their checksums)."""
    lm = load_model("tiny")
    blob = V1_BLOB.read_bytes()
    state = RecurrentState.from_bytes(blob, config=lm.config, fingerprint=lm.fingerprint)
    assert state.names == ["gla", "conv"] and state.n_tokens == 40
    assert read_state_metadata(blob)["format_version"] == "1"
    _, fresh = lm.model(torch.arange(40).view(1, 40) * 5 % 250)
    torch.testing.assert_close(state.gla, fresh.gla, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(state.conv, fresh.conv, rtol=1e-5, atol=1e-6)
    again = state.to_bytes(fingerprint=lm.fingerprint, extra={"kind": "v1-fixture"}, architecture=lm.config.architecture())
    assert again == blob


def test_window_state_round_trips_with_its_positions():
    from tests.runtime.test_window import window_model

    model = window_model()
    _, state = model(torch.randint(0, 64, (2, 20)))
    blob = state.to_bytes(fingerprint="fp", architecture=model.config.architecture())
    meta = read_state_metadata(blob)
    assert meta["format_version"] == "3" and meta["layout"].startswith("win_k[2,2,2,10,8]+win_v[2,2,2,10,8]+gla[")
    back = RecurrentState.from_bytes(blob, config=model.config, fingerprint="fp")
    assert back.names == state.names and back.pos.dtype == torch.int64 and back.pos.tolist() == [[20, 20]]
    assert all(torch.equal(back.tensors[n], state.tensors[n]) for n in state.names)
    assert back.to_bytes(fingerprint="fp", architecture=model.config.architecture()) == blob
    with pytest.raises(StateModelMismatchError, match="written by a window"):
        RecurrentState.from_bytes(blob, config=model.config.replace(window=8))
    with pytest.raises(StateModelMismatchError, match="does not fit"):  # a blob without the architecture: the shapes decide
        RecurrentState.from_bytes(state.to_bytes(fingerprint="fp"), config=PRESETS["tiny"])
    bad = bytearray(blob)
    bad[-3] ^= 0x01  # inside pos, the last tensor written
    with pytest.raises(StateCorruptError, match="checksum"):
        RecurrentState.from_bytes(bytes(bad))


V2_WINDOW_BLOB = Path(__file__).parent / "data" / "state_v2_window.laplace-state"


def test_a_version_2_window_state_with_unrotated_keys_loads_rotated():
    """tests/runtime/data/state_v2_window.laplace-state was written by the code that kept
    the ring's keys un-rotated (window_model(combine="softmax") after 23 tokens, seed 12):
    it loads as the state today's code computes for those tokens (keys rotated to their
    slots), and decoding on from it gives the logits of decoding on from a fresh prefill."""
    from tests.runtime.test_window import window_model

    model = window_model(combine="softmax")
    blob = V2_WINDOW_BLOB.read_bytes()
    assert read_state_metadata(blob)["format_version"] == "2"
    ids = torch.randint(0, 64, (1, 23), generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        _, fresh = model(ids)
        old = RecurrentState.from_bytes(blob, config=model.config, fingerprint="fp")
        assert old.names == fresh.names and old.n_tokens == 23
        assert old.max_abs_diff(fresh) < 1e-5
        raw = RecurrentState.from_bytes(blob.replace(b'"format_version":"2"', b'"format_version":"3"'))
        assert raw.max_abs_diff(fresh) > 1e-2  # the conversion is not vacuous: un-rotated keys differ
        want = model(torch.tensor([[3, 4]]), fresh)[0]
        got = model(torch.tensor([[3, 4]]), old)[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(StateModelMismatchError, match="needs its model's config"):
        RecurrentState.from_bytes(blob)


def test_the_host_count_and_the_positions_must_agree():
    from tests.runtime.test_window import window_model

    model = window_model()
    with torch.no_grad():
        _, state = model(torch.randint(0, 64, (1, 9)))
    assert state.n_tokens == int(state.pos) == 9
    state.n_tokens = 8  # a caller that counted one token too few
    with pytest.raises(StateCorruptError, match="read 9 tokens but its host count is 8"):
        state.to_bytes(fingerprint="fp")
