"""`laplace import` of a Llama GGUF from the command line: window options, what it prints,
info's state split, a chat that resumes from the stored (version 2) state, and refusals
that are one line, exit 1, nothing written."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.cli.chat import join_option_pairs
from agent.settings import Settings
from tests.importers.helpers import llamba_checkpoint
from tests.importers.llama_helpers import llama_gguf

runner = CliRunner()


def laplace(*args: str):
    return runner.invoke(app, join_option_pairs(list(args)))


def leftovers() -> list[str]:
    d = Settings.from_env().models_dir
    return sorted(p.name for p in d.iterdir()) if d.exists() else []


@pytest.fixture(scope="module")
def gguf_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    llama_gguf(path)
    return path


def test_import_gguf_then_info_and_a_resumed_chat(gguf_path):
    res = laplace("import", str(gguf_path), "--out", "smol", "--window", "16", "--sinks", "2", "--combine", "gated")
    assert res.exit_code == 0, res.output
    assert "window 16 + 2 sinks, GLA branch gated" in res.stdout and "laplace chat -m smol" in res.stdout

    res = laplace("info", "-m", "smol", "--json")
    assert res.exit_code == 0, res.output
    info = json.loads(res.stdout)
    c, parts = info["config"], info["state_parts"]
    assert c["mixer"] == "window" and c["window"] == 16 and c["sinks"] == 2 and c["combine"] == "gated"
    assert parts["win_k"] == parts["win_v"] == 2 * 2 * 18 * 16 * 4 and parts["gla"] == 2 * 4 * 32 * 17 * 4 and parts["pos"] == 8
    assert info["state_bytes"] == sum(parts.values())
    text = laplace("info", "-m", "smol").stdout
    assert f"window {2 * parts['win_k']:,} + GLA {parts['gla']:,} + positions 8" in text

    res = laplace("ask", "-m", "smol", "-o", "max_new_tokens", "20", "-o", "temperature", "0", "hello there, " * 4)
    assert res.exit_code == 0, res.output
    res = laplace("ask", "-c", "-o", "max_new_tokens", "5", "again")  # resume: the stored window state loads
    assert res.exit_code == 0, res.output


def test_import_with_a_memory_of_two_sizes_and_info_names_both(gguf_path):
    """--memory-layers with --memory-rest: 8 slots in layer 1, 3 in the others; info says so
    and counts both groups' bytes as the memory's."""
    res = laplace("import", str(gguf_path), "--out", "two", "--window", "16", "--memory", "8", "--memory-policy", "novelty",
                  "--memory-layers", "1", "--memory-rest", "3", "--memory-distance", "40", "--memory-rest-distance", "20")
    assert res.exit_code == 0, res.output
    info = json.loads(laplace("info", "-m", "two", "--json").stdout)
    c, parts = info["config"], info["state_parts"]
    assert c["memory_layers"] == [1] and c["memory_rest_slots"] == 3 and c["memory_distance"] == 40 and c["memory_rest_distance"] == 20
    assert parts["mem_k"] * 3 == parts["rest_k"] * 8 * (c["n_layers"] - 1)  # 8 slots in one layer, 3 in each other
    text = laplace("info", "-m", "two").stdout
    held = sum(v for n, v in parts.items() if n.startswith(("mem_", "rest_")))
    assert (f"memory of evicted tokens per kv head: 8 slots (novelty) in 1 of {c['n_layers']} layers (1), read at distance 40, "
            f"and 3 in the other {c['n_layers'] - 1}, read at distance 20") in text
    assert f"+ memory {held:,} +" in text


@pytest.mark.parametrize("case", ["other-arch", "unsupported-quant", "not-gguf-file", "window-on-mamba", "bad-combine",
                                  "bad-memory-policy", "rest-without-layers", "negative-memory-distance",
                                  "rest-distance-without-rest"])
def test_refusals_are_one_line_exit_1_nothing_written(tmp_path, case):
    args = []
    if case == "other-arch":
        src = tmp_path / "q.gguf"
        llama_gguf(src, arch="qwen2")
        needle = "laplace imports the llama architecture only"
    elif case == "unsupported-quant":
        src = tmp_path / "q.gguf"
        llama_gguf(src, quant="Q5_0")
        needle = "is Q5_0; laplace reads F32, F16, BF16, Q8_0, Q4_0, Q4_1 GGUFs only"
    elif case == "not-gguf-file":
        src = tmp_path / "weights.bin"
        src.write_bytes(b"x" * 100)
        needle = "it is a file, not a .gguf"
    elif case == "window-on-mamba":
        src = tmp_path / "ckpt"
        llamba_checkpoint(src)
        args = ["--window", "64"]
        needle = "window options apply to Llama checkpoints; this one is llamba"
    elif case == "bad-memory-policy":
        src = tmp_path / "q.gguf"
        llama_gguf(src)
        args = ["--memory", "8", "--memory-policy", "lru"]
        needle = "--memory-policy takes recall, attention, novelty, not 'lru'"
    elif case == "negative-memory-distance":
        src = tmp_path / "q.gguf"
        llama_gguf(src)
        args = ["--memory", "8", "--memory-policy", "novelty", "--memory-distance", "-1"]
        needle = "--memory-distance must be 0 or more, not -1"
    elif case == "rest-distance-without-rest":
        src = tmp_path / "q.gguf"
        llama_gguf(src)
        args = ["--memory", "8", "--memory-policy", "novelty", "--memory-layers", "1", "--memory-rest-distance", "20"]
        needle = "--memory-rest-distance is where the layers --memory-layers leaves out read their memory; give --memory-rest too"
    elif case == "rest-without-layers":
        src = tmp_path / "q.gguf"
        llama_gguf(src)
        args = ["--memory", "8", "--memory-policy", "novelty", "--memory-rest", "4"]
        needle = "--memory-rest keeps a memory in the layers --memory-layers leaves out; give --memory-layers too"
    else:
        src = tmp_path / "q.gguf"
        llama_gguf(src)
        args = ["--combine", "sum"]
        needle = "--combine takes softmax or gated"
    before = leftovers()
    res = laplace("import", str(src), "--out", "m", *args)
    assert res.exit_code == 1, res.output
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and needle in errors[0], res.stderr
    assert "Traceback" not in res.output
    assert leftovers() == before
    partial = Settings.from_env().home / "partial"
    assert not partial.exists() or not any(partial.iterdir())
