#!/usr/bin/env bash
# test_server_kv_sizing.sh — the context a request gets is what the KV pool can hold (issue 22): with
# a pool of one 16-token page (--kv-mem 40K) /v1/models reports max_model_len 16 (not the model's
# 512), a completion without max_tokens gets the pool's room (prompt + completion = 16, finish
# "length"), and asking for more than the pool holds is a 400 naming max_tokens.
set -u
KILN=${KILN:-./kiln}
SHARED=${SHARED:-../shared}
MODEL=$SHARED/models/stories260K
command -v curl >/dev/null || { echo "curl not installed"; exit 77; }
log=$(mktemp)
trap 'rm -f "$log"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null' EXIT
"$KILN" serve "$MODEL" --host 127.0.0.1 --port 0 --kv-mem 40K 2>"$log" &
pid=$!
for _ in $(seq 200); do grep -q "listening on" "$log" && break; sleep 0.1; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
[ -n "$url" ] || { echo "server did not start"; cat "$log"; exit 1; }
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
pool=$(grep -o '= [0-9]* tokens' "$log" | head -1 | grep -o '[0-9]*')
[ "$pool" = 16 ] || fail "expected a 16-token pool, the start-up line says '$pool'"
grep -q "context 16 tokens" "$log" || fail "the start-up line does not give the pool's context"
curl -sf "$url/v1/models" | grep -q '"max_model_len":16' || fail "/v1/models max_model_len is not the pool's 16"
r=$(curl -sf "$url/v1/completions" -H 'Content-Type: application/json' -d '{"model":"stories260K","prompt":"Once upon a time","temperature":0,"ignore_eos":true}')
echo "$r" | grep -q '"total_tokens":16' || fail "no max_tokens: not the pool's room: $r"
echo "$r" | grep -q '"finish_reason":"length"' || fail "no max_tokens: finish_reason: $r"
r=$(curl -s "$url/v1/completions" -H 'Content-Type: application/json' -d '{"model":"stories260K","prompt":"Once","max_tokens":100}')
echo "$r" | grep -q '"param":"max_tokens"' || fail "max_tokens above the pool: $r"
kill -TERM "$pid"; wait "$pid"; pid=
echo "pool of 16 tokens: max_model_len 16, a request without max_tokens gets the room, 100 is refused"
