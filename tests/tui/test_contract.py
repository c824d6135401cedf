"""The same TUI flows against the fake service and the real one (tiny preset, real SQLite).

The fake exists so UI tests are fast; this test keeps it honest. Every flow asserts what
the user sees (the turns in the view) and where the service says we are, and both services
must give the same answers. A fake that edits in place where the real service starts a new
session (as `/system` once did) fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest
from textual.pilot import Pilot

from agent.chat.types import ChatServiceProtocol
from agent.tui.app import LaplaceApp

from .fake_service import FakeChatService
from .helpers import idle, run, type_and_send


def _fake(tmp_path: Path) -> Iterator[ChatServiceProtocol]:
    yield FakeChatService(token_delay=0)


def _real(tmp_path: Path) -> Iterator[ChatServiceProtocol]:
    from agent.chat.service import ChatService
    from agent.runtime.checkpoint import load_model
    from agent.runtime.generation import EagerRunner
    from sessions import SessionStore

    lm = load_model("tiny")
    store = SessionStore.open(tmp_path / "laplace.db")
    service = ChatService(store, lm, model_id="tiny", runner=EagerRunner(lm.model, segment_len=32),
                          options={"temperature": 0.8, "seed": 1, "max_new_tokens": 6})
    try:
        yield service
    finally:
        service.close()
        store.close()


SERVICES: dict[str, Callable[[Path], Iterator[ChatServiceProtocol]]] = {"fake": _fake, "real": _real}


@pytest.fixture(params=sorted(SERVICES))
def service(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ChatServiceProtocol]:
    yield from SERVICES[request.param](tmp_path)


def shown(app: LaplaceApp) -> list[tuple[str, str]]:
    """The conversation the view shows: (role, status) of each turn, the root system turn
    left out (the real service shows it, the fake has none; its text is checked apart)."""
    return [(w.turn.role, w.turn.status) for w in app.chat.turn_widgets if w.turn.role != "system"]


def test_tui_flows_agree_on_fake_and_real_service(service: ChatServiceProtocol) -> None:
    seen: dict[str, object] = {}

    async def scenario(app: LaplaceApp, pilot: Pilot) -> None:
        first = service.session
        assert first is not None and shown(app) == []
        await type_and_send(app, pilot, "hello there")
        await idle(app, pilot)
        assert shown(app) == [("user", "complete"), ("assistant", "complete")]
        assert app.chat.turn_widgets[-1].turn.content == service.tail(1)[-1].content

        await pilot.press("ctrl+r")  # regenerate: a second version of the reply
        await idle(app, pilot)
        assert shown(app) == [("user", "complete"), ("assistant", "complete")]
        assert app.chat.turn_widgets[-1].turn.sibling_count == 2

        await type_and_send(app, pilot, "/rename project x")
        assert service.session is not None and service.session.name == "project x"

        # /system starts a new session: the view must leave the old transcript behind.
        await type_and_send(app, pilot, "/system Be brief.")
        await idle(app, pilot)
        now = service.session
        assert now is not None and now.uid != first.uid and now.system_prompt == "Be brief."
        assert shown(app) == []
        old = next(s for s in service.list_sessions() if s.uid == first.uid)
        assert old.name == "project x" and old.turns == 2 and old.system_prompt == ""
        await type_and_send(app, pilot, "second session")
        await idle(app, pilot)
        assert shown(app) == [("user", "complete"), ("assistant", "complete")]

        await type_and_send(app, pilot, "/fork")
        await idle(app, pilot)
        forked = service.session
        assert forked is not None and forked.uid != now.uid and forked.system_prompt == "Be brief."
        assert shown(app) == [("user", "complete"), ("assistant", "complete")]

        await type_and_send(app, pilot, "/new scratch")
        await idle(app, pilot)
        assert service.session is not None and service.session.name == "scratch" and shown(app) == []

        # Back to the first session through the service, as the sessions panel does.
        await app.actions.switch_to(lambda: service.resume(first.uid), "switched to")
        assert shown(app) == [("user", "complete"), ("assistant", "complete")]
        seen["sessions"] = len(service.list_sessions())

    run(scenario, service)  # type: ignore[arg-type]
    assert seen["sessions"] == 4  # first, the /system one, its fork, scratch
