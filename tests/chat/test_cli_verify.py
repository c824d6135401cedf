"""`laplace sessions verify`: the deep check, its one-line failures and the way out they name."""

from __future__ import annotations

import hashlib
import sqlite3

import torch

from agent.runtime.checkpoint import load_model
from agent.runtime.state import RecurrentState
from agent.settings import Settings
from sessions import pack_ids

from .test_cli_ask import laplace, store


def one_error_line(res, *words: str) -> None:  # type: ignore[no-untyped-def]
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    lines = [ln for ln in res.stderr.splitlines() if ln.strip() and not ln.startswith("\r")]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for w in words:
        assert w in lines[0], lines[0]


def two_exchanges() -> str:
    assert laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "4", "my code is 48213").exit_code == 0
    assert laplace("ask", "-c", "-o", "max_new_tokens", "4", "and the weather?").exit_code == 0
    with store() as s:
        return s.browse.list_sessions()[0].session.uid


def sql(statement: str, params: list) -> None:  # type: ignore[type-arg]
    conn = sqlite3.connect(Settings.from_env().db_path)
    conn.execute(statement, params)
    conn.commit()
    conn.close()


def test_verify_passes_on_a_healthy_session():
    uid = two_exchanges()
    res = laplace("sessions", "verify", uid[:6])
    assert res.exit_code == 0, res.output
    assert f"session {uid[:8]}: hash chain recomputed over 5 turns" in res.stdout
    res = laplace("sessions", "verify", uid[:6], "--replay")
    assert res.exit_code == 0, res.output
    assert "matches a fresh replay of the transcript" in res.stdout
    one_error_line(laplace("sessions", "verify", "fffff"), "no session matches")


def test_edited_token_ids_fail_verify_and_resume_until_rebuilt():
    uid = two_exchanges()
    with store() as s:
        first_user = s.tree.branch(uid)[1]
    sql("UPDATE turns SET token_ids = ? WHERE id = ?", [pack_ids([100, 101, 102]), first_user.id])
    one_error_line(laplace("sessions", "verify", uid[:8]), f"turn {first_user.id}", "hash chain",
                   f"laplace chat --session {uid[:8]} --rebuild-state")
    # Resume runs the cheap part of the same check and refuses with the same way out.
    one_error_line(laplace("ask", "-c", "x"), "hash chain", "--rebuild-state")
    res = laplace("ask", "-c", "--rebuild-state", "-o", "max_new_tokens", "2", "x")
    assert res.exit_code == 0, res.output
    res = laplace("sessions", "verify", uid[:8], "--replay")
    assert res.exit_code == 0, res.output


def test_rebuild_refuses_token_ids_the_model_does_not_have():
    uid = two_exchanges()
    with store() as s:
        first_user = s.tree.branch(uid)[1]
    sql("UPDATE turns SET token_ids = ? WHERE id = ?", [pack_ids([300, 301, 302]), first_user.id])
    one_error_line(laplace("ask", "-c", "--rebuild-state", "x"), f"turn {first_user.id}",
                   f"laplace sessions fork {uid[:8]} --at {first_user.parent_id}")


def test_a_state_that_differs_from_a_replay_fails_only_the_replay_check():
    uid = two_exchanges()
    lm = load_model("tiny")
    with store() as s:
        snap = s.states.latest(uid)
        state = RecurrentState.from_bytes(s.states.load(snap, expected_fingerprint=lm.fingerprint), config=lm.config,
                                          fingerprint=lm.fingerprint)
    state.gla += 0.5  # consistent bytes, checksum and hashes; wrong numbers
    blob = state.to_bytes(fingerprint=lm.fingerprint)
    sql("UPDATE snapshot_data SET data = ? WHERE snapshot_id = ?", [blob, snap.id])
    sql("UPDATE state_snapshots SET sha256 = ?, byte_size = ? WHERE id = ?",
        [hashlib.sha256(blob).hexdigest(), len(blob), snap.id])
    assert laplace("sessions", "verify", uid[:8]).exit_code == 0  # the hashes cannot see it
    one_error_line(laplace("sessions", "verify", uid[:8], "--replay"), "differs from a fresh replay",
                   f"laplace chat --session {uid[:8]} --rebuild-state")
    res = laplace("ask", "-c", "--rebuild-state", "-o", "max_new_tokens", "2", "x")
    assert res.exit_code == 0 and "replaying transcript" in res.stderr, res.output
    assert laplace("sessions", "verify", uid[:8], "--replay").exit_code == 0


