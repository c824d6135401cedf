#!/usr/bin/env bash
# Issue 36's answer deltas on a lent GPU (the device tool: one H200, a bare machine, no network).
#
#   recipes/answer/device_run.sh smoke OUT   # random weights in the default's shapes: step times, the recipes run
#   recipes/answer/device_run.sh full OUT    # the teacher's GGUF -> base -> anchors -> mixes -> runs -> measures
#
# The GGUF (98 MB) does not fit one call's 64 MiB beside the working tree (39 MB): it is split here
# (split -b 25500000 -d -a 1 GGUF gpart.) into .xfer1/gpart.0 ... .xfer4/gpart.3 (ignored folders). A call
# removes the carried folders it does not name, but /tmp stays while the machine is warm (30 s after a
# call), so three short calls each carry one part and copy it to /tmp/parts (`cp .xferK/gpart.* /tmp/parts/`),
# and the call that runs `full` carries the last; `full` joins them and checks the sha256. Issue 36's
# 2026-12-04 lease: smoke 243 s, three copies ~7 s each, full 411 s (STEPS=150 TRAIN_N=6000 TEXT_N=600).
# smoke reads .xfer1/like: the default's config.json, tokenizer.json and chat_template.json (its shapes).
# gguf (pure Python) travels as a wheel in .whl. DEV=cpu PY=.venv/bin/python runs either mode here, cut down.
# Every step prints its wall time; everything kept is copied to OUT as it is made.
set -uo pipefail
MODE=${1:?smoke or full}
OUT=${2:?output folder}
DEV=${DEV:-cuda}
PY=${PY:-python3}
W=${W:-/tmp/answer}
GGUF_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$W" "$OUT"
export PYTHONUNBUFFERED=1
if [ -d .whl ] && ! $PY -c 'import gguf' 2>/dev/null; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
t0=$(date +%s)
say() { echo "[$(( $(date +%s) - t0 ))s] $*"; }
small=0; [ "$DEV" = cpu ] && small=1

if [ "$MODE" = smoke ]; then
  say "python $(python3 -V 2>&1), torch $($PY -c 'import torch; print(torch.__version__, torch.cuda.is_available())')"
  [ "$DEV" = cuda ] && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  rm -rf "$W/rand" && $PY -m recipes.answer.base --random .xfer1/like "$W/rand" || exit 1
  say "random base written"
  lim=$([ $small = 1 ] && echo 2 || echo 64)
  $PY -m recipes.answer.teacher -m "$W/rand" --out "$W/anch.jsonl" --batch $lim --limit $lim --device $DEV 2>&1 | tail -2
  say "teacher: $lim requests in one batch"
  $PY -m recipes.answer.mix --out "$W/mix" --train 3000 --eval 60 --seed 9 --text 100 | tail -c 300; echo
  say "mix written"
  steps=$([ $small = 1 ] && echo 2 || echo 30)
  bt=$([ $small = 1 ] && echo 1024 || echo 8192); mb=$([ $small = 1 ] && echo 2 || echo 16)
  common=(--tune lora --lora-rank 16 --seq-len 512 --batch-tokens $bt --micro-batch $mb --recompute off --pack rows
          --lr 1e-3 --warmup 3 --device $DEV)
  rm -rf "$W/cal"; $PY -m agent.train "$W/mix/train.jsonl" --model "$W/rand" --out "$W/cal" --steps $steps "${common[@]}" \
    --eval "$W/mix/eval.jsonl" --eval-every $steps 2>&1 | grep -E "^step|error|Error|memory|tok/s" | tail -4
  say "one run alone: $steps steps of $bt tokens (fp32)"
  if [ $small = 0 ]; then
    rm -rf "$W/calbf"; $PY -m agent.train "$W/mix/train.jsonl" --model "$W/rand" --out "$W/calbf" --steps 20 "${common[@]}" \
      --dtype bfloat16 2>&1 | grep -E "^step|error|bf16|bfloat" | tail -3
    say "one run alone: 20 steps, bf16 autocast"
    for k in 1 2 3; do
      rm -rf "$W/par$k"; $PY -m agent.train "$W/mix/train.jsonl" --model "$W/rand" --out "$W/par$k" --steps 20 "${common[@]}" \
        --lora-targets q_proj,k_proj,v_proj,o_proj,w1,w2,w3 --lora-rank 12 > "$W/par$k.log" 2>&1 &
    done
    wait; for k in 1 2 3; do grep -E "^step" "$W/par$k.log" | tail -1; done
    say "three runs at once (q/k too, rank 12): 20 steps each"
  fi
  $PY -m recipes.answer.measure -m "$W/rand" --delta "$W/cal/delta.safetensors" --distance 128 \
    --trials $([ $small = 1 ] && echo 2 || echo 52) --device $DEV --out "$OUT/smoke_measure.json" | head -c 600; echo
  say "measure: one distance"
  [ $small = 1 ] || $PY -m recipes.answer.check -m "$W/rand" --delta "$W/cal/delta.safetensors" --device $DEV | head -c 400; echo
  say "check done"
  exit 0
fi

