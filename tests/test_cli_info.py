"""`laplace info` and `laplace bench` from the command line: exit codes and output."""

from __future__ import annotations

import json

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
