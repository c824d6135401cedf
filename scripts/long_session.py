"""Make a long session cheaply, to measure how fast `laplace ask -c` resumes it.

    export LAPLACE_HOME=/tmp/latency-home
    python scripts/long_session.py --turns 50            # one process: a new session, then messages
    LAPLACE_TIMINGS=1 laplace ask -c "What did I ask first?" -o max_new_tokens 1

The session is written exactly as `laplace ask` writes one (the same service, store and
model, in one process so the model loads once): a new session with a system prompt, then
ordinary questions, each answered with at most `--max-tokens` tokens, until the session
holds `--turns` user and assistant turns (as `laplace sessions list` counts them; the
system turn comes on top). With the default
model and 12-token replies, 50 turns take about a minute alone on 2 cores.
The second command prints the first-token latency broken into its parts (agent/timings.py).
"""

from __future__ import annotations

import argparse
import sys
import time

QUESTIONS = [
    "My name is Ada and I keep bees in Lisbon. What should I plant for them in spring?",
    "Which of those flowers survives a dry summer best?",
    "How many hives can a small garden of 200 square metres support?",
    "What is a good first book about beekeeping?",
    "Remind me: where do I keep my bees?",
    "How do I tell a queen cell from a drone cell?",
    "What does a hive smoker actually do to the bees?",
    "Can I harvest honey in the first year?",
    "How should I store honey so it does not ferment?",
    "What is the difference between wax moths and varroa mites?",
    "Write one sentence for the label of my honey jars.",
    "What was my name again?",
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--turns", type=int, default=50, help="user and assistant turns in the session (default 50)")
    ap.add_argument("--max-tokens", type=int, default=12, help="the longest reply, in tokens (default 12)")
    ap.add_argument("-m", "--model", default=None, help="model (default: the default model)")
    args = ap.parse_args()
    if args.turns < 2 or args.turns % 2:
        ap.error("--turns must be an even number of at least 2 (a question and its reply each)")

    from agent.cli.chat import open_service
    from agent.settings import Settings

    settings = Settings.from_env()
    settings.ensure_home()
    service, _ = open_service(settings, model=args.model, session=None, cont=False, device="auto",
                              options=[("max_new_tokens", str(args.max_tokens)), ("temperature", "0")],
                              rebuild_state=False, system="You are a helpful assistant. Answer briefly.")
    t0 = time.perf_counter()
    try:
        for i in range(args.turns // 2):
            for _ in service.send(QUESTIONS[i % len(QUESTIONS)]):
                pass
            print(f"\r{2 * i + 2}/{args.turns} turns", end="", file=sys.stderr, flush=True)
        view = service.session
    finally:
        service.close()
        service.store.close()
    assert view is not None
    print(f"\nsession {view.uid[:8]}: {view.turns} turns, {view.tokens_folded:,} tokens, "
          f"made in {time.perf_counter() - t0:.0f} s; resume it with: LAPLACE_TIMINGS=1 laplace ask -c 'MESSAGE'",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
