#!/usr/bin/env bash
# test_server_metrics.sh — GET /metrics passes `promtool check metrics` (Prometheus's own linter,
# Debian package prometheus) after traffic of every kind: completions and chat, streamed and not,
# n = 2, a 400, a 404, a 401 (the server has an API key) and a dropped stream; every histogram has
# its _bucket / _sum / _count series and no gauge ends in _total.
set -u
KILN=${KILN:-./kiln}
SHARED=${SHARED:-../shared}
MODEL=$SHARED/models/stories260K
command -v curl >/dev/null || { echo "curl not installed"; exit 77; }
command -v promtool >/dev/null || { echo "FAIL: promtool is missing (Debian package prometheus; scripts/install_deps.sh installs it)"; exit 1; }
log=$(mktemp); out=$(mktemp)
trap 'rm -f "$log" "$out"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null' EXIT
"$KILN" serve "$MODEL" --host 127.0.0.1 --port 0 --api-key k 2>"$log" &
pid=$!
for _ in $(seq 200); do grep -q "listening on" "$log" && break; sleep 0.1; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
[ -n "$url" ] || { echo "server did not start"; cat "$log"; exit 1; }
fail() { echo "FAIL: $*"; cat "$out"; exit 1; }
A=(-H "Authorization: Bearer k" -H "Content-Type: application/json")
curl -sf -m 30 "${A[@]}" "$url/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":8}' >/dev/null || fail "completion"
curl -sfN -m 30 "${A[@]}" "$url/v1/chat/completions" -d '{"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"n":2,"stream":true}' >/dev/null || fail "stream"
curl -s -m 30 "${A[@]}" "$url/v1/completions" -d '{"model":"stories260K","prompt":"x","max_tokens":-1}' | grep -q invalid || fail "400"
curl -s -m 30 "${A[@]}" "$url/v1/nothing" >/dev/null
curl -s -m 30 "$url/v1/models" | grep -q invalid_api_key || fail "401"
curl -sN -m 30 "${A[@]}" "$url/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":300,"stream":true}' | head -c 80 >/dev/null
sleep 0.3
curl -sf -m 30 "$url/metrics" >"$out" || fail "/metrics"
promtool check metrics <"$out" || fail "promtool check metrics"
for h in kiln_time_to_first_token_seconds kiln_inter_token_latency_seconds kiln_batch_size_steps; do
    for part in _bucket _sum _count; do grep -q "^$h$part" "$out" || fail "histogram $h has no $part series"; done
done
grep -q '^kiln_requests_total{code="401"} [1-9]' "$out" || fail "the 401 is not counted"
kill -TERM "$pid"; wait "$pid"; pid=
echo "promtool check metrics: clean ($(grep -c '^# TYPE' "$out") metric families)"
