"""The torch-free engine behind the chat layer (`native/runner.py`): its states are stored as
the torch runtime's bytes under the torch model's fingerprint, so a session moves between the
two runtimes; the chat service runs on it end to end; `laplace ask` on it never imports torch;
and `sampling.sample_array` draws by `sample`'s rule."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from agent.chat.service import ChatService
from agent.chat.types import TokenEvent, TurnFinished
from agent.runtime import native
from agent.runtime.checkpoint import LoadedModel, load_model_dir, save_model_dir
from agent.runtime.generation import EagerRunner
from agent.runtime.native.engine import EngineUnavailable
from agent.runtime.native.runner import ArrayState, EngineRunner, open_engine_model
from agent.runtime.sampling import make_rng, sample_array
from agent.runtime.state import RecurrentState
from agent.runtime.state_format import StateCorruptError, StateError
from agent.runtime.tokenizer import ChatTemplate, byte_level_tokenizer
from sessions import SessionStore
from tests.runtime.test_native_engine import kernels  # noqa: F401  (the fixture)
from tests.runtime.test_window import window_model


def model_dir(tmp_path: Path, int8: bool) -> tuple[Path, LoadedModel]:
    """A random window model saved as a directory, and the torch runtime's load of it (which
    caches the digests and, for int8, the int8 rows the engine needs)."""
    src = window_model(vocab_size=264)
    d = save_model_dir(LoadedModel(src, byte_level_tokenizer(), ChatTemplate(), name="w"), tmp_path / "w", card={"name": "w"})
    return d, load_model_dir(d, quant="int8" if int8 else None, decode_layout=True)


@pytest.mark.parametrize("int8", [False, True], ids=["fp32", "int8"])
def test_engine_model_has_the_torch_models_fingerprint(int8, kernels, tmp_path) -> None:  # noqa: F811
    d, lm = model_dir(tmp_path, int8)
    em = open_engine_model(d, weights="int8" if int8 else "fp32")
    assert em.fingerprint == lm.fingerprint
    assert em.config.architecture() == lm.config.architecture()
    assert em.card.get("weights") == lm.card.get("weights")


def test_a_directory_without_cached_digests_is_left_to_torch(kernels, tmp_path) -> None:  # noqa: F811
    src = window_model(vocab_size=264)
    d = save_model_dir(LoadedModel(src, byte_level_tokenizer(), ChatTemplate(), name="w"), tmp_path / "w", card={"name": "w"})
    with pytest.raises(EngineUnavailable, match="torch"):
        open_engine_model(d, weights="fp32")  # never loaded: nothing cached to fingerprint it by


def test_states_cross_between_the_runtimes_as_the_same_bytes(kernels, tmp_path) -> None:  # noqa: F811
    d, lm = model_dir(tmp_path, int8=False)
    em = open_engine_model(d, weights="fp32")
    runner = EngineRunner(em.engine, segment_len=32)
    ids = list(range(3, 3 + 70))
    _, state = runner.prefill(ids)
    arch = em.config.architecture()
    blob = state.to_bytes(fingerprint=em.fingerprint, architecture=arch)
    torch_state = RecurrentState.from_bytes(blob, config=lm.config, fingerprint=lm.fingerprint)
    assert torch_state.n_tokens == 70 and blob == torch_state.to_bytes(fingerprint=lm.fingerprint, architecture=arch)
    # and back: torch's own fold, loaded by the engine, is close to the engine's fold
    _, folded = EagerRunner(lm.model, segment_len=32).prefill(ids)
    back = runner.load_state(folded.to_bytes(fingerprint=lm.fingerprint, architecture=arch), config=em.config, fingerprint=em.fingerprint)
    assert back.n_tokens == 70
    for name, t in state.tensors.items():
        np.testing.assert_allclose(back.tensors[name], t, rtol=1e-4, atol=1e-4, err_msg=name)
    with pytest.raises(StateError):  # another model's state
        runner.load_state(blob, config=em.config, fingerprint="0" * 64)
    with pytest.raises(StateCorruptError):  # one flipped byte in the numbers
        bad = bytearray(blob)
        bad[-5] ^= 0xFF
        runner.load_state(bytes(bad), config=em.config, fingerprint=em.fingerprint)


def test_prefill_never_changes_the_state_it_is_given(kernels, tmp_path) -> None:  # noqa: F811
    d, _ = model_dir(tmp_path, int8=True)
    runner = EngineRunner(open_engine_model(d, weights="int8").engine, segment_len=32)
    _, state = runner.prefill(list(range(5, 45)))
    before = {n: t.copy() for n, t in state.tensors.items()}
    logits, after = runner.prefill([7, 8, 9], state)
    assert state.n_tokens == 40 and after.n_tokens == 43 and logits.shape == (264,)
    for n, t in state.tensors.items():
        assert np.array_equal(t, before[n]), n
    step = runner.step_token(11, after)
    assert after.n_tokens == 44 and after.positions[0] == 44 and np.isfinite(step).all()
    after.n_tokens = 40  # a host count that disagrees with the model's is caught before it is stored
    with pytest.raises(StateCorruptError):
        after.to_bytes(fingerprint="f")


def _reply(svc: ChatService, text: str) -> str:
    events = list(svc.send(text))
    assert isinstance(events[-1], TurnFinished)
    return "".join(e.text for e in events if isinstance(e, TokenEvent))


def test_a_session_moves_between_the_engine_and_torch(kernels, tmp_path) -> None:  # noqa: F811
    """Written on the engine, resumed on torch and continued, then back on the engine: each
    resume loads the other runtime's stored state (no replay)."""
    d, lm = model_dir(tmp_path, int8=False)
    em = open_engine_model(d, weights="fp32")
    opts = {"temperature": "0", "max_new_tokens": "6"}
    db = tmp_path / "chat.db"
    with SessionStore.open(db) as store:
        svc = ChatService(store, em, model_id="w", runner=EngineRunner(em.engine, segment_len=32), options=opts)
        svc.new_session(system="be brief")
        _reply(svc, "hello there")
        uid = svc.session.uid
        svc.close()
    with SessionStore.open(db) as store:
        svc = ChatService(store, lm, model_id="w", runner=EagerRunner(lm.model, segment_len=32), options=opts)
        svc.resume(uid)
        _reply(svc, "and again")
        svc.close()
        twin = ChatService(store, em, model_id="w", runner=EngineRunner(em.engine, segment_len=32), options=opts)
        twin.resume(uid)
        n = twin._state_now().n_tokens
        twin.close()
        turns = store.tree.branch(store.core.get_session(uid).id)
    assert n == turns[-1].tokens_total  # the engine read torch's stored state: the tokens of every turn
    replies = [t for t in turns if t.role == "assistant"]
    assert len(replies) == 2 and all(t.status == "complete" for t in replies)


