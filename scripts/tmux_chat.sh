# Shared by the chat demo scripts: drive the real `laplace chat` TUI in tmux, then export.
# Source it, then: demo_start OUT_DIR [MODEL]; say "text"...; demo_finish.
set -euo pipefail
LAPLACE=${LAPLACE:-.venv/bin/laplace}
S=${S:-laplace-demo}
CHAT_OPTS=${CHAT_OPTS:--o temperature 0}  # sampling options for the session

demo_start() {
    OUT=$1
    local model=${2:-}
    mkdir -p "$OUT/home"
    chmod 700 "$OUT/home"
    export LAPLACE_HOME="$OUT/home"
    tmux kill-session -t "$S" 2>/dev/null || true
    tmux new-session -d -s "$S" -x 160 -y 48 "LAPLACE_HOME=$LAPLACE_HOME $LAPLACE chat ${model:+-m $model} $CHAT_OPTS"
    sleep 12
}

say() { tmux send-keys -t "$S" -l "$1"; tmux send-keys -t "$S" Enter; sleep "${2:-4}"; }

demo_finish() {
    tmux capture-pane -t "$S" -p -S -200 > "$OUT/tmux_screen.txt"
    tmux send-keys -t "$S" C-q
    sleep 3
    tmux kill-session -t "$S" 2>/dev/null || true
    local id
    id=$($LAPLACE sessions list --json | python3 -c 'import json,sys; d=json.load(sys.stdin); d=d.get("sessions", d) if isinstance(d, dict) else d; s=d[0]; print(s.get("id") or s.get("uid"))')
    $LAPLACE sessions export "$id" > "$OUT/transcript.md"
    echo "session $id exported to $OUT/transcript.md"
}
