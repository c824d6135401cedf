"""Issue 36's training mix (recipes/answer/mix.py), its anchors' requests, the teacher's
resumable replies and the second held-out set: nothing held out reaches training, and every
trained reply is right about what the conversation (or its recall block) said."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest

from agent.probes.natural_text import CONCEPTS as PROBE_CONCEPTS
from agent.probes.natural_text import HELDOUT_VALUES, mentions, says_not_told
from agent.recall.rule import BLOCK_ROLE, HEADER
from recipes.answer.concepts import CONCEPTS, TRAIN_CONCEPTS, TRAIN_VALUES, TrainConcept
from recipes.answer.heldout2 import HELDOUT2_CONCEPTS, HELDOUT2_VALUES
from recipes.answer.mix import GAP_TOKENS, KIND_SHARES, MAX_TOKENS, dialogues, size, write
from recipes.answer.requests import ANCHOR_REQUESTS, HELDOUT_REQUESTS, HELDOUT_SOCIAL, SOCIAL_REQUESTS, claims_user_said

ANCHORS = [("Suggest a name for my bakery.", "How about Golden Crust? It sounds warm and fresh."),
           ("How do I fry an egg?", "Heat a pan, add a little oil, crack the egg in and cook it for three minutes.")]


# The three day-named concepts (run L) and the two digital-access ones before them (run J): the
# digests below are of mixes drawn without either, so earlier mixes regenerate byte for byte
# but for the yoga phrase.
HOLIDAY = ("bake_sale", "choir", "craft_market")
CONCEPTS_BEFORE_ACCESS = tuple(c for c in TRAIN_CONCEPTS if c.name not in {"laptop", "photo_app", *HOLIDAY})


def _digest_before_yoga_fix(rows: object) -> str:
    """The sha256 of `rows` with the yoga statement as it read before it stopped naming
    "Tuesdays" (a value of the second held-out set): the draws are the same, one phrase differs."""
    import hashlib

    text = re.sub(r"(I go to yoga at [0-9:]+) after work\.", r"\1 on Tuesdays.", json.dumps(rows))
    return hashlib.sha256(text.encode()).hexdigest()


def _pattern(phrasing: str) -> re.Pattern[str]:
    return re.compile(r"(?:.*?[.:] )?" + re.escape(phrasing).replace(re.escape("{v}"), "(.+?)"), re.I)


def _words(s: str) -> set[str]:
    return set(re.findall(r"[a-z0-9']+", s.lower()))


# ---- held out: the probe, and the second set ---------------------------------------------


def test_no_held_out_value_is_a_word_of_the_training_text() -> None:
    # "I go to yoga at {v} on Tuesdays." named a weekday of the second held-out set (a plural,
    # which `mentions` does not see); the tuned model then answered "on Tuesday" for both
    # weekday details of that set.
    from recipes.answer.concepts import (ACKS, CHATTER_ADJECTIVES, CHATTER_ASKS, CHATTER_NOUNS, CHATTER_REPLIES,
                                         CHATTER_TOPICS, CHATTER_VERBS, SMALL_TALK)

    text = [p for c in CONCEPTS for p in (*c.statements, *c.questions, *c.answers, *c.not_told)]
    text += [t for pair in SMALL_TALK for t in pair]
    text += [*ACKS, *CHATTER_TOPICS, *CHATTER_NOUNS, *CHATTER_ADJECTIVES, *CHATTER_VERBS, *CHATTER_ASKS, *CHATTER_REPLIES]
    words = _words(" ".join(text))
    for pools in (HELDOUT_VALUES, HELDOUT2_VALUES):
        for kind, values in pools.items():
            for v in values:
                assert not {v.lower(), v.lower() + "s"} & words, (kind, v)


def test_the_second_held_out_set_shares_nothing_with_training_or_the_probe() -> None:
    train_names = {c.name for c in CONCEPTS}
    probe_names = {c.name for c in PROBE_CONCEPTS}
    h2 = {c.name for c in HELDOUT2_CONCEPTS}
    assert len(HELDOUT2_CONCEPTS) >= 12 and not h2 & train_names and not h2 & probe_names
    probe_keys = {c.key for c in PROBE_CONCEPTS}
    train_text = " ".join(p for c in CONCEPTS for p in (*c.statements, *c.questions, *c.answers, *c.not_told)).lower()
    for c in HELDOUT2_CONCEPTS:
        assert c.key not in probe_keys and c.key not in _words(train_text), c.key  # a new type, not a new wording of one
        for p in (*c.statements, *c.questions):
            assert c.key in p.lower(), (c.name, p)  # the probe's builder relies on the key word
            assert p.lower() not in train_text
    probe_text = {p.lower() for c in PROBE_CONCEPTS for p in (*c.statements, *c.questions, *c.updates)}
    assert not probe_text & {p.lower() for c in HELDOUT2_CONCEPTS for p in (*c.statements, *c.questions)}
    for kind, pool in HELDOUT2_VALUES.items():
        for other in (TRAIN_VALUES, HELDOUT_VALUES):
            assert not {v.lower() for v in pool} & {v.lower() for v in other.get(kind, ())}, kind
        for other in (TRAIN_VALUES, HELDOUT_VALUES):  # nor in any other pool of a known kind
            assert not {v.lower() for v in pool} & {v.lower() for vs in other.values() for v in vs}, kind
    # Numbers are six digits (training draws at most five), times 24-hour at minutes training never draws.
    assert {c.kind for c in HELDOUT2_CONCEPTS if c.kind.startswith("num")} == {"num6"}
    assert all(int(t.split(":")[0]) > 12 and t.split(":")[1] not in ("00", "15", "30", "45") for t in HELDOUT2_VALUES["time24"])


def test_generated_training_text_holds_no_held_out_phrasing_or_value(tmp_path: Path) -> None:
    write(tmp_path, train=400, eval_n=20, seed=5, anchors=ANCHORS, shares={**KIND_SHARES, "long": 0.3})
    rows = [json.loads(x)["messages"] for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    msgs = {m["content"] for r in rows for m in r}
    text = " ".join(msgs).lower()
    for c in (*PROBE_CONCEPTS, *HELDOUT2_CONCEPTS):
        for q in (*c.questions, *c.statements):
            assert q.replace("{v}", "").lower()[:30] not in text or "{v}" in q[:30], q
        assert not any(q in msgs for q in c.questions), c.name
    words = _words(text)
    for pool in (HELDOUT_VALUES, HELDOUT2_VALUES):
        for kind, values in pool.items():
            if kind == "month":
                continue  # the probe's months: training dates use the other six (the pool test checks it)
            for v in values:
                assert v.lower() not in words, (kind, v)
    assert not any(r in msgs for r in HELDOUT_REQUESTS)
    from recipes.answer.concepts import SMALL_TALK
    fixed = " ".join(p for c in CONCEPTS for p in (*c.statements, *c.questions, *c.answers, *c.not_told))
    fixed += " ".join(a + " " + b for a, b in SMALL_TALK) + " ".join(ANCHOR_REQUESTS)
    from recipes.answer import concepts
    fixed += " ".join(w for name in dir(concepts) if name.startswith("CHATTER_") for w in getattr(concepts, name))
    assert not {c.key for c in PROBE_CONCEPTS} & _words(" ".join(concepts.CHATTER_NOUNS))  # no probe key word in the chat
    from recipes.answer.mix import held_out_words
    assert not held_out_words() & _words(fixed)  # no held-out value in any fixed training text either
    stats = json.loads((tmp_path / "stats.json").read_text())
    assert set(stats["train"]["kinds"]) == {"window", "recall", "update", "anchor", "long"}
    assert set(stats["eval"]["kinds"]) <= {"window", "recall", "update", "long"}


def test_text_records_and_fresh_anchors_join_the_training_file(tmp_path: Path) -> None:
    from recipes.answer.mix import held_out_words, text_records
    from recipes.smollm2_hybrid.text import stdlib_text

    stats = write(tmp_path, train=200, eval_n=5, seed=3, anchors=ANCHORS, text=40, shares={"window": 0.5, "anchor": 0.5})
    recs = [json.loads(x) for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    texts = [r["text"] for r in recs if "text" in r]
    assert stats["text_records"] == len(texts) == 40 and len(recs) == 240
    assert len(set(texts)) == 40 and all(100 <= len(t) <= 1200 for t in texts)
    measured = stdlib_text(8000)  # check.py's perplexity text is never trained
    assert not any(t[:80] in measured for t in texts)
    held = held_out_words()
    assert not any(w in held for t in texts for w in _words(t))
    fresh = [r["messages"] for r in recs if "messages" in r and all(m["role"] != "user" or m["content"] in dict(ANCHORS) for m in r["messages"])]
    assert fresh, "some anchor dialogues are a fresh chat of requests only"
    assert all(m["content"] in dict(ANCHORS).values() for r in fresh for m in r if m["role"] == "assistant")
    assert text_records(40, 3) == texts  # seeded


def test_gap_option_bounds_the_small_talk_and_refuses_bad_ranges(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import main

    near = dialogues(60, 1, TRAIN_CONCEPTS, shares={"window": 1.0}, gap=(0, 0))
    far = dialogues(60, 1, TRAIN_CONCEPTS, shares={"window": 1.0}, gap=(150, 200))
    mean = lambda rows: sum(size(m) for _, m in rows) / len(rows)  # noqa: E731
    assert mean(far) > mean(near) + 100  # the gap is there, in tokens
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x"), "--gap", "300,10"])
    assert exc.value.code == 2 and "--gap '300,10'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def _farthest_asked(msgs: list[dict]) -> int:
    """The most estimated tokens from a detail's (latest) statement to a question that gets
    it back, in a window dialogue."""
    most = 0
    for i, m in enumerate(msgs):
        for c in TRAIN_CONCEPTS:
            if m["role"] == "user" and any(_pattern(q).fullmatch(m["content"]) for q in c.questions):
                reply = msgs[i + 1]["content"]
                starts = [j for j in range(i) if msgs[j]["role"] == "user"
                          and any(_pattern(st).fullmatch(msgs[j]["content"]) for st in c.statements)]
                if starts and not says_not_told(reply):
                    most = max(most, size(msgs[starts[-1]:i]))
    return most


def test_reach_lets_window_questions_read_to_the_edge_of_the_window(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import MAX_REACH, WINDOW_REACH, main

    edge = dialogues(150, 2, TRAIN_CONCEPTS, shares={"window": 1.0}, gap=(180, 244), reach=244)
    plain = dialogues(150, 2, TRAIN_CONCEPTS, shares={"window": 1.0}, gap=(180, 220))
    far_edge = [_farthest_asked(m) for _, m in edge]
    far_plain = [_farthest_asked(m) for _, m in plain]
    assert max(far_plain) <= WINDOW_REACH < max(far_edge) <= 244 == MAX_REACH
    assert sum(f > WINDOW_REACH for f in far_edge) >= 10
    assert plain == dialogues(150, 2, TRAIN_CONCEPTS, shares={"window": 1.0}, gap=(180, 220), reach=WINDOW_REACH)
    for argv, said in ((["--reach", "300"], "--reach 300: give a number of tokens from 1 to 244"),
                       (["--gap", "64,230"], "--gap '64,230'")):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(tmp_path / "x"), *argv])
        assert exc.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def _edge_rival(msgs: list[dict], rival_first: bool = False) -> int | None:
    """Estimated tokens from the first answered question back to its detail's statement, when
    that detail was stated first and one of the same kind after it (with `rival_first`: one
    of the same kind first and the detail after it); None otherwise."""
    def concept(text: str, phrasings: str) -> TrainConcept | None:
        return next((c for c in TRAIN_CONCEPTS if any(_pattern(p).fullmatch(text) for p in getattr(c, phrasings))), None)

    stated: list[tuple[int, TrainConcept]] = []
    for i, m in enumerate(msgs):
        if m["role"] != "user":
            continue
        asked = concept(m["content"], "questions")
        if asked is None:
            c = concept(m["content"], "statements")
            stated += [(i, c)] if c is not None else []
            continue
        if says_not_told(msgs[i + 1]["content"]) or not stated:
            return None
        if rival_first:
            at = next((j for j, c in stated[1:] if c is asked), None)
            rival = stated[0][1].kind == asked.kind and stated[0][1] is not asked
            return size(msgs[at:i]) if rival and at is not None else None
        rival = stated[0][1] is asked and any(c.kind == asked.kind for _, c in stated[1:])
        return size(msgs[stated[0][0]:i]) if rival else None
    return None


def test_edge_rival_states_the_asked_detail_at_the_edge_and_its_rival_nearer(tmp_path: Path,
                                                                             capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import EDGE_SLACK, main

    kw = {"shares": {"window": 1.0}, "gap": (64, 244), "reach": 244}
    edge = [_edge_rival(m) for _, m in dialogues(200, 3, TRAIN_CONCEPTS, edge_rival=1.0, **kw)]
    plain = [_edge_rival(m) for _, m in dialogues(200, 3, TRAIN_CONCEPTS, **kw)]
    at_edge = [d for d in edge if d is not None]
    # Every such draw puts the asked detail within the slack below the reach, never past it.
    assert len(at_edge) >= 80 and all(244 - EDGE_SLACK[1] <= d <= 244 for d in at_edge)
    # Without the option the same order comes only by chance, and seldom at the edge.
    assert sum(d is not None and d >= 244 - EDGE_SLACK[1] for d in plain) < len(at_edge) // 3
    assert dialogues(50, 3, TRAIN_CONCEPTS, edge_rival=0.0, **kw) == dialogues(50, 3, TRAIN_CONCEPTS, **kw)
    assert dialogues(50, 3, TRAIN_CONCEPTS, edge_rival=1.0, rival_first=0.0, **kw) == \
        dialogues(50, 3, TRAIN_CONCEPTS, edge_rival=1.0, **kw)
    for argv, said in ((["--edge-rival", "1.5"], "--edge-rival 1.5: give a share from 0 to 1"),
                       (["--edge-rival", "0.5", "--rival-first", "-0.1"], "--rival-first -0.1: give a share from 0 to 1"),
                       (["--rival-first", "0.5"], "--rival-first 0.5 turns round --edge-rival draws: give --edge-rival P too")):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(tmp_path / "x"), *argv])
        assert exc.value.code == 2 and said in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_rival_first_states_the_rival_first_and_the_asked_detail_after_it_at_the_edge() -> None:
    from recipes.answer.mix import EDGE_SLACK

    kw = {"shares": {"window": 1.0}, "gap": (64, 244), "reach": 244}
    turned = [_edge_rival(m, rival_first=True) for _, m in dialogues(200, 3, TRAIN_CONCEPTS, edge_rival=1.0, rival_first=1.0, **kw)]
    plain = [_edge_rival(m, rival_first=True) for _, m in dialogues(200, 3, TRAIN_CONCEPTS, edge_rival=1.0, **kw)]
    at_edge = [d for d in turned if d is not None]
    # The asked detail comes after its rival and still within the slack below the reach (fewer
    # than asked-first: a middle detail asked as well now lies past the reach, and is drawn again).
    assert len(at_edge) >= 60 and all(244 - EDGE_SLACK[1] <= d <= 244 for d in at_edge)
    # Without it, edge-rival draws put the asked detail first: this order comes only by chance.
    assert sum(d is not None and d >= 244 - EDGE_SLACK[1] for d in plain) < len(at_edge) // 3


def _no_near_copies(held: tuple[str, ...], seen: tuple[str, ...]) -> None:
    """No held-out line shares 75% or more of its words (Jaccard) with any line of `seen`."""
    for h in held:
        hw = _words(h)
        for a in seen:
            aw = _words(a)
            assert len(hw & aw) / len(hw | aw) < 0.75, (h, a)


def test_held_out_requests_are_never_anchors_nor_near_copies() -> None:
    assert len(HELDOUT_REQUESTS) >= 60 and len(set(HELDOUT_REQUESTS)) == len(HELDOUT_REQUESTS)
    assert len(ANCHOR_REQUESTS) >= 250 and len(set(ANCHOR_REQUESTS)) == len(ANCHOR_REQUESTS)
    assert sum(" my " in r for r in ANCHOR_REQUESTS) >= len(ANCHOR_REQUESTS) // 4  # "Suggest a name for my bakery."
    assert sum(" my " in r for r in HELDOUT_REQUESTS) >= 15
    _no_near_copies(HELDOUT_REQUESTS, ANCHOR_REQUESTS)


def test_held_out_social_turns_are_never_anchors_nor_small_talk_nor_near_copies() -> None:
    from recipes.answer.concepts import SMALL_TALK

    assert len(HELDOUT_SOCIAL) >= 30 and len(set(HELDOUT_SOCIAL)) == len(HELDOUT_SOCIAL)
    # The social anchors come last, so the anchors answered before them keep their order.
    assert ANCHOR_REQUESTS[-len(SOCIAL_REQUESTS):] == SOCIAL_REQUESTS
    assert not set(SOCIAL_REQUESTS) & set(ANCHOR_REQUESTS[: -len(SOCIAL_REQUESTS)])
    _no_near_copies(HELDOUT_SOCIAL, (*ANCHOR_REQUESTS, *HELDOUT_REQUESTS, *(u for u, _ in SMALL_TALK)))


def test_check_scores_social_replies_invented_and_over_refused() -> None:
    from types import SimpleNamespace

    from recipes.answer.check import scored, shares

    said = ["Hello! How can I help?", "You said you're a chatbot.", "You haven't told me your name.", "I'm an AI."]
    lm = SimpleNamespace(tokenizer=SimpleNamespace(decode=lambda ids: said[ids[0]]))
    rows = scored(lm, ("Say hi.", "Hello!", "What's your name?", "Who are you?"), [[0], [0], [3], [3]], [[0], [1], [2], [3]])
    assert [(r["tuned_invented"], r["tuned_not_told"]) for r in rows] == [(False, False), (True, False), (False, True), (False, False)]
    assert shares(rows, "tuned") == {"invented": 0.25, "over_refused": 0.25}
    assert shares(rows, "base") == {"invented": 0.0, "over_refused": 0.0}


def test_anchors_naming_a_held_out_value_are_dropped(tmp_path: Path) -> None:
    from recipes.answer.mix import clean_anchors

    kept = clean_anchors([*ANCHORS, ("Name a city in Japan.", "Kyoto is lovely in autumn."), ("Pick a colour.", "Go with coral.")])
    assert kept == ANCHORS  # Kyoto: the probe's; coral: the second held-out set's
    stats = write(tmp_path, train=10, eval_n=2, seed=0, anchors=[*ANCHORS, ("Name a city in Japan.", "Kyoto is lovely.")])
    assert stats["anchors"] == 2 and stats["anchors_dropped_for_held_out_values"] == 1


def test_invented_claims_are_recognised() -> None:
    for s in ("You said the bakery is called Bakery Breeze.", "As you mentioned, the meeting is off.",
              "You told me you're in a team of 5.", "You've already told me that."):
        assert claims_user_said(s), s
    for s in ("How about Golden Crust?", "You haven't told me your name.", "Say it slowly: thank you very much."):
        assert not claims_user_said(s), s


# ---- the dialogues -------------------------------------------------------------------------


def _check_dialogue(kind: str, msgs: list[dict]) -> tuple[int, int, list[int]]:
    """Every answer holds the latest value stated (or recalled) for its concept; "not told"
    only for a concept never stated. Returns (answers, not told, statement-to-question gaps)."""
    by_question = {q: c for c in TRAIN_CONCEPTS for q in c.questions}
    stated: dict[str, str] = {}
    answers = not_told = 0
    gaps: list[int] = []
    where: dict[str, int] = {}
    for i, m in enumerate(msgs):
        if m["role"] == BLOCK_ROLE:
            assert m["content"].startswith(HEADER + "\n\n")  # the real formatter's block
            assert all(x.startswith(("User: ", "Assistant: ")) for x in m["content"].splitlines()[2:])
            for line in m["content"].splitlines()[2:]:
                for c in TRAIN_CONCEPTS:
                    for s in c.statements:
                        if hit := _pattern(s).fullmatch(line.removeprefix("User: ")):
                            stated[c.name] = hit.group(1)  # later lines (an update) win
        if m["role"] != "user":
            continue
        for c in TRAIN_CONCEPTS:
            for s in c.statements:
                if hit := _pattern(s).fullmatch(m["content"]):
                    stated[c.name] = hit.group(1)
                    where[c.name] = size(msgs[:i])
        c = by_question.get(m["content"])
        if c is None:
            continue
        reply = msgs[i + 1]
        assert reply["role"] == "assistant" and reply.get("weight", 1) == 1
        if c.name in stated:
            assert mentions(reply["content"], stated[c.name]) and not says_not_told(reply["content"]), (msgs, c.name)
            answers += 1
            if c.name in where:
                gaps.append(size(msgs[:i]) - where[c.name])
        else:
            assert says_not_told(reply["content"]), reply
            not_told += 1
    return answers, not_told, gaps


def test_every_reply_matches_what_was_said_or_recalled() -> None:
    rows = dialogues(500, 3, TRAIN_CONCEPTS, ANCHORS)
    kinds = Counter(k for k, _ in rows)
    assert all(kinds[k] > 30 for k in ("window", "recall", "update", "anchor")), kinds
    total_answers = total_not_told = 0
    gaps: list[int] = []
    for kind, msgs in rows:
        assert size(msgs) <= MAX_TOKENS and msgs[0] == {"role": "system", "content": ""}
        a, n, g = _check_dialogue(kind, msgs)
        total_answers, total_not_told = total_answers + a, total_not_told + n
        gaps += g
        if kind == "recall":
            assert any(m["role"] == BLOCK_ROLE for m in msgs)
    share = total_not_told / (total_answers + total_not_told)
    assert 0.2 < share < 0.45, share  # about a third never given
    assert max(gaps) <= 256 and min(gaps) < 40 and sum(g > 150 for g in gaps) > 10  # inside the window, 0-200 tokens back


def _only_answers_trained(msgs: list[dict]) -> None:
    """An assistant turn is a target exactly when it answers a question; the chat around it
    (acknowledgements, small talk, chatter) carries weight 0."""
    questions = {q for c in TRAIN_CONCEPTS for q in c.questions}
    for prev, m in zip(msgs, msgs[1:]):
        if m["role"] == "assistant":
            assert (m.get("weight", 1) == 1) == (prev["content"] in questions), (prev, m)


def test_long_dialogues_ask_past_the_window_and_past_the_horizon_through_the_block() -> None:
    from recipes.answer.concepts import CHATTER_NOUNS
    from recipes.answer.mix import HORIZON, LONG_MAX_TOKENS

    rows = dialogues(150, 6, TRAIN_CONCEPTS, ANCHORS, shares={"long": 1.0})
    assert {k for k, _ in rows} == {"long"}
    answers = not_told = blocks = past_horizon = 0
    gaps: list[int] = []
    for _, msgs in rows:
        assert size(msgs) <= LONG_MAX_TOKENS and msgs[0] == {"role": "system", "content": ""}
        a, n, g = _check_dialogue("long", msgs)  # every reply right about what was said or recalled
        answers, not_told, gaps = answers + a, not_told + n, gaps + g
        _only_answers_trained(msgs)
        for i, m in enumerate(msgs):
            if m["role"] == BLOCK_ROLE:
                blocks += 1
                assert msgs[i + 1]["role"] == "user"  # folded right before the question it was chosen for
        for g_ in g:
            past_horizon += g_ > HORIZON
    share = not_told / (answers + not_told)
    assert 0.35 < share < 0.65, share  # about half never given
    assert min(gaps) > 256 and past_horizon > 5 and blocks > 20, (min(gaps), past_horizon, blocks)  # past the window; some past the horizon
    text = " ".join(m["content"] for _, msgs in rows for m in msgs).lower()
    assert sum(f" {n} " in text for n in CHATTER_NOUNS) > 10  # the chat names everyday things a question may use


def test_long_dialogues_are_off_unless_asked_and_the_option_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import main

    assert "long" not in {k for k, _ in dialogues(300, 2, TRAIN_CONCEPTS, ANCHORS)}  # older mixes draw as before
    for bad in ("100,500", "600,400", "300,9000"):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(tmp_path / "x"), "--long-share", "0.3", "--long-gap", bad])
        assert exc.value.code == 2 and f"--long-gap {bad!r}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_gap_chatter_fills_window_gaps_with_distractors_and_keeps_replies_right(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.concepts import CHATTER_NOUNS
    from recipes.answer.mix import main

    # 0 draws exactly what the mix drew before --gap-chatter existed (this digest is of the
    # dialogues the code of commit d516969 draws), so earlier mixes regenerate byte for byte.
    plain = dialogues(200, 4, CONCEPTS_BEFORE_ACCESS, ANCHORS, shares={"window": 1.0, "update": 0.3}, gap_chatter=0.0)
    assert _digest_before_yoga_fix(plain) == "cd25c8f1a6f7e3f7d85f7a34decc1afbefae6a646e9835617f24a813aff19c44"
    rows = dialogues(200, 4, TRAIN_CONCEPTS, ANCHORS, shares={"window": 1.0, "update": 0.3}, gap_chatter=1.0, gap=(64, 200))
    with_chatter = 0
    for kind, msgs in rows:
        assert size(msgs) <= MAX_TOKENS
        _check_dialogue(kind, msgs)  # every reply right about what was said, whatever the chatter named
        chat = " ".join(m["content"] for m in msgs if m.get("weight") == 0 or m["role"] == "user").lower()
        with_chatter += any(f" {n} " in chat for n in CHATTER_NOUNS)
        _only_answers_trained(msgs)  # the chatter is context, never a target
    assert with_chatter > 150, with_chatter
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x"), "--gap-chatter", "1.5"])
    assert exc.value.code == 2 and "--gap-chatter 1.5" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_social_weight_draws_social_anchors_more_often_and_weight_one_draws_as_before(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import main, weigh_social

    hello = (SOCIAL_REQUESTS[0], "Hello! How can I help you today?")
    anchors = [*ANCHORS, ("Name a calm color.", "Soft blue is calm."), ("What is a haiku?", "A short poem of three lines."), hello]
    assert weigh_social(anchors, 1) == anchors
    assert weigh_social(anchors, 4).count(hello) == 4 and len(weigh_social(anchors, 4)) == len(anchors) + 3
    # A social reply that disclaims as a chatbot is drawn as often as any other anchor.
    bot = (SOCIAL_REQUESTS[1], "I'm sorry, but as a chatbot designed to assist with digital communication, I don't have the ability.")
    assert weigh_social([*anchors, bot], 4).count(bot) == 1 and weigh_social([*anchors, bot], 4).count(hello) == 4
    # Weight 1 draws what the mix drew before the option existed (the digest is of commit
    # fc66577's code and its concepts), fresh chats included.
    plain = dialogues(300, 6, CONCEPTS_BEFORE_ACCESS, anchors, shares={"anchor": 1.0, "window": 0.3})
    assert _digest_before_yoga_fix(plain) == "8cf62079822f5597a061b88934d1388186ab9232a6094bca8811311c1c1edc29"

    def greeted(rows: list[tuple[str, list[dict]]]) -> int:
        return sum(any(m["role"] == "user" and m["content"] == hello[0] and m.get("weight", 1) for m in msgs) for _, msgs in rows)

    heavy = dialogues(300, 6, CONCEPTS_BEFORE_ACCESS, weigh_social(anchors, 5), shares={"anchor": 1.0, "window": 0.3})
    assert greeted(heavy) > 2 * greeted(plain) > 0, (greeted(heavy), greeted(plain))
    for _, msgs in heavy:  # a request drawn twice into one fresh chat is asked once
        asked = [m["content"] for m in msgs if m["role"] == "user"]
        assert len(asked) == len(set(asked)), asked
    anchor_file = tmp_path / "anchors.jsonl"
    anchor_file.write_text("".join(json.dumps({"request": q, "reply": r}) + "\n" for q, r in anchors), encoding="utf-8")
    stats = write(tmp_path / "mix", train=50, eval_n=5, seed=1, anchors=anchors, social_weight=3)
    assert stats["social_anchors"] == 1 and stats["social_anchors_weighted"] == 1 and stats["social_weight"] == 3
    assert stats["anchors"] == len(anchors)
    for bad in ("0", "21"):
        with pytest.raises(SystemExit) as exc:
            main(["--out", str(tmp_path / "x"), "--anchors", str(anchor_file), "--social-weight", bad])
        assert exc.value.code == 2 and f"--social-weight {bad}" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_updates_answer_the_later_value() -> None:
    seen = 0
    for kind, msgs in dialogues(300, 8, TRAIN_CONCEPTS):
        if kind != "update":
            continue
        values: dict[str, list[str]] = {}
        texts = [m["content"] for m in msgs if m["role"] in ("user", BLOCK_ROLE)]
        for t in texts:
            for line in t.splitlines():
                for c in TRAIN_CONCEPTS:
                    for s in c.statements:
                        if hit := _pattern(s).fullmatch(line.removeprefix("User: ")):
                            values.setdefault(c.name, []).append(hit.group(1))
        for name, vs in values.items():
            vs = list(dict.fromkeys(vs))  # a block per question repeats lines
            if len(vs) > 1:
                c = next(x for x in TRAIN_CONCEPTS if x.name == name)
                replies = [msgs[i + 1]["content"] for i, m in enumerate(msgs) if m["role"] == "user" and m["content"] in c.questions]
                assert replies and all(mentions(r, vs[-1]) and not mentions(r, vs[0]) for r in replies), (vs, replies)
                seen += 1
    assert seen > 10


def test_details_come_one_to_four_and_often_of_the_same_kind() -> None:
    counts, same = Counter(), 0
    for kind, msgs in dialogues(300, 4, TRAIN_CONCEPTS):
        if kind != "window":
            continue
        said = [c for m in msgs if m["role"] == "user" for c in TRAIN_CONCEPTS if any(_pattern(s).fullmatch(m["content"]) for s in c.statements)]
        counts[len(said)] += 1
        same += len({c.kind for c in said}) < len(said)
    assert set(counts) == {1, 2, 3, 4} and same > 20, counts


def test_without_draws_the_mix_of_a_run_from_before_the_concepts_it_names(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import main

    before = tuple(c for c in TRAIN_CONCEPTS if c.name not in HOLIDAY)
    write(tmp_path, train=80, eval_n=2, seed=3, anchors=ANCHORS, without=HOLIDAY)
    rows = [json.loads(x)["messages"] for x in (tmp_path / "train.jsonl").read_text().splitlines()]
    assert rows == [m for _, m in dialogues(80, 3, before, ANCHORS)]
    assert json.loads((tmp_path / "stats.json").read_text())["without"] == sorted(HOLIDAY)
    write(tmp_path, train=80, eval_n=2, seed=3, anchors=ANCHORS)  # all concepts: a different draw, the days in it
    text = (tmp_path / "train.jsonl").read_text()
    assert "bake sale" in text and [json.loads(x)["messages"] for x in text.splitlines()] != rows
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "x"), "--without", "choir,glovebox"])
    assert e.value.code == 2 and "--without glovebox: no such training concept" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_mix_is_seeded_and_loads_as_training_data(tmp_path: Path) -> None:
    assert dialogues(20, 1, TRAIN_CONCEPTS, ANCHORS) == dialogues(20, 1, TRAIN_CONCEPTS, ANCHORS)
    assert dialogues(20, 1, TRAIN_CONCEPTS, ANCHORS) != dialogues(20, 2, TRAIN_CONCEPTS, ANCHORS)
    from agent.runtime.checkpoint import load_model
    from agent.train.data import load_documents

    write(tmp_path, train=30, eval_n=5, seed=0, anchors=ANCHORS)
    lm = load_model("tiny")
    docs, report = load_documents([str(tmp_path / "train.jsonl")], lm.tokenizer, lm.template, on_bad="error")
    assert report.chats == 30 and not report.bad


# ---- the teacher's replies: batched and resumable -------------------------------------------


def test_teacher_replies_are_cleaned() -> None:
    from recipes.answer.teacher import clean

    assert clean("Heat a pan. Crack the egg in.", True) == "Heat a pan. Crack the egg in."
    assert clean("Heat a pan and add oil. Crack the egg in and wait for a bit", False) == "Heat a pan and add oil."
    assert clean("I like the sea very much. I like the sea very much. I like", False) is None  # a greedy loop
    assert clean("You will need:\n\n- A ruler\n- A pencil\n- A ruler\n- A ruler\n\nThen fold it.", True) is None
    assert clean("A mix with a twist of a traditional breakfast, then a twist of a traditional breakfast again, "
                 "and a twist of a traditional breakfast.", True) is None


def test_teacher_resumes_where_it_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from agent.runtime.checkpoint import load_model, save_model_dir
    from recipes.answer import teacher

    model_dir = tmp_path / "tiny"
    save_model_dir(load_model("tiny"), model_dir)
    monkeypatch.setattr(teacher, "REPLY_TOKENS", 8)
    out = tmp_path / "replies.jsonl"
    teacher.main(["-m", str(model_dir), "--out", str(out), "--batch", "2", "--limit", "3"])
    first = [json.loads(x)["request"] for x in out.read_text().splitlines()]
    teacher.main(["-m", str(model_dir), "--out", str(out), "--batch", "2", "--limit", "2"])
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["request"] for r in rows] == list(ANCHOR_REQUESTS[:5]) and first == list(ANCHOR_REQUESTS[:3])
    assert all(set(r) == {"request", "reply"} for r in rows)


def test_measure_runs_the_probes_own_conversations_over_the_second_set() -> None:
    from agent.probes import natural
    from agent.runtime.checkpoint import load_model
    from recipes.answer.measure import concept_set

    lm = load_model("tiny")
    with concept_set("heldout2"):
        chosen = natural.plan(0, 0, len(HELDOUT2_CONCEPTS))
        assert {c.name for c in chosen} == {c.name for c in HELDOUT2_CONCEPTS}
        conv = natural.build_conversation(lm, chosen[0], 0, 0, 0)
        assert conv.absent.name in {c.name for c in HELDOUT2_CONCEPTS}
        pool = HELDOUT2_VALUES.get(conv.concept.kind)
        assert conv.value in pool if pool else re.fullmatch(r"\d{6}", conv.value)
    assert natural.CONCEPTS is PROBE_CONCEPTS  # put back


def test_measure_back_counts_from_the_statement_to_the_question() -> None:
    from agent.probes import natural
    from agent.runtime.checkpoint import load_model
    from recipes.answer.measure import back

    lm = load_model("tiny")
    tok, tpl = lm.tokenizer, lm.template
    for d in (0, 64, 200):
        for t, c in enumerate(natural.plan(0, d, 28)):  # trial 26 at d 0 states 'Amber has always been ...'
            conv = natural.build_conversation(lm, c, 0, d, t)
            question = len(tpl.message(tok, "user", conv.question))
            filler = len(conv.ids) - len(tpl.message(tok, "system", "", first=True)) - sum(n for *_, n in conv.said)
            b = back(lm, conv)
            # at least the filler, the question and the statement turn itself; at most all the turns
            assert filler + question < b <= len(conv.ids) + question - len(tpl.message(tok, "system", "", first=True))
            if not conv.distractors:  # the statement is the first turn after the system's
                assert b == len(conv.ids) + question - len(tpl.message(tok, "system", "", first=True))
            if d:
                assert filler >= d


def test_ablate_changes_one_thing_at_a_time_and_asks_each_variant(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from agent.probes import natural
    from agent.runtime.checkpoint import load_model, save_model_dir
    from recipes.answer.ablate import NEUTRAL, main, variants

    lm = load_model("tiny")
    tok, tpl = lm.tokenizer, lm.template
    t, c = next((t, c) for t, c in ((t, natural.build_conversation(lm, c, 0, 64, t)) for t, c in enumerate(natural.plan(0, 64, 26)))
                if len(c.distractors) == 2)
    got = dict(variants(lm, c))
    assert got["as measured"] is c
    others = [body for role, body, _ in c.said if role == "user" and not mentions(body, c.value)]
    for body in others:  # the other statement gone, every other token kept
        v = got[f"neutral for {body!r}"]
        assert NEUTRAL in tok.decode(v.ids) and body not in tok.decode(v.ids)
        assert v.ids[-sum(len(tpl.message(tok, p.role, p.text)) for p in c.pieces):] == \
            c.ids[-sum(len(tpl.message(tok, p.role, p.text)) for p in c.pieces):]
    swapped = got["asked and last other swapped"]
    assert sorted(swapped.ids) == sorted(c.ids) and swapped.ids != c.ids
    cuts = [(int(k.split()[4]), v) for k, v in got.items() if k.startswith("small talk cut")]
    assert cuts[0][0] == 0 and [n for n, _ in cuts] == sorted(n for n, _ in cuts) and cuts[-1][0] < c.filler_tokens + 64
    assert all(v.said == c.said and len(v.ids) < len(c.ids) for _, v in cuts)
    model_dir = tmp_path / "tiny"
    save_model_dir(lm, model_dir)
    main(["-m", str(model_dir), "--set", "probe", "--distance", "64", "--trials", "26", str(t), "--out", str(tmp_path / "a.json")])
    rows = json.loads((tmp_path / "a.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == list(got) and all(r["value"] == c.value for r in rows)
    assert all(r["kind"] in ("recalled", "refused", "wrong") for r in rows)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["-m", str(model_dir), "--trials", "26", "30"])
    assert exc.value.code == 2 and "trial 30: give a trial number from 0 to 25 (--trials 26)" in capsys.readouterr().err
    (tmp_path / "torn.safetensors").write_bytes(b"\x10\x00\x00")
    for delta, said in (("gone.safetensors", "No such file"), ("torn.safetensors", "torn.safetensors")):
        with pytest.raises(SystemExit, match=f"^error: .*{said}") as exc:
            main(["-m", str(model_dir), "--delta", str(tmp_path / delta), "--trials", "26", "0"])
        assert "\n" not in str(exc.value.code)


def test_mean_of_lora_deltas_averages_factors_and_refuses_mismatches(tmp_path: Path) -> None:
    import torch

    from agent.runtime.delta import DeltaError, read_delta, write_delta
    from recipes.answer.mean import main, mean_lora

    def lora(path: Path, scale: float, rank: int = 2) -> Path:
        write_delta(path, {"w.lora_A": torch.full((rank, 3), scale), "w.lora_B": torch.full((4, rank), 2 * scale)}, "lora")
        return path

    a, b = lora(tmp_path / "a.safetensors", 1.0), lora(tmp_path / "b.safetensors", 3.0)
    mean = mean_lora([a, b])
    assert torch.equal(mean["w.lora_A"], torch.full((2, 3), 2.0)) and torch.equal(mean["w.lora_B"], torch.full((4, 2), 4.0))
    main([str(a), str(b), "--out", str(tmp_path / "m.safetensors")])
    tensors, fmt = read_delta(tmp_path / "m.safetensors")
    assert fmt == "lora" and torch.equal(tensors["w.lora_A"], mean["w.lora_A"])
    with pytest.raises(DeltaError, match="another rank"):
        mean_lora([a, lora(tmp_path / "r4.safetensors", 1.0, rank=4)])
    write_delta(tmp_path / "add.safetensors", {"w": torch.zeros(4, 3)}, "add")
    with pytest.raises(DeltaError):
        mean_lora([a, tmp_path / "add.safetensors"])
    with pytest.raises(DeltaError, match="no such file"):
        mean_lora([a, tmp_path / "gone.safetensors"])
    with pytest.raises(SystemExit, match="at least two"):
        main([str(a), "--out", str(tmp_path / "x.safetensors")])


def test_check_and_teacher_refuse_a_missing_or_torn_delta_or_model_in_one_line_before_any_reply(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import recipes.answer.check as check
    from agent.runtime.checkpoint import load_model, save_model_dir
    from recipes.answer.teacher import main as teacher

    model_dir = tmp_path / "tiny"
    save_model_dir(load_model("tiny"), model_dir)
    asked: list[object] = []
    monkeypatch.setattr(check, "replies", lambda *a, **k: asked.append(a) or [])
    (tmp_path / "torn.safetensors").write_bytes(b"\x10\x00\x00")
    for args, said in ((["--delta", str(tmp_path / "gone.safetensors")], "No such file"),
                       (["--delta", str(tmp_path / "torn.safetensors")], "torn.safetensors"),
                       (["--tuned", str(tmp_path / "gone")], "gone")):
        with pytest.raises(SystemExit, match=f"^error: .*{said}") as exc:
            check.main(["-m", str(model_dir), *args])
        assert "\n" not in str(exc.value.code)
    assert asked == []  # the base's replies (minutes on the real model) were never started
    with pytest.raises(SystemExit, match="^error: .*nowhere") as exc:
        teacher(["-m", str(tmp_path / "nowhere"), "--out", str(tmp_path / "anchors.jsonl"), "--limit", "1"])
    assert "\n" not in str(exc.value.code) and not (tmp_path / "anchors.jsonl").exists()


def test_even_pairs_state_two_details_of_one_kind_drawn_evenly_over_kinds_and_ask_one(tmp_path: Path,
                                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from recipes.answer.mix import main

    kw = {"shares": {"window": 1.0}, "gap": (64, 244), "reach": 244}

    def pair_kinds(rows: list[tuple[str, list[dict]]]) -> list[str]:
        """The kind of the first question answered with a value, when a detail of its kind
        other than the asked one was stated too."""
        out = []
        for _, msgs in rows:
            stated = [c for m in msgs if m["role"] == "user"
                      for c in TRAIN_CONCEPTS if any(_pattern(p).fullmatch(m["content"]) for p in c.statements)]
            for i, m in enumerate(msgs):
                asked = next((c for c in TRAIN_CONCEPTS if m["role"] == "user"
                              and any(_pattern(p).fullmatch(m["content"]) for p in c.questions)), None)
                if asked is not None and not says_not_told(msgs[i + 1]["content"]):
                    if asked in stated and any(c.kind == asked.kind and c is not asked for c in stated):
                        out.append(asked.kind)
                    break
        return out

    even = pair_kinds(dialogues(300, 5, TRAIN_CONCEPTS, even_pairs=1.0, **kw))
    plain = pair_kinds(dialogues(300, 5, TRAIN_CONCEPTS, **kw))
    # Every even draw asks one of a same-kind pair first; without the option far fewer do.
    assert len(even) >= 250 and len(plain) < len(even) * 2 // 3
    # Every kind comes about as often (13 kinds: 1 in 13 each); without it the twelve person
    # concepts made a quarter of the pairs.
    counts = Counter(even)
    assert len(counts) == 13 and min(counts.values()) >= len(even) // 26 and max(counts.values()) <= len(even) // 6
    assert plain.count("person") > len(plain) // 5
    assert dialogues(50, 5, TRAIN_CONCEPTS, even_pairs=0.0, **kw) == dialogues(50, 5, TRAIN_CONCEPTS, **kw)
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x"), "--even-pairs", "2"])
    assert exc.value.code == 2 and "--even-pairs 2.0: give a share from 0 to 1" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_long_doc_passes_the_gap_as_pasted_prose_and_keeps_replies_right(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--long-doc 1: every long dialogue's last gap is pasted prose (weight-0 acknowledgements,
    no stated value in it) and each reply is still right; 0 draws the chat gap as before; the
    option needs --long-share."""
    from recipes.answer.mix import DOC_ACKS, DOC_LEADS, main

    rows = dialogues(40, 8, TRAIN_CONCEPTS, ANCHORS, shares={"long": 1.0}, long_doc=1.0)
    for _, msgs in rows:
        _check_dialogue("long", msgs)
        _only_answers_trained(msgs)
        pasted = [i for i, m in enumerate(msgs) if m["role"] == "user" and m["content"].startswith(DOC_LEADS)]
        assert pasted, msgs
        assert all(msgs[i + 1]["content"] in DOC_ACKS and msgs[i + 1]["weight"] == 0 for i in pasted)
        assert sum(size([msgs[i]]) for i in pasted) > 256  # the detail has left the window behind prose
    chat = dialogues(40, 8, TRAIN_CONCEPTS, ANCHORS, shares={"long": 1.0})
    assert not any(m["content"].startswith(DOC_LEADS) for _, msgs in chat for m in msgs if m["role"] == "user")
    with pytest.raises(SystemExit) as exc:
        main(["--out", str(tmp_path / "x"), "--long-doc", "0.5"])
    assert exc.value.code == 2 and "--long-doc 0.5" in capsys.readouterr().err and not (tmp_path / "x").exists()
