"""`laplace probe natural`: everyday details in held-out phrasings, refresh off and on, on tiny."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from agent.cli import app
from agent.probes import natural
from agent.probes.natural import build_conversation, plan, render, run_natural, score_absent, score_stated
from agent.probes.natural_text import CONCEPTS, mentions, say, says_not_told

runner = CliRunner()
KEYS = {"n", "recall", "refused_stated", "wrong", "not_told", "invented"}


def test_held_out_phrasings_take_one_value_and_questions_none():
    for c in CONCEPTS:
        assert c.statements and c.questions
        assert all(s.count("{v}") == 1 for s in c.statements + c.updates), c.name
        assert all("{v}" not in q for q in c.questions), c.name
        assert "{v}" in c.answer and "{v}" not in c.not_told and says_not_told(c.not_told)


def test_report_structure_counts_and_both_refresh_rows(tiny):
    report = run_natural(tiny, distances=(64, 0), trials=3, refresh="both", horizon=100)
    json.dumps(report)  # serialisable
    assert report["probe"] == "natural" and report["model"]["fingerprint"] == tiny.fingerprint
    assert report["settings"]["distances"] == [0, 64] and report["horizon"] == {"tokens": 100, "source": "given"}
    assert [(r["mode"], r["distance"]) for r in report["rows"]] == [("off", 0), ("on", 0), ("off", 64), ("on", 64)]
    for r in report["rows"]:
        assert KEYS <= set(r) and r["n"] == 3
        assert r["recall"] + r["refused_stated"] + r["wrong"] == pytest.approx(1.0)
        assert r["not_told"] + r["invented"] == pytest.approx(1.0)
        assert ("refresh" in r) == (r["mode"] == "on")
    assert len(report["samples"]) == 4 * 2 * 2  # rows x 2 trials kept x (stated, never stated)
    text = render(report)
    assert "not told" in text and "turns older than 100 tokens" in text


def test_same_seed_same_report_and_a_new_seed_new_conversations(tiny):
    a = run_natural(tiny, distances=(0, 32), trials=2, refresh="off", seed=5)
    assert a == run_natural(tiny, distances=(0, 32), trials=2, refresh="off", seed=5)
    assert build_conversation(tiny, CONCEPTS[0], 5, 32, 0) != build_conversation(tiny, CONCEPTS[0], 6, 32, 0)
    assert "horizon" in a and a["horizon"] is None and all(r["mode"] == "off" for r in a["rows"])


def test_conversation_is_a_chat_session_with_the_never_stated_concept_absent(tiny):
    tok, tpl = tiny.tokenizer, tiny.template
    seen_distractors = False
    for t, c in enumerate(plan(0, 200, 26)):
        conv = build_conversation(tiny, c, 0, 200, t)
        stated = {conv.concept.name} | {n for n, _ in conv.distractors}
        assert conv.absent.name not in stated and conv.absent_question in conv.absent.questions
        assert conv.question in conv.concept.questions
        seen_distractors |= bool(conv.distractors)
        assert conv.value not in {v for _, v in conv.distractors}
        assert conv.ids[: len(tpl.message(tok, "system", "", first=True))] == tpl.message(tok, "system", "", first=True)
        said = sum(n for _, _, n in conv.said)
        assert conv.filler_tokens >= 200 and len(conv.ids) == len(tpl.message(tok, "system", "", first=True)) + said + conv.filler_tokens
        assert any(conv.value in body for role, body, _ in conv.said if role == "user")
    assert seen_distractors
    assert {c.name for c in plan(0, 200, 26)} == {c.name for c in CONCEPTS}  # trials spread evenly


def test_scoring_with_known_replies(tiny, monkeypatch):
    """Replace generation: the stated question is answered with its value, the other with
    "You haven't told me": recall and not_told are then 100%."""
    convs = []
    real_build = natural.build_conversation

    def build(lm, concept, seed, d, t):  # type: ignore[no-untyped-def]
        convs.append(real_build(lm, concept, seed, d, t))
        return convs[-1]

    def fake_greedy(model, state, prompts, n, stop_ids=()):  # type: ignore[no-untyped-def]
        # Rows 0..B-1 ask about the planted detail, rows B..2B-1 about one never stated.
        assert len(prompts) == 2 * len(convs)
        for c, p in zip(convs, prompts[len(convs):]):
            assert c.absent_question in tiny.tokenizer.decode(p)
        return [tiny.tokenizer.encode(f"It is {c.value.lower()}.") for c in convs] + \
            [tiny.tokenizer.encode("You haven't told me that.") for _ in convs]

    monkeypatch.setattr(natural, "build_conversation", build)
    monkeypatch.setattr(natural, "greedy_rows", fake_greedy)
    report = run_natural(tiny, distances=(0,), trials=6, refresh="off")
    row = report["rows"][0]
    assert row["recall"] == 1.0 and row["not_told"] == 1.0 and row["invented"] == 0.0
    assert score_stated("Your locker is number 1234.", "123") == "wrong"  # whole numbers only
    assert score_stated("You haven't told me your locker number.", "123") == "refused"
    assert score_absent("Your brother is called Hugo.") == "invented"
    assert mentions("your sister is vera.", "Vera") and say("{v} is my favorite color.", "navy").startswith("Navy")


def test_refresh_block_is_read_only_past_the_horizon_and_holds_the_value(tiny):
    far = run_natural(tiny, distances=(300,), trials=4, refresh="on", horizon=100)
    near = run_natural(tiny, distances=(300,), trials=4, refresh="on", horizon=10_000)
    assert near["rows"][0]["refresh"] == {"hit": 0.0, "blocks": 0.0, "blocks_never_stated": 0.0}
    assert far["rows"][0]["refresh"]["hit"] > 0 and far["rows"][0]["refresh"]["blocks"] >= far["rows"][0]["refresh"]["hit"]
    off = run_natural(tiny, distances=(300,), trials=4, refresh="off")
    # Without a block the replies are those of refresh off: the state is never changed.
    assert [s["reply"] for s in near["samples"]] == [s["reply"] for s in off["samples"]]


@pytest.mark.parametrize("args", [
    ["--distances", "0,abc"], ["--distances", "-5"], ["--distances", ","], ["--trials", "0"],
    ["--refresh", "maybe"], ["-m", "no-such-model"], ["--out", "/no/such/folder/report.json"],
])
def test_cli_bad_inputs_are_one_error_line(tmp_path, args):
    r = runner.invoke(app, ["probe", "natural", "-m", "tiny", *args], env={"LAPLACE_HOME": str(tmp_path), "LAPLACE_DEVICE": "cpu"})
    assert r.exit_code == 1 and "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ")


def test_cli_runs_and_writes_json(tmp_path):
    out = tmp_path / "n.json"
    r = runner.invoke(app, ["probe", "natural", "-m", "tiny", "--distances", "0,40", "--trials", "2", "--threads", "1",
                            "--refresh", "on", "--out", str(out)], env={"LAPLACE_HOME": str(tmp_path), "LAPLACE_DEVICE": "cpu"})
    assert r.exit_code == 0, r.output
    assert "laplace probe natural" in r.output and "not told" in r.output
    report = json.loads(out.read_text())
    assert [(x["mode"], x["distance"]) for x in report["rows"]] == [("on", 0), ("on", 40)]
    r = runner.invoke(app, ["probe", "natural", "-m", "tiny", "--distances", "0", "--trials", "1", "--refresh", "off", "--json"],
                      env={"LAPLACE_HOME": str(tmp_path), "LAPLACE_DEVICE": "cpu"})
    assert r.exit_code == 0 and json.loads(r.output)["rows"][0]["n"] == 1
