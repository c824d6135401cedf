"""`laplace ask` through the real CLI wiring: exit codes, output and rows written."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from agent.cli import app
from agent.cli.chat import join_option_pairs
from agent.settings import Settings
from sessions import SessionStore

runner = CliRunner()


def laplace(*args: str, input: str | bytes | None = None):
    return runner.invoke(app, list(args), input=input)


def store() -> SessionStore:
    return SessionStore.open(Settings.from_env().db_path)


def test_option_pairs_are_joined():
    assert join_option_pairs(["ask", "-o", "top_k", "5", "-o", "seed=3", "hi"]) == ["ask", "-o", "top_k=5", "-o", "seed=3", "hi"]
    assert join_option_pairs(["ask", "--", "-o", "a", "b"]) == ["ask", "--", "-o", "a", "b"]


def test_ask_streams_persists_and_continues():
    res = laplace("ask", "-m", "tiny", "-s", "be brief", "-o", "max_new_tokens", "6", "-o", "temperature", "0", "hello")
    assert res.exit_code == 0, res.output
    with store() as s:
        [summary] = s.browse.list_sessions()
        assert summary.turns == 2 and summary.session.system_prompt == "be brief"
        reply = s.tree.tail(summary.session.id, 1)[0]
        assert reply.role == "assistant" and reply.status == "complete"
        assert res.stdout == reply.content + "\n"
    res = laplace("ask", "-c", "--json", "again")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["status"] == "complete" and data["session_uid"] == summary.session.uid
    assert data["new_tokens"] == 6  # the session's stored options apply on resume
    with store() as s:
        assert s.browse.summary(summary.session.uid).turns == 4


def test_ask_reads_stdin_and_refuses_bad_bytes():
    res = laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "-", input="from stdin")
    assert res.exit_code == 0, res.output
    with store() as s:
        uid = s.browse.list_sessions()[0].session.uid
        assert s.tree.tail(uid, 2)[0].content == "from stdin"
    res = laplace("ask", "-c", "-", input=b"\xff\xfe not utf-8")
    assert res.exit_code == 1 and "stdin is not UTF-8" in res.stderr


def test_ask_bad_inputs_are_one_line_errors(tmp_path):
    laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "1", "seed session")
    broken = tmp_path / "broken-model"
    broken.mkdir()
    cases = [
        (("ask", "-c", "--session", "abc", "x"), "either -c"),
        (("ask", "--session", "ffffffff", "x"), "no session matches"),
        (("ask", "-m", str(broken), "x"), "is missing config.json"),
        (("ask", "-m", "tiny", "-o", "warp", "9", "x"), "unknown sampling option"),
        (("ask", "-m", "tiny", ""), "prompt is empty"),
        (("ask", "-c", "-s", "new system", "x"), "--system applies to a new session"),
    ]
    for args, needle in cases:
        res = laplace(*args)
        assert res.exit_code == 1, (args, res.output)
        assert needle in res.stderr and res.stderr.strip().count("\n") == 0, (args, res.stderr)
    with store() as s:
        assert [x.turns for x in s.browse.list_sessions()] == [2]  # nothing else written


def test_ask_with_another_model_refuses_then_rebuilds(tmp_path):
    from agent.runtime.checkpoint import load_model, save_model_dir

    laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "hi")
    other = save_model_dir(load_model("tiny", seed=9), tmp_path / "other")
    res = laplace("ask", "-c", "-m", str(other), "x")
    assert res.exit_code == 1 and "another model" in res.stderr and "--rebuild-state" in res.stderr
    res = laplace("ask", "-c", "-m", str(other), "--rebuild-state", "-o", "max_new_tokens", "2", "x")
    assert res.exit_code == 0, res.output
    assert "replaying transcript" in res.stderr


def test_initial_state_starts_sessions_and_guards_resume(tmp_path):
    from agent.runtime.checkpoint import load_model, save_model_dir
    from agent.train.initial_state import save_initial_state

    lm = load_model("tiny")
    model_dir = save_model_dir(lm, tmp_path / "m")
    start = lm.model.new_state(1)
    start.gla.normal_()
    path = save_initial_state(start, tmp_path / "init.laplace-state", fingerprint=lm.fingerprint)
    res = laplace("ask", "-m", str(model_dir), "--initial-state", str(path), "-o", "max_new_tokens", "2", "hi")
    assert res.exit_code == 0, res.output
    res = laplace("ask", "-c", "x")  # without the same initial state the stored state is refused
    assert res.exit_code == 1 and "--initial-state" in res.stderr
    res = laplace("ask", "-c", "--initial-state", str(path), "-o", "max_new_tokens", "2", "x")
    assert res.exit_code == 0, res.output
    res = laplace("ask", "-m", "tiny", "--initial-state", str(tmp_path / "nope"), "x")
    assert res.exit_code == 1 and "does not exist" in res.stderr
    other = save_initial_state(start, tmp_path / "other.laplace-state", fingerprint="f" * 64)
    res = laplace("ask", "-m", str(model_dir), "--initial-state", str(other), "x")
    assert res.exit_code == 1 and "written by model" in res.stderr


def test_export_to_an_unwritable_path_is_a_clean_error(tmp_path):
    laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "1", "hi")
    with store() as s:
        uid = s.browse.list_sessions()[0].session.uid
    res = laplace("sessions", "export", uid[:8], "-f", "json", "-o", str(tmp_path / "no" / "such" / "dir.json"))
    assert res.exit_code == 1 and "cannot write" in res.stderr
    res = laplace("sessions", "export", uid[:8], "-f", "json", "-o", str(tmp_path / "ok.json"))
    assert res.exit_code == 0
    messages = json.loads((tmp_path / "ok.json").read_text())["messages"]
    assert [m["content"] for m in messages if m["role"] == "user"] == ["hi"]


def test_the_bundled_default_model_answers_in_turn():
    """`laplace ask` with no -m uses the packaged default model and ends its turn."""
    res = laplace("ask", "-o", "temperature", "0", "--json", "Hello! How are you?")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["status"] == "complete" and data["reply"].strip()
    with store() as s:
        [summary] = s.browse.list_sessions()
        assert summary.session.model_id == "default"  # a name, not the install path
        reply = s.tree.tail(summary.session.id, 1)[0]
        assert reply.stats["stop_reason"] == "stop"  # it ended its own turn


def test_state_that_fails_to_parse_names_rebuild_state():
    """Bytes that pass the store's checksum but not the runtime's parser (e.g. written by a
    future format) must still tell the user about --rebuild-state."""
    import hashlib
    import sqlite3

    laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "hi")
    bad = b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"{}".ljust(16) + b"junk"
    conn = sqlite3.connect(Settings.from_env().db_path)
    conn.execute("UPDATE snapshot_data SET data = ?", [bad])
    conn.execute("UPDATE state_snapshots SET sha256 = ?, byte_size = ?", [hashlib.sha256(bad).hexdigest(), len(bad)])
    conn.commit()
    conn.close()
    res = laplace("ask", "-c", "x")
    assert res.exit_code == 1 and res.stderr.count("\n") == 1, res.output
    assert "not a laplace state" in res.stderr and "--rebuild-state" in res.stderr
    res = laplace("ask", "-c", "--rebuild-state", "-o", "max_new_tokens", "2", "x")
    assert res.exit_code == 0, res.output


def test_ask_json_reports_a_recall_block_and_refresh_off_suppresses_it():
    res = laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "4", "-o", "refresh_horizon", "20", "My locker code is 48213.")
    assert res.exit_code == 0, res.output
    laplace("ask", "-c", "Tell me about the garden and the river by the old mill, please.")
    data = json.loads(laplace("ask", "-c", "--json", "What is my locker code?").stdout)
    assert "48213" in data["extra"]["recall"]["text"] and data["extra"]["recall"]["tokens"] <= 256
    off = json.loads(laplace("ask", "-c", "--json", "-o", "refresh", "off", "What is my locker code?").stdout)
    assert "recall" not in off["extra"]
    bad = laplace("ask", "-c", "-o", "refresh", "maybe", "hi")
    assert bad.exit_code == 1 and "refresh is on or off" in bad.output and "Traceback" not in bad.output
    with store() as s:
        uid = s.browse.most_recent_session().uid
        kinds = [m.get("kind") for m in s.browse.export_json(uid)["messages"]]
    assert kinds.count("recall") == 1  # only the question with refresh on got a block


def test_ask_json_writes_no_raw_control_character():
    """DEL and the C1 controls (8-bit CSI) in stored text come back escaped, not raw."""
    hostile = "My locker code is 48213.\u009b2J\x7f"
    assert laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "4", "-o", "refresh_horizon", "20", hostile).exit_code == 0
    laplace("ask", "-c", "Tell me about the garden and the river by the old mill, please.")
    res = laplace("ask", "-c", "--json", "What is my locker code?")
    assert res.exit_code == 0, res.output
    assert not any(0x7f <= ord(c) <= 0x9f or (ord(c) < 0x20 and c != "\n") for c in res.stdout), repr(res.stdout)
    assert res.stdout.count("\n") == 1  # still one line
    data = json.loads(res.stdout)
    assert "\u009b2J\x7f" in data["extra"]["recall"]["text"]  # the data is exact
