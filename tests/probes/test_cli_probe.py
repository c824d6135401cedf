"""`laplace probe` commands: run, compare, session (read-only, byte-identical database)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.probes.engine import advance
from sessions import SessionStore, StateMeta

runner = CliRunner()


def _invoke(home: Path, *args: str):  # type: ignore[no-untyped-def]
    return runner.invoke(app, ["probe", *args], env={"LAPLACE_HOME": str(home), "LAPLACE_DEVICE": "cpu"})


def _one_error_line(result) -> None:  # type: ignore[no-untyped-def]
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    lines = [ln for ln in result.output.splitlines() if ln.strip()]
    assert lines[-1].startswith("error: ")


def test_run_smoke_writes_json_plot_and_a_probe_run(tmp_path):
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    r = _invoke(tmp_path, "run", "-m", "tiny", "--suite", "smoke", "--threads", "1", "--json", str(out), "--plot", str(png))
    assert r.exit_code == 0, r.output
    assert "passkey / grammar" in r.output and "stored probe run" in r.output
    report = json.loads(out.read_text())
    assert report["schema_version"] == 1 and report["suite"]["name"] == "smoke"
    # No --style given: the model's chat template picks chat prompts (completion prompts
    # score 0% everywhere on a chat model such as the bundled default).
    assert report["suite"]["style"] == "chat" and "chat prompts" in r.output
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    with SessionStore.open(tmp_path / "laplace.db", readonly=True) as store:
        runs = store.browse.list_probe_runs()
    assert len(runs) == 1 and runs[0].kind == "smoke" and runs[0].payload["cells"] == report["cells"]
    # Compare: identical reports pass, a failed self-test fails.
    assert _invoke(tmp_path, "compare", str(out), str(out)).exit_code == 0
    bad = dict(report)
    bad["state_metrics"] = dict(report["state_metrics"], resume=dict(report["state_metrics"]["resume"], passed=False))
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = _invoke(tmp_path, "compare", str(out), str(tmp_path / "bad.json"))
    assert r.exit_code == 1 and "REGRESSION resume" in r.output


@pytest.mark.parametrize("args, message", [
    (["run", "-m", "tiny", "--suite", "huge"], "unknown suite"),
    (["run", "-m", "no-such-model", "--suite", "smoke"], "no model named"),
    (["run", "-m", "tiny", "--suite", "smoke", "--filler", "file:/nonexistent/notes.txt"], "cannot read filler file"),
    (["run", "-m", "tiny", "--suite", "smoke", "--style", "poem"], "unknown prompt style"),
    (["run", "-m", "tiny", "--budget", "-3"], "--budget"),
    (["run", "-m", "tiny", "--suite", "smoke", "--refresh", "maybe"], "unknown --refresh"),
    (["compare", "/nonexistent/a.json", "/nonexistent/b.json"], "cannot read"),
    (["session", "abc", "--ask", "What?"], "no session database"),
])
def test_bad_input_is_one_error_line(tmp_path, args, message):
    r = _invoke(tmp_path, *args)
    _one_error_line(r)
    assert message in r.output


def _digest(db: Path) -> str:
    """The database file's bytes and its WAL's (absent and empty are the same: no frames)."""
    wal = db.with_name(db.name + "-wal")
    return hashlib.sha256(db.read_bytes() + b"|" + (wal.read_bytes() if wal.exists() else b"")).hexdigest()


@pytest.fixture()
def session_db(tmp_path, tiny):
    """A session that heard a locker code, chatted on, and has a user turn after its last state."""
    tok, tpl, m, fp = tiny.tokenizer, tiny.template, tiny.model, tiny.fingerprint
    store = SessionStore.open(tmp_path / "laplace.db")
    sys_ids = tpl.message(tok, "system", "You are helpful.", first=True)
    _, state = advance(m, m.new_state(1), sys_ids)
    s = store.turns.create_session(model_id="tiny", system_prompt="You are helpful.", system_token_ids=sys_ids,
                             state=state.to_bytes(fingerprint=fp), state_meta=StateMeta(model_fingerprint=fp, n_tokens=len(sys_ids)))
    turns = [("My locker code is 48213. Please remember it.", "Noted."), ("Tell me about the weather.", "It is sunny and mild today.")]
    replies = []
    for user, reply in turns:
        u_ids = tpl.message(tok, "user", user)
        store.turns.begin_turn(s.id, role="user", content=user, token_ids=u_ids)
        _, state = advance(m, state, u_ids)
        a = store.turns.begin_turn(s.id, role="assistant")
        r_ids = tpl.reply_prefix(tok) + tok.encode(reply) + tpl.reply_suffix(tok)
        _, state = advance(m, state, r_ids)
        replies.append(a.id)
        store.turns.commit_turn(a.id, content=reply, token_ids=r_ids, state=state.to_bytes(fingerprint=fp),
                          state_meta=StateMeta(model_fingerprint=fp, n_tokens=state.n_tokens))
    store.turns.begin_turn(s.id, role="user", content="One more thing.", token_ids=tpl.message(tok, "user", "One more thing."))
    store.close()
    return tmp_path, s.uid, replies[0]


def test_session_check_is_read_only_and_reports_a_verdict(session_db):
    home, uid, first_reply = session_db
    db = home / "laplace.db"
    before = _digest(db)
    r = _invoke(home, "session", uid[:8], "--ask", "What is my locker code?", "--expect", "48213", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["verdict"] in {"REMEMBERED", "WEAK", "FORGOTTEN", "UNDETERMINED"}
    assert d["n_candidates"] == 20 and 1 <= d["rank"] <= 20
    assert d["mention"]["turns_since"] == 4  # assistant, user, assistant, user (the head)
    assert d["mention"]["tokens_since"] > 0
    assert 0 < d["retention"]["slowest"]["retained"] < 1
    assert d["bytes_unchanged"] and d["database_unchanged"]
    assert _digest(db) == before
    # An untrained model cannot remember: never REMEMBERED.
    assert d["verdict"] != "REMEMBERED"
    # At an earlier turn, from that turn's own snapshot: the mention is one turn back.
    r = _invoke(home, "session", uid, "--ask", "What is my locker code?", "--expect", "48213", "--turn", str(first_reply), "--json")
    assert r.exit_code == 0, r.output
    early = json.loads(r.output)
    assert early["mention"]["turns_since"] == 1 and early["state_tokens"] < d["state_tokens"]
    # Without --expect it prints the model's answer from the copy.
    r = _invoke(home, "session", uid, "--ask", "What is my locker code?")
    assert r.exit_code == 0, r.output
    assert "answer" in r.output and "database unchanged" in r.output
    assert _digest(db) == before


@pytest.mark.parametrize("args, message", [
    (["session", "ffffffff", "--ask", "Q?"], "no session"),
    (["--expect", "  "], "--expect must not be empty"),
    (["--turn", "999999"], "999999"),
])
def test_session_bad_input(session_db, args, message):
    home, uid, _ = session_db
    full = args if args[0] == "session" else ["session", uid, "--ask", "Q?", *args]
    r = _invoke(home, *full)
    _one_error_line(r)
    assert message.lower() in r.output.lower()


def test_verdicts_follow_rank_lift_and_the_blank_control():
    from agent.recall.verdicts import judge

    def verdict(rank=1, lift=3.0, blank_rank=9, said=False, n=20):  # type: ignore[no-untyped-def]
        return judge(said=said, rank=rank, n_candidates=n, lift=lift, blank_rank=blank_rank)[0]

    assert verdict(said=True, rank=4, lift=0.0) == "REMEMBERED"
    assert verdict() == "REMEMBERED"
    assert verdict(rank=1, lift=0.2) == "WEAK"
    assert verdict(rank=9, lift=1.5) == "WEAK"
    assert verdict(rank=9, lift=0.1) == "FORGOTTEN"
    assert verdict(blank_rank=1) == "UNDETERMINED"
    assert verdict(n=3) == "UNDETERMINED"


def test_find_mention_counts_tokens_after_the_last_occurrence():
    from agent.probes.session_check import find_mention

    assert find_mention([1, 2, 3, 9, 2, 3, 7, 7], [[2, 3]]) == 2
    assert find_mention([1, 2, 3], [[5]]) is None


def test_session_with_an_unparsable_state_names_rebuild_state(session_db):
    import hashlib
    import sqlite3

    home, uid, _ = session_db
    bad = b"\x10\x00\x00\x00\x00\x00\x00\x00" + b"{}".ljust(16) + b"junk"
    conn = sqlite3.connect(home / "laplace.db")
    conn.execute("UPDATE snapshot_data SET data = ?", [bad])
    conn.execute("UPDATE state_snapshots SET sha256 = ?, byte_size = ?", [hashlib.sha256(bad).hexdigest(), len(bad)])
    conn.commit()
    conn.close()
    r = _invoke(home, "session", uid, "--ask", "Q?")
    _one_error_line(r)
    assert "not a laplace state" in r.output and f"--session {uid[:8]} --rebuild-state" in r.output