# ---- full ----
P=${PARTS:-/tmp/parts}; cat $P/gpart.0 $P/gpart.1 $P/gpart.2 .xfer4/gpart.3 > "$W/teacher.gguf" || exit 1
echo "$GGUF_SHA  $W/teacher.gguf" | sha256sum -c - || { ls -la .xfer*; exit 1; }
rm -rf "$W/base"; $PY -m recipes.answer.base "$W/teacher.gguf" "$W/base" || exit 1
say "base built"
$PY -m recipes.answer.teacher -m "$W/base" --out "$W/anchors.jsonl" --batch 128 --device $DEV $([ $small = 1 ] && echo --limit 4) | tail -1
cp "$W/anchors.jsonl" "$OUT/"
say "anchors"
# The mix (one for every run): many more dialogues than the CPU runs saw, window-heavy, anchors that state details.
$PY -m recipes.answer.mix --out "$W/mixg" --train ${TRAIN_N:-24000} --eval 200 --seed 11 --anchors "$W/anchors.jsonl" \
  --not-told-share 0.35 --near-share 0.6 --anchor-share 0.25 --anchor-details 3 --window-share 0.75 --gap 0,200 \
  --text ${TEXT_N:-2400} | tail -c 400; echo
say "mix"
STEPS=${STEPS:-600}; [ $small = 1 ] && STEPS=2
bt=$([ $small = 1 ] && echo 1024 || echo 8192); mb=$([ $small = 1 ] && echo 2 || echo 16)
common=(--tune lora --seq-len 512 --batch-tokens $bt --micro-batch $mb --recompute off --pack rows --warmup 20
        --device $DEV --eval "$W/mixg/eval.jsonl" --eval-every $STEPS --save-every 100000)
run() {  # name, then its own options
  local name=$1; shift
  rm -rf "$W/$name"
  $PY -m agent.train "$W/mixg/train.jsonl" --model "$W/base" --out "$W/$name" --steps $STEPS "${common[@]}" "$@" > "$W/$name.log" 2>&1
  grep -E "^step" "$W/$name.log" | awk 'NR==1 || NR%100==0' ; grep -E "^step" "$W/$name.log" | tail -1
}
# A: fresh v/o/MLP adapters (what ships, trained far longer); B: q/k as well at rank 12 (14.6 MB);
# C: the shipped delta continued at a lower rate.
run A --lora-rank 16 --lr 1e-3 > "$W/A.sum" &
run B --lora-rank 12 --lr 1e-3 --lora-targets q_proj,k_proj,v_proj,o_proj,w1,w2,w3 > "$W/B.sum" &
run C --lora-rank 16 --lr 3e-4 --init-lora agent/models/smollm2/answer_delta.safetensors > "$W/C.sum" &
wait
for v in A B C; do echo "== $v"; cat "$W/$v.sum"; grep -E "error|Error" "$W/$v.log" | head -3; done
say "training"
for v in A B C; do
  [ -f "$W/$v/delta.safetensors" ] || continue
  cp "$W/$v/delta.safetensors" "$OUT/delta_$v.safetensors"
  (
    for d in 0 64 128 200; do
      $PY -m recipes.answer.measure -m "$W/base" --delta "$W/$v/delta.safetensors" --distance $d --trials $([ $small = 1 ] && echo 2 || echo 52) \
        --device $DEV --out "$W/m_${v}_$d.json" > /dev/null
    done
    for d in 0 128; do
      $PY -m recipes.answer.measure -m "$W/base" --delta "$W/$v/delta.safetensors" --set heldout2 --distance $d \
        --trials $([ $small = 1 ] && echo 2 || echo 28) --device $DEV --out "$W/m_${v}_h$d.json" > /dev/null
    done
    $PY -m recipes.answer.check -m "$W/base" --delta "$W/$v/delta.safetensors" --device $DEV --out "$W/c_$v.json" > /dev/null
  ) &
done
wait
say "measured"
$PY - "$W" "$OUT" <<'EOF'
import json, sys
from pathlib import Path
w, out = Path(sys.argv[1]), Path(sys.argv[2])
table = {}
for v in "ABC":
    row = {}
    for f in sorted(w.glob(f"m_{v}_*.json")):
        m = json.loads(f.read_text())
        row[f.stem.split("_", 2)[2]] = {"recall": m["stated"].get("recalled", 0), "not_told": m["never_stated"].get("not_told", 0),
                                         "inside": m.get("inside_window", {}).get("recalled")}
    c = w / f"c_{v}.json"
    if c.is_file():
        r = json.loads(c.read_text())
        row["check"] = {"before": {k: r["before"][k] for k in ("chat_loss", "text_ppl", "license_ppl", "invented", "over_refused") if k in r["before"]},
                        "after": {k: r["after"][k] for k in ("chat_loss", "text_ppl", "license_ppl", "invented", "over_refused") if k in r["after"]}}
    log = w / f"{v}.log"
    if log.is_file():
        row["log_tail"] = [x for x in log.read_text().splitlines() if x.startswith("step")][-1:]
    table[v] = row
(out / "results.json").write_text(json.dumps(table, indent=1))
print(json.dumps(table, indent=1))
EOF
tar czf "$OUT/measures.tgz" -C "$W" $(cd "$W" && ls m_*.json c_*.json *.log 2>/dev/null)
say "done"
