"""A real server in the test process: uvicorn on 127.0.0.1 (a free port), the scheduler over
a temp store, an untrained model: `tiny` (a GLA model) or `window` (a tiny random window +
GLA hybrid, the default model's mixer). Clients are real (openai, httpx)."""

from __future__ import annotations

import copy
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch

from agent.chat.turns import TurnWriter
from agent.runtime.checkpoint import LoadedModel, load_model
from agent.runtime.config import LaplaceConfig
from agent.runtime.generation import EagerRunner
from agent.runtime.model import build_model
from agent.runtime.state import RecurrentState
from agent.serve.app import ServerInfo, create_app
from agent.serve.protocol import Limits
from agent.serve.scheduler import Scheduler
from agent.serve.server import bind, make_server
from sessions import SessionStore


@pytest.fixture(scope="session")
def lm() -> LoadedModel:
    return load_model("tiny")


# The default model's mixer at test size: a ring of 4 sinks + 12 recent tokens (so replies
# outrun it) and the GLA branch over what leaves it, grouped keys/values, tied embeddings.
WINDOW = LaplaceConfig(name="tiny-window", vocab_size=264, d_model=32, n_layers=2, n_heads=4, head_k_dim=8,
                       head_v_dim=8, ffn_dim=48, chunk_size=8, norm_eps=1e-5, mixer="window", window=12, sinks=4,
                       gla_branch=True, n_kv_heads=2, tie_embeddings=True, half_life_min=8.0, half_life_max=256.0)


@pytest.fixture(scope="session")
def window(lm) -> LoadedModel:
    """A tiny random window-hybrid model (made here, like the presets' untrained models)."""
    return LoadedModel(build_model(WINDOW, seed=5).eval(), lm.tokenizer, lm.template, name="tiny-window",
                       card={"name": "tiny-window", "trained": False})


@pytest.fixture(scope="session")
def endless(lm) -> LoadedModel:
    """The tiny model with its end-of-turn logit pinned at 0: greedy replies run to max_tokens."""
    other = copy.deepcopy(lm)
    with torch.no_grad():
        other.model.lm_head.weight[other.tokenizer.token_id("<|end|>")] = 0.0
    other._fingerprint = None
    return other


@dataclass
class Running:
    url: str
    scheduler: Scheduler
    writer: TurnWriter
    db: Path
    app: Any

    @property
    def base(self) -> str:
        return self.url + "/v1"

    def store(self) -> SessionStore:
        return SessionStore.open(self.db, readonly=True)


@contextmanager
def running(db: Path, lm: LoadedModel, *, widths=(1, 2, 4, 8), segment_len: int = 32, runner: Any = None,
            limits: Limits = Limits(), options: dict | None = None, token: str | None = None,
            model_id: str = "tiny", allow_origins: frozenset[str] = frozenset()) -> Iterator[Running]:
    store = SessionStore.open(db)
    runner = runner or EagerRunner(lm.model, segment_len=segment_len)
    writer = TurnWriter(store, lm, runner, model_id=model_id)
    scheduler = Scheduler(writer, widths=widths, limits=limits, options=options)
    app = create_app(scheduler, ServerInfo(model_id=model_id, model={"state_bytes": lm.config.state_bytes()}, token=token,
                                           allow_origins=allow_origins))
    sock = bind("127.0.0.1", 0)
    server = make_server(app)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.02)
    try:
        yield Running(f"http://127.0.0.1:{sock.getsockname()[1]}", scheduler, writer, db, app)
    finally:
        server.should_exit = True
        thread.join(30)
        store.close()
        sock.close()


@pytest.fixture
def db(tmp_path) -> Path:
    return tmp_path / "laplace.db"


@pytest.fixture
def server(db, lm):
    with running(db, lm) as r:
        yield r


def replayed(store: SessionStore, lm: LoadedModel, uid: str) -> RecurrentState:
    runner = EagerRunner(lm.model, segment_len=64)
    state = lm.model.new_state(1)
    for ids in store.tree.branch_token_ids(uid):
        if ids:
            _, state = runner.prefill(ids, state)
    return state


def assert_stored_state_is_a_replay(store: SessionStore, lm: LoadedModel, uid: str) -> None:
    """The head's snapshot equals a fresh replay of the branch's stored ids, tensor by tensor
    (whatever the mixer holds: gla/conv, or the window's ring, positions and GLA branch)."""
    session = store.core.get_session(uid)
    snap = store.states.latest(session.id)
    assert snap is not None and snap.turn_id == session.head_turn_id
    stored = RecurrentState.from_bytes(store.states.load(snap, expected_fingerprint=lm.fingerprint))
    ref = replayed(store, lm, uid)
    assert stored.n_tokens == ref.n_tokens == store.tree.get_turn(session.head_turn_id).tokens_total
    assert stored.names == ref.names == list(lm.config.state_spec(1))
    for name in ref.names:
        torch.testing.assert_close(stored.tensors[name], ref.tensors[name], rtol=1e-4, atol=1e-5, msg=name)
