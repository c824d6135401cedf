"""Which turns only the transcript holds (`ChatService.transcript_only`): a tiny random
window model's session, whose early turns leave the window after a few replies."""

from __future__ import annotations

import pytest
import torch

from agent.runtime.checkpoint import LoadedModel
from agent.runtime.config import LaplaceConfig
from agent.runtime.held import MEMORY
from agent.runtime.model import build_model

S, W = 4, 12
WINDOW = LaplaceConfig(name="tiny-window", vocab_size=264, d_model=32, n_layers=2, n_heads=4, head_k_dim=8,
                       head_v_dim=8, ffn_dim=48, chunk_size=8, norm_eps=1e-5, mixer="window", window=W, sinks=S,
                       gla_branch=True, n_kv_heads=2, tie_embeddings=True, half_life_min=8.0, half_life_max=256.0)


@pytest.fixture(scope="module")
def window_lm(lm) -> LoadedModel:
    return LoadedModel(build_model(WINDOW, seed=5).eval(), lm.tokenizer, lm.template, name="tiny-window",
                       card={"name": "tiny-window", "trained": False})


def chat(svc, messages: list[str]) -> None:
    svc.new_session(system="Be brief.")
    for text in messages:
        list(svc.send(text))


def test_turns_that_left_the_window_are_held_only_by_the_transcript(make_service, window_lm) -> None:
    svc = make_service(window_lm, refresh="off", max_new_tokens=6)
    chat(svc, ["alpha bravo", "charlie delta", "echo foxtrot"])
    turns = svc.store.tree.branch(svc.session.uid)
    ids = [t.id for t in turns]
    n = svc._state.n_tokens
    # Wholly between the sinks and the window: [S, n - W).
    gone = {t.id for t in turns if S <= t.token_start and t.tokens_total <= n - W}
    assert len(gone) >= 3 and ids[0] not in gone and ids[-1] not in gone  # the system turn reaches the sinks
    assert svc.transcript_only(ids) == gone
    assert svc.transcript_only(ids[-2:]) == set()
    assert svc.transcript_only([]) == set()

    # A memory slot (the lead's memory: positions per layer, batch row, kv head, slot) that
    # holds one token of an old turn brings that turn back into the state.
    back = turns[ids.index(min(gone))]
    memory = torch.zeros((WINDOW.n_layers, 1, WINDOW.kv_heads, 3), dtype=torch.long)  # 0: empty
    memory[1, 0, 1, 2] = back.token_start + 1 + 1  # mem_pos holds 1 + the position
    svc._state.tensors[MEMORY[0]] = memory
    assert svc.transcript_only(ids) == gone - {back.id}
    del svc._state.tensors[MEMORY[0]]

    # Resumed in another service from the stored state: the same answer.
    uid = svc.session.uid
    svc.close()
    again = make_service(window_lm, refresh="off")
    again.resume(uid)
    assert again.transcript_only(ids) == gone


def test_a_model_without_exact_tokens_gives_no_answer(make_service) -> None:
    svc = make_service(max_new_tokens=4)  # the tiny GLA model
    chat(svc, ["alpha bravo", "charlie delta"])
    assert svc.transcript_only([t.id for t in svc.tail(10)]) is None
