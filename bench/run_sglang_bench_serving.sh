#!/usr/bin/env bash
# Run SGLang's own load generator, `python -m sglang.bench_serving --backend sglang`, unchanged,
# against the auction server, then check the ledger.
#
#   bench/run_sglang_bench_serving.sh [SGLANG_DIR] [EXTRA bench_serving ARGS...]
#
# SGLANG_DIR (default $INFERENCE_AUCTION_SGLANG_HOME, else
# ~/.cache/inference-auctions/sglang-cpu-0.5.23) holds the separate SGLang virtualenv made by
# bench/setup_sglang_reference.sh, in SGLANG_DIR/.venv. The project's own virtualenv (.venv at
# the repository root, `make` creates it) runs the server.
#
# Steps, all on 127.0.0.1 and in a fresh temporary directory (removed at exit; set
# KEEP_TMP=1 to keep it):
#   1. start `inference-auction serve` (embedded SGLang emulator, --time-scale 0.01) on a
#      free loopback port with a new SQLite ledger, and wait for /health;
#   2. create user `bench` with a budget of 1000 credits and take its API key;
#   3. save an offline word-level tokenizer (bench/sglang_client_shim.py tokenizer);
#   4. run bench_serving (generated-shared-prefix: 8 groups x 16 prompts, 512-token system
#      prompts, 64-token questions, 16 output tokens, all sent at once, each bidding 0.01;
#      GSP_GROUPS, GSP_PROMPTS_PER_GROUP, GSP_SYSTEM_PROMPT_LEN, GSP_QUESTION_LEN and
#      GSP_OUTPUT_LEN change them)
#      with OPENAI_API_KEY set to the key, through bench/sglang_client_shim.py, which only
#      stubs out the torchvision import that CPU-only torch cannot satisfy;
#   5. require every request to have succeeded, print the ledger balance, require no funds
#      still held, and run `ledger reconcile`.
# Any failure exits non-zero. The server is stopped by a trap in every case.
#
# INFERENCE_AUCTION_* variables in the environment reach the server as usual (for example
# INFERENCE_AUCTION_ENGINE_URL to put a real SGLang server behind it).
#
# CLUSTER_WORKERS=N runs step 1 as `inference-auction cluster --workers N` instead: N emulated
# SGLang workers, an auction server in front of each, SMG in front of those (docs/SCALE-OUT.md),
# all on the one SQLite ledger; bench_serving then talks to SMG.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Absolute, because the run changes into a temporary folder.
SGLANG_DIR="$(realpath -m "${1:-${INFERENCE_AUCTION_SGLANG_HOME:-$HOME/.cache/inference-auctions/sglang-cpu-0.5.23}}")"
shift $(( $# > 0 ? 1 : 0 ))
EXTRA_ARGS=("$@")

SGLANG_PY="$SGLANG_DIR/.venv/bin/python"
PROJECT_PY="$REPO/.venv/bin/python"
IA="$REPO/.venv/bin/inference-auction"
SHIM="$REPO/bench/sglang_client_shim.py"

# The workload's size; the environment may shrink it (a small model's short context).
GROUPS_N="${GSP_GROUPS:-8}"
PER_GROUP="${GSP_PROMPTS_PER_GROUP:-16}"
SYSTEM_LEN="${GSP_SYSTEM_PROMPT_LEN:-512}"
QUESTION_LEN="${GSP_QUESTION_LEN:-64}"
OUTPUT_LEN="${GSP_OUTPUT_LEN:-16}"
NUM_PROMPTS=$(( GROUPS_N * PER_GROUP ))
BID="0.01"

die() { echo "run_sglang_bench_serving: $*" >&2; exit 1; }

[[ -x "$SGLANG_PY" ]] || die "no SGLang virtualenv at $SGLANG_DIR/.venv (run bench/setup_sglang_reference.sh $SGLANG_DIR)"
[[ -x "$IA" ]] || die "no $IA (run make in $REPO first)"
command -v curl >/dev/null || die "curl is needed"

START_SECONDS=$SECONDS
WORK="$(mktemp -d "${TMPDIR:-/tmp}/sglang-bench-serving.XXXXXX")"
SERVER_PID=""

cleanup() {
    local rc=$?
    if [[ -n "$SERVER_PID" ]] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -TERM "$SERVER_PID" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$SERVER_PID" 2>/dev/null || break
            sleep 0.2
        done
        if kill -0 "$SERVER_PID" 2>/dev/null; then
            kill -KILL "$SERVER_PID" 2>/dev/null || true
        fi
        wait "$SERVER_PID" 2>/dev/null || true
    fi
    if [[ $rc -ne 0 && -f "$WORK/server.log" ]]; then
        echo "--- last lines of the server log ($WORK/server.log) ---" >&2
        tail -n 30 "$WORK/server.log" >&2 || true
    fi
    if [[ "${KEEP_TMP:-0}" == "1" || $rc -ne 0 ]]; then
        echo "run_sglang_bench_serving: files kept in $WORK" >&2
    else
        rm -rf "$WORK"
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

DB_URL="sqlite:///$WORK/ledger.db"
PORT="$("$PROJECT_PY" -c 'import socket
s = socket.socket()
s.bind(("127.0.0.1", 0))
print(s.getsockname()[1])')"
BASE_URL="http://127.0.0.1:$PORT"
export NO_PROXY="127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}"
export no_proxy="$NO_PROXY"

if [[ -n "${CLUSTER_WORKERS:-}" ]]; then
    echo "== 1. SMG on $BASE_URL in front of $CLUSTER_WORKERS auction servers, ledger $DB_URL"
    "$IA" db upgrade --database-url "$DB_URL" >/dev/null
    "$IA" cluster --workers "$CLUSTER_WORKERS" --host 127.0.0.1 --port "$PORT" \
        --time-scale 0.01 --database-url "$DB_URL" --log-dir "$WORK/cluster-logs" \
        >"$WORK/server.log" 2>&1 &
    READY_PATH="/readiness"
else
    echo "== 1. server on $BASE_URL, ledger $DB_URL"
    INFERENCE_AUCTION_DATABASE_URL="$DB_URL" "$IA" serve --host 127.0.0.1 --port "$PORT" \
        --time-scale 0.01 >"$WORK/server.log" 2>&1 &
    READY_PATH="/health"
fi
SERVER_PID=$!
for _ in $(seq 240); do
    kill -0 "$SERVER_PID" 2>/dev/null || die "the server exited at start"
    curl -sf -o /dev/null "$BASE_URL$READY_PATH" && break
    sleep 0.5
done
curl -sf -o /dev/null "$BASE_URL$READY_PATH" || die "the server did not answer $READY_PATH within 120 s"

echo "== 2. user bench, budget 1000 credits"
KEY="$("$IA" users create bench --budget 1000 --format json --database-url "$DB_URL" \
    | "$PROJECT_PY" -c 'import json, sys; print(json.load(sys.stdin)["api_key"])')"
[[ -n "$KEY" ]] || die "no API key"

echo "== 3. offline tokenizer"
"$SGLANG_PY" "$SHIM" tokenizer "$WORK/tokenizer"

echo "== 4. sglang.bench_serving"
BENCH_CMD=(
    "$SGLANG_PY" "$SHIM" bench-serving
    --backend sglang --base-url "$BASE_URL"
    --dataset-name generated-shared-prefix
    --gsp-num-groups "$GROUPS_N" --gsp-prompts-per-group "$PER_GROUP"
    --gsp-system-prompt-len "$SYSTEM_LEN" --gsp-question-len "$QUESTION_LEN" --gsp-output-len "$OUTPUT_LEN"
    --tokenizer "$WORK/tokenizer"
    --extra-request-body "{\"bid\": \"$BID\"}"
    --num-prompts "$NUM_PROMPTS" --request-rate inf
    --disable-tqdm --cache-report
    --output-file "$WORK/result.jsonl"
    "${EXTRA_ARGS[@]}"
)
mkdir -p "$WORK/home"
# HOME: bench_serving caches generated prompts under ~/.cache/sglang, keyed without the
# tokenizer's contents; a fresh HOME keeps every run independent. No network: offline hub.
(
    cd "$WORK"
    env HOME="$WORK/home" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore \
        OPENAI_API_KEY="$KEY" "${BENCH_CMD[@]}"
) 2>&1 | tee "$WORK/bench_serving.log"
[[ -s "$WORK/result.jsonl" ]] || die "bench_serving wrote no result"
"$PROJECT_PY" - "$WORK/result.jsonl" "$NUM_PROMPTS" <<'EOF'
import json
import sys

result = json.loads(open(sys.argv[1]).read().splitlines()[-1])
want = int(sys.argv[2])
if result["completed"] != want:
    sys.exit(f"bench_serving: {result['completed']} of {want} requests succeeded")
print(f"bench_serving: {result['completed']}/{want} requests succeeded")
EOF

echo "== 5. ledger"
"$IA" ledger balance bench --database-url "$DB_URL"
"$IA" ledger balance bench --format json --database-url "$DB_URL" | "$PROJECT_PY" -c '
import json, sys
b = json.load(sys.stdin)
held = b.get("held_micros")
if held is None:
    sys.exit(f"no held_micros in the balance: {b}")
if held != 0:
    sys.exit(f"{held} micro-credits still held after every request finished")
'
"$IA" ledger reconcile --database-url "$DB_URL"
echo "== done in $(( SECONDS - START_SECONDS )) s"
