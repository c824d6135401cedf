"""`laplace info` and `laplace bench` from the command line: exit codes and output."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli import app

runner = CliRunner()


def test_info_3b_json_has_the_published_numbers():
    res = runner.invoke(app, ["info", "-m", "laplace-3b", "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["muon_parameters"] == 2_717_908_992
    assert data["state_bytes"] == 29_491_200
    assert data["kv_cache_bytes_8k"] == 2_415_919_104
    assert f"{data['parameters'] / 1e9:.3f}" == "3.028"


def test_info_text_output():
    res = runner.invoke(app, ["info", "-m", "laplace-3b"])
    assert res.exit_code == 0
    assert "3.028 B" in res.stdout and "29,491,200 bytes" in res.stdout and "81.9x" in res.stdout


def test_info_reads_a_model_directory(tmp_path):
    from agent.runtime.checkpoint import load_model, save_model_dir

    save_model_dir(load_model("tiny"), tmp_path / "m", card={"name": "my-tiny", "data": "none"})
    res = runner.invoke(app, ["info", "-m", str(tmp_path / "m"), "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["name"] == "my-tiny" and data["card"]["data"] == "none"


def test_info_bad_inputs_are_one_line_errors(tmp_path):
    for args, needle in [
        (["info", "-m", "nope"], "no model named 'nope'"),
        (["info", "-m", str(tmp_path / "missing-dir")], "does not exist"),
        (["info", "-m", "tiny", "--device", "tpu"], "unknown device"),
    ]:
        res = runner.invoke(app, args)
        assert res.exit_code == 1
        assert needle in res.stderr and res.stderr.count("\n") == 1


def test_bench_lists_and_rejects_unknown_names():
    res = runner.invoke(app, ["bench", "--list"])
    assert res.exit_code == 0 and {"kernel", "decode", "batch", "memory", "store", "train", "tui", "cpu1b"} <= set(res.stdout.split())
    res = runner.invoke(app, ["bench", "warp-drive"])
    assert res.exit_code == 1 and "unknown benchmark warp-drive" in res.stderr


def _model_dir(tmp_path):
    from agent.runtime.checkpoint import load_model, save_model_dir

    return save_model_dir(load_model("tiny"), tmp_path / "m")


def _damage_truncate(d):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _damage_other_shape(d):
    from agent.runtime.checkpoint import save_model_dir
    from agent.runtime.checkpoint import load_model as load
    from agent.runtime.config import PRESETS

    small = load("tiny")
    other = save_model_dir(small, d.parent / "other")
    (d / "model.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    cfg = json.loads((d / "config.json").read_text())
    cfg["model"]["d_model"] = PRESETS["tiny"].d_model * 2
    (d / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("damage, needle", [
    (_damage_truncate, "model.safetensors is unreadable"),
    (lambda d: (d / "tokenizer.json").unlink(), "is missing tokenizer.json"),
    (_damage_other_shape, "does not match config.json"),
    (lambda d: (d / "tokenizer.json").write_text("not a tokenizer"), "tokenizer or chat template"),
    (lambda d: (d / "chat_template.json").write_text("{}"), "tokenizer or chat template"),
], ids=["truncated-weights", "missing-tokenizer", "weights-of-another-shape", "garbage-tokenizer", "garbage-template"])
def test_info_refuses_a_model_directory_that_would_not_load(tmp_path, damage, needle):
    d = _model_dir(tmp_path)
    damage(d)
    res = runner.invoke(app, ["info", "-m", str(d)])
    assert res.exit_code == 1, res.output
    assert needle in res.stderr and res.stderr.count("\n") == 1 and "Traceback" not in res.output


@pytest.mark.parametrize("command", [["info"], ["ask", "hi"]], ids=lambda c: c[0])
def test_a_file_given_as_model_says_so(tmp_path, monkeypatch, command):
    d = _model_dir(tmp_path)
    for arg, needle in [(str(d / "config.json"), f"is a file, not a model directory; pass its directory: -m {d}"),
                        (str(tmp_path / "notes.txt"), "pass the directory that holds config.json")]:
        (tmp_path / "notes.txt").write_text("x")
        res = runner.invoke(app, [command[0], "-m", arg, *command[1:]])
        assert res.exit_code == 1, res.output
        assert needle in res.stderr and res.stderr.count("\n") == 1 and "does not exist" not in res.stderr
    monkeypatch.chdir(tmp_path)  # a bare name that is a file here, not a model name
    res = runner.invoke(app, [command[0], "-m", "notes.txt", *command[1:]])
    assert res.exit_code == 1 and "notes.txt is a file, not a model directory" in res.stderr


HEAVY = {"textual", "uvicorn", "starlette", "fastapi", "transformers", "httpx"}


def modules_after_command(args: list[str], home) -> set[str]:  # type: ignore[no-untyped-def]
    """The top-level modules a real `laplace ARGS` process imported (run in a fresh interpreter)."""
    import os
    import subprocess
    import sys

    code = ("import sys, atexit; atexit.register(lambda: print('MODULES', ' '.join(sorted(sys.modules)), file=sys.stderr)); "
            "from agent.cli import main; sys.argv = ['laplace', *sys.argv[1:]]; main()")
    env = {**os.environ, "LAPLACE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stderr.splitlines() if ln.startswith("MODULES "))
    return set(line.split()[1:])


def test_info_and_sessions_import_only_what_they_use(tmp_path):
    """`laplace info` needs torch but no UI, server or transformers, and no torch._dynamo
    (building the meta model imported it: 1-2 s); `laplace sessions list` needs no torch."""
    info = modules_after_command(["info", "-m", "tiny"], tmp_path)
    assert "torch" in info
    assert not {m for m in info if m.split(".")[0] in HEAVY} and "torch._dynamo" not in info
    listing = modules_after_command(["sessions", "list"], tmp_path)
    assert not {m for m in listing if m.split(".")[0] in HEAVY | {"torch", "tokenizers"}}