def test_sample_array_follows_samples_rule() -> None:
    rng = make_rng(0)
    logits = np.array([0.1, 2.0, 1.9, -3.0], np.float32)
    assert sample_array(logits, rng, temperature=0) == 1
    assert sample_array(logits, rng, temperature=1.0, top_k=1) == 1
    assert sample_array(logits, rng, temperature=1.0, top_p=1e-6) == 1
    # the penalty divides a seen positive logit: token 1 falls below token 2
    assert sample_array(logits, rng, temperature=0, repetition_penalty=1.2, history=[1]) == 2
    draws = [sample_array(logits, make_rng(s), temperature=1.0) for s in range(4000)]
    p = np.exp(logits) / np.exp(logits).sum()
    freq = np.bincount(draws, minlength=4) / len(draws)
    assert np.abs(freq - p).max() < 0.03  # the draw follows the softmax
    got = [sample_array(logits, make_rng(7), temperature=0.8, top_k=3, top_p=0.9) for _ in range(3)]
    assert len(set(got)) == 1  # a seed repeats its draw
    kept = {sample_array(logits, make_rng(s), temperature=1.0, top_k=2) for s in range(300)}
    assert kept == {1, 2}  # top-k keeps exactly the k largest


def test_ask_on_the_engine_never_imports_torch(kernels, tmp_path) -> None:  # noqa: F811
    """`laplace ask` and `ask -c` on a model the engine runs: the whole process stays
    torch-free, and the turns are stored like any others."""
    d, _ = model_dir(tmp_path, int8=True)
    home = tmp_path / "home"
    code = (
        "import sys\n"
        "from agent.cli import app\n"
        "for argv in (['ask', '-m', sys.argv[1], '-o', 'max_new_tokens', '5', 'hello'],\n"
        "             ['ask', '-c', '-o', 'max_new_tokens', '5', '--json', 'again']):\n"
        "    try:\n"
        "        app(argv, standalone_mode=False)\n"
        "    except SystemExit as e:\n"
        "        assert not e.code, e.code\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    env = {**os.environ, "LAPLACE_HOME": str(home), "LAPLACE_ENGINE": "native"}
    out = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "NO-TORCH", out.stdout[-2000:]
    reply = json.loads(out.stdout.strip().splitlines()[-2])
    assert reply["status"] == "complete" and reply["tokens_folded"] > 0
    with SessionStore.open(home / "laplace.db", readonly=True) as store:
        assert len(store.browse.list_sessions()) == 1
        assert len(store.tree.branch(store.browse.most_recent_session().id)) == 5  # system, 2 x (user, reply)


def test_engine_native_says_why_it_cannot_run_a_model(tmp_path) -> None:
    env = {**os.environ, "LAPLACE_HOME": str(tmp_path / "home"), "LAPLACE_ENGINE": "native"}
    laplace = [sys.executable, "-c", "from agent.cli import main; main()"]
    out = subprocess.run([*laplace, "ask", "-m", "demo", "hi"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode != 0 and "LAPLACE_ENGINE=native" in out.stderr and "torch" in out.stderr
    bad = subprocess.run([*laplace, "ask", "-m", "demo", "hi"], capture_output=True, text=True,
                         env={**env, "LAPLACE_ENGINE": "fast"}, timeout=120)
    assert bad.returncode != 0 and "LAPLACE_ENGINE" in bad.stderr and "auto" in bad.stderr


def test_verify_replay_passes_a_session_the_engine_wrote(kernels, tmp_path) -> None:  # noqa: F811
    """`laplace sessions verify --replay` replays with torch; an int8 session written on the
    engine passes it (under the int8 bar: the two runtimes round differently)."""
    from agent.chat.verify import compare_replay, newest_snapshot

    d, lm = model_dir(tmp_path, int8=True)
    em = open_engine_model(d, weights="int8")
    with SessionStore.open(tmp_path / "chat.db") as store:
        svc = ChatService(store, em, model_id="w", runner=EngineRunner(em.engine, segment_len=32),
                          options={"temperature": "0", "max_new_tokens": "12"})
        svc.new_session(system="be brief")
        for text in ("hello there, how are you", "tell me more about that"):
            _reply(svc, text)
        uid = svc.session.uid
        svc.close()
        session, snap = newest_snapshot(store, uid)
        result = compare_replay(store, session, snap, lm, EagerRunner(lm.model, segment_len=32))
    assert result.n_tokens > 40 and "int8" in result.within



def test_torch_twin_hands_the_probes_the_same_model_and_state(kernels, tmp_path) -> None:  # noqa: F811
    """The TUI's /check runs the probes, which are torch: a chat on the engine gives them the
    torch load of the same directory (same fingerprint) and the live state as stored bytes."""
    d, _ = model_dir(tmp_path, int8=True)
    em = open_engine_model(d, weights="int8")
    _, state = EngineRunner(em.engine, segment_len=32).prefill(list(range(10, 60)))
    lm, twin = em.torch_twin(state)
    assert lm.fingerprint == em.fingerprint and twin.n_tokens == 50
    assert em.torch_twin(state)[0] is lm  # loaded once
    for name, t in state.tensors.items():
        np.testing.assert_array_equal(twin.tensors[name].numpy(), t)
