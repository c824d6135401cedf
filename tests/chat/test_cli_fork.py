"""`laplace sessions fork` at a turn whose states retention pruned: the fork replays its
transcript into a state (with progress) and is usable at once; verify does not pass a
branch that has no state to check."""

from __future__ import annotations

from .test_cli_ask import laplace, store
from .test_cli_verify import one_error_line, sql


def four_exchanges() -> str:
    assert laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "one").exit_code == 0
    for text in ("two", "three", "four"):
        assert laplace("ask", "-c", text).exit_code == 0
    with store() as s:
        return s.browse.list_sessions()[0].session.uid


def test_a_fork_where_every_state_was_pruned_replays_to_its_turn():
    uid = four_exchanges()
    with store() as s:
        turn = s.tree.branch(uid)[3]
        assert s.states.latest(uid, turn.id) is None  # retention kept only the newest three
    res = laplace("sessions", "fork", uid[:8], "--at", str(turn.id))
    assert res.exit_code == 0, res.output
    assert "replaying" in res.stderr and f"turn {turn.id}" in res.stderr
    new = res.stdout.strip()
    with store() as s:
        snap = s.states.latest(new)
        assert snap is not None and snap.n_tokens == turn.tokens_total
        assert s.tree.get_turn(snap.turn_id).depth == turn.depth
    assert laplace("sessions", "verify", new[:8], "--replay").exit_code == 0
    assert laplace("ask", "--session", new[:8], "-o", "max_new_tokens", "2", "hi").exit_code == 0


def test_a_fork_that_cannot_replay_leaves_nothing_behind():
    uid = four_exchanges()
    with store() as s:
        turn = s.tree.branch(uid)[3]
    one_error_line(laplace("sessions", "fork", uid[:8], "--at", str(turn.id), "-m", "no-such-model"), "no-such-model")
    with store() as s:
        assert len(s.browse.list_sessions()) == 1


def test_a_fork_with_a_state_on_its_branch_needs_no_model():
    uid = four_exchanges()
    res = laplace("sessions", "fork", uid[:8], "-m", "no-such-model")  # the head's state is copied: -m is not used
    assert res.exit_code == 0 and "replaying" not in res.stderr, res.output


def test_verify_fails_a_branch_without_a_state():
    uid = four_exchanges()
    sql("DELETE FROM state_snapshots", [])
    one_error_line(laplace("sessions", "verify", uid[:8]), "no stored state", "not verified",
                   f"laplace chat --session {uid[:8]} --rebuild-state")


def test_a_fork_replay_stopped_by_ctrl_c_leaves_nothing_behind(monkeypatch):
    from agent.chat.service import ChatService
    from agent.chat.types import ProgressEvent

    uid = four_exchanges()
    with store() as s:
        turn = s.tree.branch(uid)[3]

    def interrupted(self, cancel=None):  # type: ignore[no-untyped-def]
        yield ProgressEvent("replaying transcript", 1, 10)
        raise KeyboardInterrupt

    monkeypatch.setattr(ChatService, "rebuild_state", interrupted)
    res = laplace("sessions", "fork", uid[:8], "--at", str(turn.id))
    assert res.exit_code != 0
    with store() as s:
        assert len(s.browse.list_sessions()) == 1
