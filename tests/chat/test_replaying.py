"""`replay.Replaying` is what recovery and replay use of a service; both implementers
(`ChatService` and the server's `TurnWriter`) must satisfy it under the same public names,
or a rebuild through one of them fails with AttributeError."""

from __future__ import annotations

from agent.chat.recovery import rebuild
from agent.chat.replay import Replaying

import torch

from .test_chat_service import replayed, run


def test_both_implementers_satisfy_the_protocol(make_service):
    svc = make_service()
    assert isinstance(svc, Replaying)
    assert isinstance(svc.writer, Replaying)


def test_a_rebuild_runs_through_the_turn_writer(make_service):
    svc = make_service()
    svc.new_session(system="be brief")
    run(svc.send("hello there"))
    session = svc._require()
    steps = rebuild(svc.writer, session, None)
    try:
        while True:
            next(steps)
    except StopIteration as done:
        state = done.value
    assert state is not None
    ref = replayed(svc)
    assert state.n_tokens == ref.n_tokens
    torch.testing.assert_close(state.gla, ref.gla, rtol=1e-5, atol=1e-6)
