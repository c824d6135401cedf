"""`laplace import` / `laplace pull` from the CLI: the imported model works everywhere a
model does, and every bad input is one clear line, exit 1, nothing half-written."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.settings import Settings
from tests.importers.helpers import llamba_checkpoint, write_tokenizer

runner = CliRunner()


def laplace(*args: str):
    return runner.invoke(app, list(args))


def models_dir():
    return Settings.from_env().models_dir


def leftovers() -> list[str]:
    d = models_dir()
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture()
def ckpt(tmp_path):
    llamba_checkpoint(tmp_path / "ckpt")
    return tmp_path / "ckpt"


def test_import_then_ask_probe_info_finetune(ckpt, tmp_path) -> None:
    res = laplace("import", str(ckpt), "--out", "lb")
    assert res.exit_code == 0, res.output
    assert "imported" in res.stdout and "laplace chat -m lb" in res.stdout
    assert (models_dir() / "lb" / "model.safetensors").is_file()

    res = laplace("ask", "-m", "lb", "-o", "max_new_tokens", "5", "-o", "temperature", "0", "hello there")
    assert res.exit_code == 0, res.output
    res = laplace("ask", "-c", "-o", "max_new_tokens", "3", "again")  # resume: the stored state loads
    assert res.exit_code == 0, res.output

    res = laplace("info", "-m", "lb", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    assert info["config"]["mixer"] == "ssd" and info["card"]["family"] == "llamba"

    res = laplace("probe", "run", "-m", "lb", "--suite", "smoke", "--no-record", "--json", str(tmp_path / "p.json"))
    assert res.exit_code == 0, res.output
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["cells"] and report["state_metrics"]["resume"]["passed"] is True

    res = laplace("bench", "cpu1b", "-m", "lb", "--out", str(tmp_path / "b.json"))
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "b.json").read_text())["results"]["cpu1b"]["rows"]
    assert [r["weights"] for r in rows] == ["fp32", "int8"] and all(r["tokens_per_s"] > 0 for r in rows)
    assert laplace("bench", "decode", "-m", "lb").exit_code == 1

    data = tmp_path / "d.txt"
    data.write_text("The quick brown fox jumps over the lazy dog. " * 40)
    res = laplace("finetune", str(data), "-m", "lb", "--out", str(tmp_path / "ft"), "--steps", "2", "--seq-len", "32",
                  "--batch-tokens", "64")
    assert res.exit_code == 0, res.output
    assert (tmp_path / "ft" / "model.safetensors").is_file()
    assert "synthesized_parameters" in info["card"]  # fixed at 0 by the import: not counted
    tuned = json.loads(laplace("info", "-m", str(tmp_path / "ft"), "--json").stdout)
    assert "synthesized_parameters" not in tuned["card"] and tuned["parameters"] > info["parameters"]  # trained now


def test_import_check_flags_a_random_model(ckpt) -> None:
    res = laplace("import", str(ckpt), "--out", "rnd", "--check")
    assert res.exit_code == 1
    assert "self-check: perplexity" in res.stdout and "greedy reply" in res.stdout
    assert "self-check failed" in res.stderr and "near chance" in res.stderr


def test_a_state_of_another_architecture_is_refused(ckpt, tmp_path) -> None:
    from agent.runtime.checkpoint import load_model
    from agent.runtime.state import RecurrentState, StateModelMismatchError

    assert laplace("import", str(ckpt), "--out", "lb").exit_code == 0
    lm = load_model("lb", models_dir=models_dir())
    tiny = load_model("tiny")
    blob = tiny.model.new_state().to_bytes(fingerprint="x", architecture=tiny.config.architecture())
    with pytest.raises(StateModelMismatchError, match="gla/L2.*not this ssd"):
        RecurrentState.from_bytes(blob, config=lm.config)


@pytest.mark.parametrize("case", ["missing", "file", "no-config", "unknown-arch", "no-tokenizer", "bad-json",
                                  "truncated-weights", "wrong-shape", "extra-tensor", "exists", "bad-name"])
def test_bad_input_is_one_line_and_writes_nothing(case, ckpt, tmp_path) -> None:
    src, name = str(ckpt), "m"
    if case == "missing":
        src = str(tmp_path / "nope")
    elif case == "file":
        src = str(ckpt / "config.json")
    elif case == "no-config":
        (ckpt / "config.json").unlink()
    elif case == "unknown-arch":
        (ckpt / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    elif case == "no-tokenizer":
        (ckpt / "tokenizer.json").unlink()
    elif case == "bad-json":
        (ckpt / "config.json").write_text("{not json")
    elif case == "truncated-weights":
        w = ckpt / "model.safetensors"
        w.write_bytes(w.read_bytes()[:5000])
    elif case == "wrong-shape":
        cfg = json.loads((ckpt / "config.json").read_text())
        cfg["ssm_cfg"]["d_state"] = 16
        (ckpt / "config.json").write_text(json.dumps(cfg))
    elif case == "extra-tensor":
        from safetensors.torch import load_file, save_file

        t = load_file(str(ckpt / "model.safetensors"))
        t["backbone.layers.0.mixer.mystery"] = t["backbone.layers.0.mixer.D"].clone()
        save_file(t, str(ckpt / "model.safetensors"))
    elif case == "exists":
        assert laplace("import", src, "--out", name).exit_code == 0
    elif case == "bad-name":
        name = "../escape"
    before = leftovers()
    res = laplace("import", src, "--out", name)
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr  # the one line (beside the "converting ..." progress note)
    assert "Traceback" not in res.output
    assert leftovers() == before  # no partial model directory, no temp directory left behind
    expected = {"missing": "does not exist", "file": "it is a file", "no-config": "config.json is missing",
                "unknown-arch": "unknown architecture (gpt2)", "no-tokenizer": "--tokenizer", "bad-json": "not valid JSON",
                "truncated-weights": "download it again", "wrong-shape": "the config and weights do not match", "extra-tensor": "does not use",
                "exists": "already exists", "bad-name": "not usable as a directory name"}[case]
    assert expected in res.stderr


def test_tokenizer_from_another_directory(ckpt, tmp_path) -> None:
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.move(str(ckpt / f), tok_dir / f)
    res = laplace("import", str(ckpt), "--out", "lb", "--tokenizer", str(tok_dir))
    assert res.exit_code == 0, res.output


def test_base_model_without_template_gets_plain_turns(ckpt) -> None:
    write_tokenizer(ckpt, chat_template=None)
    res = laplace("import", str(ckpt), "--out", "base")
    assert res.exit_code == 0, res.output
    tpl = json.loads((models_dir() / "base" / "chat_template.json").read_text())
    assert tpl["source"] == "plain" and tpl["roles"]["user"] == ["User: ", "\n\n"]


def test_pull_without_network_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = laplace("pull", "cartesia-ai/Llamba-1B")
    assert res.exit_code == 1
    assert "cannot download cartesia-ai/Llamba-1B" in res.stderr and "laplace import DIR" in res.stderr
    assert leftovers() == []


def test_pull_rejects_a_malformed_repo_id() -> None:
    res = laplace("pull", "not-a-repo-id")
    assert res.exit_code == 1 and "is not a repo id" in res.stderr


def test_pull_downloads_then_imports(monkeypatch, ckpt) -> None:
    """The hub client is replaced by a copy of a local checkpoint: everything after the
    download (import, cleanup, self-check wiring) runs for real."""
    calls = []

    def fake_snapshot_download(repo_id, *, revision=None, local_dir=None, allow_patterns=None):
        calls.append((repo_id, allow_patterns))
        shutil.copytree(ckpt, local_dir, dirs_exist_ok=True)
        return local_dir

    import huggingface_hub

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    res = laplace("pull", "someone/Tiny-Llamba", "--no-check")
    assert res.exit_code == 0, res.output
    assert calls and calls[0][0] == "someone/Tiny-Llamba" and "*.safetensors" in calls[0][1]
    assert (models_dir() / "tiny-llamba" / "config.json").is_file()
    assert not (Settings.from_env().home / "downloads" / "someone__Tiny-Llamba").exists()  # cleaned after success


def test_recall_horizon_of_an_imported_model_is_measured_from_its_decays(ckpt) -> None:
    from agent.recall.horizon import recall_horizon
    from agent.runtime.checkpoint import load_model

    import torch

    assert laplace("import", str(ckpt), "--out", "lb").exit_code == 0
    lm = load_model("lb", models_dir=models_dir())
    fast, source = recall_horizon(lm)
    assert "measured on 512 tokens" in source
    from agent.probes.session_check import predicted_retention

    assert "measured on 512 tokens" in predicted_retention(lm, 100)["basis"]  # /probe reads the same half-lives
    with torch.no_grad():  # slow every head's decay 10,000-fold: the horizon must follow
        for block in lm.model.blocks:
            block.attn.A_log.fill_(-9.21)
    slow, _ = recall_horizon(lm)
    assert slow > 1000 * max(fast, 1)


def _downloads() -> list[str]:
    root = Settings.from_env().home / "downloads"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")) if root.exists() else []


def test_a_failed_pull_that_got_nothing_leaves_nothing_and_promises_no_resume(monkeypatch) -> None:
    import huggingface_hub

    def offline(repo_id, *, revision=None, local_dir=None, allow_patterns=None):
        raise OSError("network is unreachable")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    res = laplace("pull", "someone/Tiny-Llamba")
    assert res.exit_code == 1 and res.stderr.count("\n") == 1, res.output
    assert "cannot download someone/Tiny-Llamba" in res.stderr and "kept" not in res.stderr and "resume" not in res.stderr
    assert _downloads() == []
    res = laplace("pull", "not-a-repo-id")  # refused before anything is fetched
    assert res.exit_code == 1 and "is not a repo id" in res.stderr and "kept" not in res.stderr
    assert _downloads() == []


def test_a_failed_pull_that_got_part_of_the_files_keeps_them_and_says_so(monkeypatch, ckpt) -> None:
    import huggingface_hub

    def cut_off(repo_id, *, revision=None, local_dir=None, allow_patterns=None):
        shutil.copy(ckpt / "config.json", Path(local_dir) / "config.json")
        raise OSError("connection reset")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", cut_off)
    res = laplace("pull", "someone/Tiny-Llamba")
    assert res.exit_code == 1 and "what was downloaded is kept" in res.stderr and "run the same pull again" in res.stderr
    assert _downloads() == ["someone__Tiny-Llamba", "someone__Tiny-Llamba/config.json"]


def test_info_counts_the_parameters_of_the_checkpoint_not_the_ones_the_import_makes_up(tmp_path) -> None:
    """A Llamba import fills A_log and dt_bias with zeros (its decay is -softplus(a)); they
    are not the checkpoint's parameters, so `info` does not count them (lm_head: untied)."""
    tensors = llamba_checkpoint(tmp_path / "ckpt")
    assert laplace("import", str(tmp_path / "ckpt"), "--out", "lb").exit_code == 0
    info = json.loads(laplace("info", "-m", "lb", "--json").stdout)
    assert info["parameters"] == sum(t.numel() for t in tensors.values())
    assert info["muon_parameters"] + info["adamw_parameters"] == info["parameters"]


def test_a_llamba_config_that_leaves_n_v_heads_to_the_default_is_imported(tmp_path) -> None:
    """cartesia's DiscreteMamba2 defaults n_v_heads (and n_qk_heads) to 32: a config.json
    that leaves them out is still a Llamba."""
    llamba_checkpoint(tmp_path / "ckpt", d_model=64, n_v_heads=32, n_qk_heads=32)
    cfg = json.loads((tmp_path / "ckpt" / "config.json").read_text())
    del cfg["ssm_cfg"]["n_v_heads"], cfg["ssm_cfg"]["n_qk_heads"]
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(cfg))
    res = laplace("import", str(tmp_path / "ckpt"), "--out", "lb")
    assert res.exit_code == 0, res.output
    assert "32 heads" in res.stdout
