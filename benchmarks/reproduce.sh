#!/usr/bin/env bash
# Re-measure every number in benchmarks/README.md, one command per table.
#   benchmarks/reproduce.sh [offline|serve|knee|cpu|all]   (default all; results under $OUT)
# Embedded SmolLM2-135M, every request generating exactly max_tokens (ignore_eos), in
# bfloat16 as the tables were measured (DTYPE=auto: what `inflight serve` picks on this CPU,
# float32 without bf16 units). On 2 quiet CPU cores: knee ~4 min, serve ~10 min, offline ~25 min.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin/inflight}
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench-out}
DTYPE=${DTYPE:-bfloat16}
WHAT=${1:-all}
mkdir -p "$OUT"

offline() {  # static vs continuous on the same engine, offline, at max_num_seqs 16 and 64
  for mns in 16 64; do
    $BIN bench throughput --workload decode --max-num-seqs "$mns" --dtype "$DTYPE" --compare \
      --result-file "$OUT/offline-decode-mns$mns.json"
    $BIN bench throughput --workload chat --max-num-seqs "$mns" --dtype "$DTYPE" --modes continuous,static \
      --result-file "$OUT/offline-chat-mns$mns.json"
  done
  for mns in 16 64; do
    $BIN bench plot "$OUT/offline-decode-mns$mns.json" --out-dir "$OUT/offline-decode-mns$mns"
  done
  $PY benchmarks/results_table.py "$OUT"/offline-decode-mns{16,64}.json "$OUT"/offline-chat-mns{16,64}.json
}

serve() {  # static vs continuous through the server, all requests at once
  $BIN bench sweep --workload decode --max-num-seqs 16,64 --schedulings continuous,static --dtype "$DTYPE" \
    --goodput ttft:10000 tpot:200 --out-dir "$OUT/serve-decode"
  $PY benchmarks/results_table.py "$OUT/serve-decode/sweep.json"
}

knee() {  # max_num_seqs sweep on a reduced workload (64 requests, short outputs: ~2 min at 1)
  $BIN bench sweep --workload random --num-requests 64 --input-len 16:256 --output-len 8:48 \
    --length-dist lognormal --max-num-seqs 1,4,8,16,32,64 --goodput tpot:200 --dtype "$DTYPE" --out-dir "$OUT/knee"
  $PY benchmarks/results_table.py --knee "$OUT/knee/sweep.json"
}

cpu() {  # the four CPU serving workloads, this tree against BEFORE_REF, plus transformers
  local ref=${BEFORE_REF:-f611355} wl=../shared/workloads
  local flags=(--dtype "$DTYPE" --max-num-seqs 128 --max-num-batched-tokens 512)  # the tables' flags
  git worktree add -f "$OUT/before-src" "$ref" >/dev/null
  $PY benchmarks/cpu_serving.py --out "$OUT/cpu_serving_after.json"
  $PY benchmarks/cpu_serving.py --server-pythonpath "$OUT/before-src" --out "$OUT/cpu_serving_before.json"
  git worktree remove --force "$OUT/before-src"
  for w in decode chat prefix longprompt; do  # transformers' static generate, first 32 requests
    $PY benchmarks/offline_throughput.py --workload-file "$wl/$w.jsonl" --hf-only --hf-requests 32 "${flags[@]}" \
      --out "$OUT/hf_static_$w.json"
    $PY benchmarks/offline_throughput.py --workload-file "$wl/$w.jsonl" --num-requests 32 --hf-requests 0 "${flags[@]}" \
      --out "$OUT/inflight_first32_$w.json"
  done
}

case "$WHAT" in
  offline) offline ;;
  serve) serve ;;
  knee) knee ;;
  cpu) cpu ;;
  all) knee; serve; offline; cpu ;;
  *) echo "usage: $0 [offline|serve|knee|cpu|all]" >&2; exit 2 ;;
esac
