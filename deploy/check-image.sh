#!/usr/bin/env bash
# Build the image, run it, send bids to its server, stop it with SIGTERM while they are in
# flight, and check the drain lost nothing: every request answered 200, no hold left open, the
# ledger reconciles, and what the answers say was charged is what the ledger spent.
#
#   deploy/check-image.sh                           # FROM python:3.11-slim
#   BASE_IMAGE=localhost/inference-auctions-base:bookworm deploy/check-image.sh
#
# Needs podman (or PODMAN=docker) and python3. BUILD=0 runs an image already built (IMAGE).
# Build secrets: CA_BUNDLE=/path/ca.crt for an index behind a proxy with its own authority.
# `pytest -m deploy` runs it (tests/deploy/).
set -euo pipefail
cd "$(dirname "$0")/.."

PODMAN="${PODMAN:-podman}"
IMAGE="${IMAGE:-localhost/inference-auctions:check}"
BASE_IMAGE="${BASE_IMAGE:-python:3.11-slim}"
REQUESTS="${REQUESTS:-8}"
PORT="${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
name="inference-auctions-check-$$"
volume="$name-ledger"
work="$(mktemp -d)"

cleanup() {
  "$PODMAN" rm --force --ignore "$name" >/dev/null 2>&1 || true
  "$PODMAN" volume rm --force "$volume" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

if [ "${BUILD:-1}" = 1 ]; then
  secret=()
  [ -n "${CA_BUNDLE:-}" ] && secret=(--secret "id=ca,src=$CA_BUNDLE")
  started=$(date +%s)
  # Docker's image format keeps HEALTHCHECK (OCI's has no such field).
  "$PODMAN" build --quiet --format docker --network host "${secret[@]}" \
    --build-arg "BASE_IMAGE=$BASE_IMAGE" -f deploy/Containerfile -t "$IMAGE" . >/dev/null
  echo "built $IMAGE from $BASE_IMAGE in $(( $(date +%s) - started )) s"
fi

"$PODMAN" volume create "$volume" >/dev/null
# The emulator at its real speed (an H100 serving a 32B model), so that the bids below are
# still generating when SIGTERM arrives.
"$PODMAN" run --detach --name "$name" --publish "127.0.0.1:$PORT:8000" \
  --volume "$volume:/var/lib/inference-auction" \
  -e INFERENCE_AUCTION_MAX_WAIT_MS=200 "$IMAGE" serve --log-format json >/dev/null

echo "waiting for the server's /health on 127.0.0.1:$PORT"
ready=0
for _ in $(seq 1 120); do
  if python3 -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.5
done
[ "$ready" = 1 ] || {
  "$PODMAN" logs "$name"; echo "the server did not become ready in 60 s" >&2; exit 1; }
[ "$("$PODMAN" inspect --format '{{.Config.User}}' "$name")" = auction ] || {
  echo "the server does not run as the user auction" >&2; exit 1; }

# The image's HEALTHCHECK (readiness), run by hand: podman runs it on a timer only with systemd.
"$PODMAN" healthcheck run "$name" && echo "HEALTHCHECK: healthy"

new_user() {
  "$PODMAN" exec "$name" inference-auction users create "$1" --budget 10 --period day \
    --format json | python3 -c 'import json,sys; print(json.load(sys.stdin)["api_key"])'
}
keys="$(new_user alice),$(new_user bob)"

# The bids go out together; SIGTERM follows once they are admitted, while they generate.
python3 - "$PORT" "$keys" "$REQUESTS" "$work/answers.json" <<'PY' &
import json, sys, threading, urllib.request
port, keys, count, out = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3]), sys.argv[4]
answers = [None] * count
def send(i):
    user = ("alice", "bob")[i % 2]  # two users, so that bids delay another's and cost
    body = json.dumps({"text": f"Request {i}: tell a long story.", "bid": f"0.0{i % 9 + 1}",
                       "sampling_params": {"max_new_tokens": 200}}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{port}/generate", body, method="POST",
        headers={"Authorization": f"Bearer {keys[i % 2]}", "Content-Type": "application/json",
                 "x-request-id": f"check-{i}"})
    try:
        with urllib.request.urlopen(request, timeout=120) as reply:
            answers[i] = {"user": user, "status": reply.status, "body": json.load(reply)}
    except Exception as error:
        answers[i] = {"user": user, "status": getattr(error, "code", None), "error": repr(error)}
threads = [threading.Thread(target=send, args=(i,)) for i in range(count)]
for t in threads: t.start()
for t in threads: t.join()
json.dump(answers, open(out, "w"))
PY
clients=$!
sleep 1.5
inflight="$(python3 -c "import json,urllib.request; print(json.load(urllib.request.urlopen('http://127.0.0.1:$PORT/health'))['inflight'])")"
echo "SIGTERM with $inflight requests at the engine"
stopped=$(date +%s)
"$PODMAN" stop --time 120 "$name" >/dev/null   # SIGTERM, SIGKILL only after 120 s
echo "the server drained and stopped in $(( $(date +%s) - stopped )) s"
wait "$clients"

"$PODMAN" logs "$name" > "$work/server.log" 2>&1
tail -n 2 "$work/server.log"
ledger=(run --rm --volume "$volume:/var/lib/inference-auction" "$IMAGE")
"$PODMAN" "${ledger[@]}" ledger reconcile >/dev/null
for user in alice bob; do
  "$PODMAN" "${ledger[@]}" ledger balance "$user" --format json > "$work/$user.json"
done
python3 - "$work" "$inflight" <<'PY'
import json, sys
work, inflight = sys.argv[1], int(sys.argv[2])
answers = json.load(open(f"{work}/answers.json"))
failed = [a for a in answers if a["status"] != 200]
assert not failed, f"requests lost in the drain: {failed}"
assert inflight > 0, "no request was in flight at SIGTERM: the check proves nothing"
for user in ("alice", "bob"):
    balance = json.load(open(f"{work}/{user}.json"))
    charged = sum(a["body"]["meta_info"]["auction"]["request_charge_micros"]
                  for a in answers if a["user"] == user)
    assert balance["held_micros"] == 0, balance
    assert balance["spent_this_period_micros"] == charged, (user, balance, charged)
    print(f"{user}: charged {charged} micro-credits, as the ledger says; nothing held")
# The JSON log lines of each request carry its id and its user.
lines = [json.loads(line) for line in open(f"{work}/server.log") if line.startswith("{")]
access = {l["request_id"]: l for l in lines if l["logger"] == "uvicorn.access"}
for i, answer in enumerate(answers):
    assert access[f"check-{i}"]["user"] == answer["user"], access.get(f"check-{i}")
print(f"{len(answers)} bids answered 200 through the drain; the ledger reconciles")
PY
