"""A message far longer than a prefill segment: it is folded with progress, and a fold
that was interrupted is done once more on the next open, with progress, then stored."""

from __future__ import annotations

from agent.chat.types import ProgressEvent, TurnStarted

from .test_chat_service import assert_state_matches_transcript, run
from .test_cli_ask import laplace

LONG = "the river runs past the old mill and the garden " * 40  # ~2,000 tokens; segments of 32


def test_a_long_message_is_folded_with_progress_before_the_reply(make_service):
    svc = make_service()
    svc.new_session()
    events = list(svc.send(LONG))
    progress = [e for e in events if isinstance(e, ProgressEvent)]
    started = next(i for i, e in enumerate(events) if isinstance(e, TurnStarted))
    assert len(progress) > 10 and events.index(progress[-1]) < started
    assert progress[-1].done == progress[-1].total >= len(LONG)
    assert [p.done for p in progress] == sorted(p.done for p in progress)
    assert_state_matches_transcript(svc)


def test_an_interrupted_fold_is_folded_once_more_with_progress_then_stored(make_service):
    svc = make_service()
    uid = svc.new_session().uid
    run(svc.send("hello"))
    sending = svc.send(LONG)
    assert isinstance(next(sending), ProgressEvent)
    sending.close()  # quit or Ctrl-C mid-fold: the message is stored, the state never read it
    svc.close()
    head = svc.store.tree.get_turn(svc.store.core.get_session(uid).head_turn_id)
    assert head.role == "user" and svc.store.states.latest(uid).turn_id != head.id

    seen: list[ProgressEvent] = []
    other = make_service()
    other.resume(uid, progress=seen.append)
    assert seen and seen[-1].done == seen[-1].total == head.n_tokens
    assert other.store.states.latest(uid).turn_id == head.id  # folded once: stored
    assert_state_matches_transcript(other)
    other.close()

    again: list[ProgressEvent] = []
    third = make_service()
    third.resume(uid, progress=again.append)
    assert again == []  # the next open loads it
    run(third.send("and then?"))
    assert_state_matches_transcript(third)


def test_ask_shows_the_fold_of_a_long_message():
    res = laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "-", input=LONG * 4)
    assert res.exit_code == 0, res.output
    assert "folding your message" in res.stderr


def test_ask_stopped_mid_fold_says_the_message_is_kept_for_the_next_open(monkeypatch):
    import agent.chat.service as service_module

    real_fold = service_module.fold

    def stopped(runner, ids, state):  # type: ignore[no-untyped-def]
        for i, step in enumerate(real_fold(runner, ids, state)):
            if i == 1:
                raise KeyboardInterrupt
            yield step

    assert laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "hi").exit_code == 0
    monkeypatch.setattr(service_module, "fold", stopped)
    res = laplace("ask", "-c", "-", input=LONG * 4)
    assert res.exit_code == 130 and "your message was saved" in res.stderr and "partial reply" not in res.stderr
    monkeypatch.setattr(service_module, "fold", real_fold)
    res = laplace("ask", "-c", "-o", "max_new_tokens", "2", "and?")
    assert res.exit_code == 0 and "folding turns stored after the last state" in res.stderr, res.output
