"""A streaming reply's flushes decode only the tokens new since the last one (O(new tokens)),
not the whole reply every 0.25 s, and still write the text a full decode gives."""

from __future__ import annotations

from agent.chat.turns import FLUSH_EVERY_S


def test_progress_decodes_only_new_tokens(make_service, lm, monkeypatch):
    svc = make_service()
    svc.new_session(system="s")
    session = svc.store.core.get_session(svc.session.uid)
    reply = svc.writer.begin_reply(session, svc._lease)
    decoded = {"ids": 0}
    real = lm.tokenizer.decode

    def counting(ids, *a, **k):
        decoded["ids"] += len(list(ids))
        return real(ids, *a, **k)

    monkeypatch.setattr(lm.tokenizer, "decode", counting)
    text = "the streaming reply, flushed again and again. " * 12
    tokens: list[int] = []
    now = reply.t0
    for tok in lm.tokenizer.encode(text):
        tokens.append(tok)
        now += FLUSH_EVERY_S * 1.01
        reply.progress(tokens, now)
    n = len(tokens)
    assert decoded["ids"] < 8 * n  # the old flush decoded the whole reply each time: n * (n + 1) / 2
    stored = svc.store.tree.get_turn(reply.turn.id)
    assert stored.status == "streaming" and stored.content == real(tokens) == text
