#!/usr/bin/env bash
# Run an SGLang frontend-language program (gen, run_batch of 4, select), unchanged, against the
# auction server, then check the ledger.
#
#   bench/run_sglang_frontend.sh [SGLANG_DIR]
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
#   2. create user `frontend` with a budget of 10 credits and take its API key;
#   3. run bench/sglang_frontend.py with SGLang's python: `sgl.RuntimeEndpoint(url, api_key=KEY)`
#      runs `gen`, `run_batch` of 4 and `select` (which the server refuses by name: the
#      emulator returns no logprobs);
#   4. require no funds still held, and run `ledger reconcile`.
# Any failure exits non-zero. The server is stopped by a trap in every case.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SGLANG_DIR="$(realpath -m "${1:-${INFERENCE_AUCTION_SGLANG_HOME:-$HOME/.cache/inference-auctions/sglang-cpu-0.5.23}}")"
SGLANG_PY="$SGLANG_DIR/.venv/bin/python"
PROJECT_PY="$REPO/.venv/bin/python"
IA="$REPO/.venv/bin/inference-auction"

die() { echo "run_sglang_frontend: $*" >&2; exit 1; }

[[ -x "$SGLANG_PY" ]] || die "no SGLang virtualenv at $SGLANG_DIR/.venv (run bench/setup_sglang_reference.sh $SGLANG_DIR)"
[[ -x "$IA" ]] || die "no $IA (run make in $REPO first)"
command -v curl >/dev/null || die "curl is needed"

WORK="$(mktemp -d "${TMPDIR:-/tmp}/sglang-frontend.XXXXXX")"
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
        echo "run_sglang_frontend: files kept in $WORK" >&2
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

echo "== 1. server on $BASE_URL, ledger $DB_URL"
INFERENCE_AUCTION_DATABASE_URL="$DB_URL" "$IA" serve --host 127.0.0.1 --port "$PORT" \
    --time-scale 0.01 >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 120); do
    kill -0 "$SERVER_PID" 2>/dev/null || die "the server exited at start"
    curl -sf -o /dev/null "$BASE_URL/health" && break
    sleep 0.5
done
curl -sf -o /dev/null "$BASE_URL/health" || die "the server did not answer /health within 60 s"

echo "== 2. user frontend, budget 10 credits"
KEY="$("$IA" users create frontend --budget 10 --format json --database-url "$DB_URL" \
    | "$PROJECT_PY" -c 'import json, sys; print(json.load(sys.stdin)["api_key"])')"
[[ -n "$KEY" ]] || die "no API key"

echo "== 3. the sgl.function programs"
env HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONWARNINGS=ignore \
    "$SGLANG_PY" "$REPO/bench/sglang_frontend.py" "$BASE_URL" "$KEY"

echo "== 4. ledger"
"$IA" ledger balance frontend --format json --database-url "$DB_URL" | "$PROJECT_PY" -c '
import json, sys
held = json.load(sys.stdin).get("held_micros")
if held != 0:
    sys.exit(f"{held} micro-credits still held after every request finished")
'
"$IA" ledger reconcile --database-url "$DB_URL"
echo "== done"
