#!/usr/bin/env bash
# A 40-turn `laplace chat` session in plain speech, driven through tmux (the real TUI),
# then exported: everyday questions, details said in passing early on and asked ~25 turns
# later, two never given, one changed. Recall refresh is on (the default).
# Usage: scripts/natural_chat_demo.sh OUT_DIR [MODEL]   (LAPLACE_HOME is set to OUT_DIR/home)
set -euo pipefail
OUT=${1:-/tmp/laplace-natural-demo}
MODEL=${2:-}
mkdir -p "$OUT/home"
export LAPLACE_HOME="$OUT/home"
LAPLACE=${LAPLACE:-.venv/bin/laplace}
S=laplace-natural
tmux kill-session -t $S 2>/dev/null || true
tmux new-session -d -s $S -x 160 -y 48 "LAPLACE_HOME=$LAPLACE_HOME $LAPLACE chat ${MODEL:+-m $MODEL} -o temperature 0"
sleep 12
say() { tmux send-keys -t $S -l "$1"; tmux send-keys -t $S Enter; sleep "${2:-4}"; }
say "Hi there! How's your day going?"
say "My sister Vera is visiting me next week."
say "What should I make for breakfast tomorrow?"
say "I left my car on level 6 of the parking garage."
say "Any tips for drinking more water during the day?"
say "Do you have a good idea for a rainy weekend?"
say "My hotel room this week is 512."
say "How can I fall asleep faster?"
say "What is a good gift for a friend who likes books?"
say "How do I keep my houseplants alive?"
say "I'm allergic to walnuts, by the way."
say "What can I cook with rice and vegetables?"
say "How do I stay focused when working from home?"
say "Tell me something interesting about the ocean."
say "What is a good way to start running?"
say "How often should I water a cactus?"
say "Can you suggest a quick lunch for work?"
say "How do I prepare for a job interview?"
say "What's a good board game for four people?"
say "How can I save a little money each month?"
say "What should I pack for a weekend trip?"
say "How do I make a good cup of coffee?"
say "Why do people like going to the beach?"
say "What is a nice thing to do on a summer evening?"
say "How do I clean a kitchen quickly?"
say "Any advice for a long flight?"
say "What's a good way to learn a new language?"
say "Thanks, that's helpful."
say "Where did I park the car?"
say "What's my sister's name?"
say "Which room am I in at the hotel?"
say "What am I allergic to?"
say "What's my dog called?"
say "Actually, the hotel moved me to room 604."
say "What's my hotel room number now?"
say "When is my dentist appointment?"
say "What should I have for dinner tonight?"
say "How can I relax after a busy day?"
say "Do you remember where I parked?"
say "Thanks, that's all for today!"
tmux capture-pane -t $S -p -S -200 > "$OUT/tmux_screen.txt"
tmux send-keys -t $S C-q
sleep 3
tmux kill-session -t $S 2>/dev/null || true
ID=$($LAPLACE sessions list --json | python3 -c 'import json,sys; d=json.load(sys.stdin); d=d.get("sessions", d) if isinstance(d, dict) else d; s=d[0]; print(s.get("id") or s.get("uid"))')
$LAPLACE sessions export "$ID" > "$OUT/transcript.md"
echo "session $ID exported to $OUT/transcript.md"
