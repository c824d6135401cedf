"""`laplace probe run --refresh`: the recall-refresh arm beside the plain one, on tiny."""

from __future__ import annotations

import random

from agent.probes.fillers import make_filler
from agent.probes.report import build_report
from agent.probes.runner import run_suite
from agent.probes.suites import Suite
from agent.probes.table import render

SUITE = Suite("t", ("passkey", "update"), ("chat",), (0, 64, 256, 512), 4)


def test_refresh_rows_sit_beside_their_probe_and_recall_only_past_the_horizon(tiny):
    out = run_suite(tiny, SUITE, style="chat", refresh="both", refresh_horizon=100, refresh_tokens=200)
    report = build_report(out, tiny)
    assert report["suite"]["probes"] == ["passkey", "passkey+refresh", "update", "update+refresh"]
    assert report["suite"]["refresh"] == {"mode": "both", "horizon": 100, "horizon_source": "--refresh-horizon",
                                          "tokens": 200}
    cells = {(c["probe"], c["distance"]): c for c in report["cells"]}
    for probe in ("passkey", "update"):
        # The plant is still within the horizon: no block, the very same answers. (update's
        # first statement is past it at d=64, but the update, within it, supersedes it.)
        for d in (0, 64):
            on, off = cells[(probe + "+refresh", d)], cells[(probe, d)]
            assert on["refresh"]["blocks"] == 0 and on["lift"] == off["lift"] and on["top1"] == off["top1"]
        for d in (256, 512):  # past it: every trial's block repeats the fact, within the budget
            on, off = cells[(probe + "+refresh", d)], cells[(probe, d)]
            assert on["refresh"]["recalled"] == 1.0 and 0 < on["refresh"]["max_tokens"] <= 200
            assert on["lift"] != off["lift"]  # the state read the block before the question
    text = render(report)
    assert "passkey+refresh / chat" in text and "turns older than 100 tokens" in text


def test_refresh_off_leaves_the_report_as_it_was(tiny):
    plain = build_report(run_suite(tiny, SUITE, style="chat"), tiny)
    off = build_report(run_suite(tiny, SUITE, style="chat", refresh="off"), tiny)
    assert plain == off and "refresh" not in plain["suite"]
    assert all("+refresh" not in c["probe"] for c in plain["cells"])


def test_filler_pieces_cover_exactly_its_tokens(tiny):
    for name in ("chat", "grammar", "noise", "logs"):
        f = make_filler(name, tiny.tokenizer, tiny.template)
        ids, pieces = f.pieces(300, random.Random(4))
        assert ids == f.tokens(300, random.Random(4)) and len(ids) == 300
        assert pieces[0].start == 0 and all(a.end == b.start for a, b in zip(pieces, pieces[1:]))
        assert pieces[-1].end >= 300
