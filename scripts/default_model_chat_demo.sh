#!/usr/bin/env bash
# A 40+ turn `laplace chat` session with the bundled default model, driven through tmux
# (the real TUI, no -m), then exported. Facts are said early and asked ~30 turns later.
# Usage: scripts/default_model_chat_demo.sh OUT_DIR   (LAPLACE_HOME is set to OUT_DIR/home)
set -euo pipefail
OUT=${1:-/tmp/laplace-chat-demo}
mkdir -p "$OUT/home"
export LAPLACE_HOME="$OUT/home"
LAPLACE=${LAPLACE:-.venv/bin/laplace}
S=laplace-demo
tmux kill-session -t $S 2>/dev/null || true
tmux new-session -d -s $S -x 160 -y 48 "LAPLACE_HOME=$LAPLACE_HOME $LAPLACE chat -o temperature 0"
sleep 12
say() { tmux send-keys -t $S -l "$1"; tmux send-keys -t $S Enter; sleep "${2:-4}"; }
say "Hi! By the way, the code for the back door is 48213."
say "My sister's name is Lena."
say "How are you today?"
say "Can you give me a tip for sleeping better?"
say "What is a list in Python?"
say "Just so you know, my room number is 417."
say "Tell me about the json module."
say "How do I read a file in Python?"
say "What should I cook for dinner?"
say "What is a function?"
say "Tell me a fun fact."
say "How do I stay focused while working?"
say "What does a dictionary do?"
say "Any advice for a long flight?"
say "What is version control?"
say "How do I sort a list?"
say "Why is my program slow?"
say "Tell me about the zipfile module."
say "How do I keep my plants alive?"
say "What is a good habit to start?"
say "Should I write tests for my code?"
say "I feel a bit tired."
say "What is an error message?"
say "Can you help me plan my week?"
say "How do I make a good cup of tea?"
say "What is a good way to learn a language?"
say "Tell me about the shutil module."
say "I have a meeting soon."
say "Thanks for the help."
say "What is the weather like?"
say "What is the code for the back door?"
say "What is my sister's name?"
say "What is my room number?"
say "What is my dog's name?"
say "Update: my room number is now 238."
say "What is the pin for the garage safe?"
say "What is my room number?"
say "Do you remember the code for the back door?"
say "Thanks, that is all for now."
say "Tell me about the csv module."
say "What is my sister's name again?"
tmux capture-pane -t $S -p -S -200 > "$OUT/tmux_screen.txt"
tmux send-keys -t $S C-q
sleep 3
tmux kill-session -t $S 2>/dev/null || true
ID=$($LAPLACE sessions list --json | python3 -c 'import json,sys; d=json.load(sys.stdin); d=d.get("sessions", d) if isinstance(d, dict) else d; s=d[0]; print(s.get("id") or s.get("uid"))')
$LAPLACE sessions export "$ID" > "$OUT/transcript.md"
echo "session $ID exported to $OUT/transcript.md"
