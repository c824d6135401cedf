"""Fixtures for chat-service tests: a real store in a temp dir and the untrained tiny model."""

from __future__ import annotations

import pytest

from agent.chat.service import ChatService
from agent.probes.session_check import check_state
from agent.runtime.checkpoint import load_model
from agent.runtime.generation import EagerRunner
from sessions import SessionStore


@pytest.fixture(scope="session")
def lm():
    return load_model("tiny")


@pytest.fixture
def db_path(tmp_path):
    return tmp_path / "laplace.db"


@pytest.fixture
def make_service(db_path, lm):
    made = []

    def make(model=None, given=None, **opts):
        """A service; `given` replaces the options given at the edge, `opts` adds to them."""
        store = SessionStore.open(db_path)
        options = given if given is not None else {"temperature": 0.8, "seed": 1, "max_new_tokens": 12, **opts}
        m = model or lm
        svc = ChatService(store, m, model_id="tiny", runner=EagerRunner(m.model, segment_len=32), options=options,
                          check=check_state)
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()
        svc.store.close()
