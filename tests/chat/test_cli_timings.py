"""`LAPLACE_TIMINGS=1`: a resumed `ask` prints where its first token's time went, to stderr,
after the reply; without it, nothing; and recording stops with the command."""

from __future__ import annotations

from agent import timings

from .test_cli_ask import laplace

PARTS = ("start-up: interpreter", "start-up: command line", "store: open", "model: load", "built and up to date", "session: resume", "hash chain",
         "state: read", "recall refresh: search", "message: prefill", "reply: prefill", "first token sampled",
         "first token printed", "total")


def test_a_resumed_ask_prints_its_breakdown_to_stderr(monkeypatch):
    assert laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "3", "hello").exit_code == 0
    monkeypatch.setenv("LAPLACE_TIMINGS", "1")
    res = laplace("ask", "-c", "-o", "max_new_tokens", "3", "-o", "temperature", "0", "and again")
    assert res.exit_code == 0, res.output
    assert "timings" not in res.stdout
    report = res.stderr[res.stderr.index("timings ("):]
    for part in PARTS:
        assert part in report, (part, report)
    # in the order they happened: the state is loaded before the message is read, the first
    # token printed last
    at = [report.index(p) for p in ("session: resume", "message: prefill", "reply: prefill", "first token printed")]
    assert at == sorted(at)
    assert not timings.enabled()  # the command's end stopped recording


def test_the_start_up_splits_at_the_end_of_the_cli_imports():
    from agent.cli import _IMPORTED_AT

    rec = timings.enable(imported_at=_IMPORTED_AT)
    try:
        imports, parsing = rec.phases[0], rec.phases[1]
        assert imports.name.startswith("start-up: interpreter") and parsing.name.startswith("start-up: command line")
        assert imports.start == 0 and parsing.start == imports.seconds and parsing.seconds >= 0
    finally:
        import io

        timings.finish(io.StringIO())
    rec = timings.enable(imported_at=None)  # nothing to split at: one start-up phase, as before
    try:
        assert [p.name for p in rec.phases] == ["start-up (interpreter, laplace's CLI imports)"]
    finally:
        import io

        timings.finish(io.StringIO())


def test_no_report_without_the_variable(monkeypatch):
    monkeypatch.delenv("LAPLACE_TIMINGS", raising=False)
    res = laplace("ask", "-m", "tiny", "-o", "max_new_tokens", "2", "hello")
    assert res.exit_code == 0 and "timings" not in res.stderr


def test_phases_nest_and_cost_nothing_when_off():
    assert not timings.enabled()
    with timings.phase("ignored"):
        timings.mark("ignored too")
    rec = timings.enable()
    try:
        with timings.phase("outer"):
            with timings.phase("inner"):
                timings.mark("point")
                timings.mark("point")  # once
        assert [(p.name, p.depth) for p in rec.phases[1:]] == [("outer", 0), ("inner", 1), ("point", 2)]
        assert all(p.seconds is not None and p.seconds >= 0 for p in rec.phases if p.name != "point")
    finally:
        import io

        out = io.StringIO()
        timings.finish(out)
    assert "outer" in out.getvalue() and "ignored" not in out.getvalue() and not timings.enabled()


def test_a_long_running_command_stops_adding_phases():
    rec = timings.enable()
    try:
        for i in range(timings.MAX_PHASES + 50):
            with timings.phase(f"request {i}"):
                pass
        assert len(rec.phases) == timings.MAX_PHASES
    finally:
        import io

        timings.finish(io.StringIO())