def test_accumulation_order_noise_passes_the_replay_check():
    """Issue 40: every default-model session past the window failed --replay (elementwise
    rtol 1e-4), its deep layers' keys differing by accumulation order. A stored state whose
    rows all differ by 3e-3 of their size (about the default model's worst) passes; the
    check still names a real difference (the test above)."""
    uid = two_exchanges()
    lm = load_model("tiny")
    with store() as s:
        snap = s.states.latest(uid)
        state = RecurrentState.from_bytes(s.states.load(snap, expected_fingerprint=lm.fingerprint), config=lm.config,
                                          fingerprint=lm.fingerprint)
    gen = torch.Generator().manual_seed(0)
    for name, t in state.tensors.items():
        noise = torch.randn(t.shape, generator=gen)
        t += 3e-3 * torch.linalg.vector_norm(t, dim=-1, keepdim=True) * noise / torch.linalg.vector_norm(noise, dim=-1, keepdim=True)
    blob = state.to_bytes(fingerprint=lm.fingerprint)
    sql("UPDATE snapshot_data SET data = ? WHERE snapshot_id = ?", [blob, snap.id])
    sql("UPDATE state_snapshots SET sha256 = ?, byte_size = ? WHERE id = ?",
        [hashlib.sha256(blob).hexdigest(), len(blob), snap.id])
    res = laplace("sessions", "verify", uid[:8], "--replay")
    assert res.exit_code == 0, res.output
    assert "matches a fresh replay" in res.stdout and "accumulation order" in res.stdout


def chain_rows() -> list:  # type: ignore[type-arg]
    conn = sqlite3.connect(Settings.from_env().db_path)
    rows = conn.execute("SELECT id, stream_hash, tokens_total, n_tokens FROM turns ORDER BY id").fetchall()
    rows += conn.execute("SELECT id, turn_id FROM state_snapshots ORDER BY id").fetchall()
    conn.close()
    return rows


def test_a_token_blob_cut_mid_id_is_named_with_the_way_out_and_nothing_is_rewritten():
    uid = two_exchanges()
    with store() as s:
        second_user = s.tree.branch(uid)[3]
    sql("UPDATE turns SET token_ids = substr(token_ids, 1, length(token_ids) - 1) WHERE id = ?", [second_user.id])
    before = chain_rows()
    way_out = f"laplace sessions fork {uid[:8]} --at {second_user.parent_id}"
    one_error_line(laplace("ask", "-c", "--rebuild-state", "x"), f"turn {second_user.id}", way_out)
    assert chain_rows() == before  # the rebuild refused before it rewrote the chain
    one_error_line(laplace("ask", "-c", "x"), f"turn {second_user.id}", way_out)
    one_error_line(laplace("sessions", "verify", uid[:8]), f"turn {second_user.id}", way_out)
    assert chain_rows() == before
    # The way out it names works: the part before the damaged turn, usable at once.
    fork = laplace("sessions", "fork", uid[:8], "--at", str(second_user.parent_id))
    assert fork.exit_code == 0, fork.output
    new = fork.stdout.strip().splitlines()[-1]
    assert laplace("ask", "--session", new[:8], "-o", "max_new_tokens", "2", "x").exit_code == 0
    assert laplace("sessions", "verify", new[:8]).exit_code == 0
