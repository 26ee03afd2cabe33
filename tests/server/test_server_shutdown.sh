#!/usr/bin/env bash
# test_server_shutdown.sh — graceful shutdown (SIGTERM) while a request runs: /health and a new
# completion, on new connections, are answered 503 at once (within 1 s, not after the grace period),
# the running request finishes normally, and the server exits 0.
set -u
KILN=${KILN:-./kiln}
command -v curl >/dev/null || { echo "curl not installed"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null' EXIT
# a model slow enough (~1-3 ms a token here) that 1500 tokens outlast the checks below
"$KILN" mkmodel --arch llama --dim 512 --ffn 1024 --layers 8 --heads 8 --kv-heads 4 --vocab 512 --seq 2048 "$T/m" > /dev/null 2>&1 || { echo "mkmodel failed"; exit 1; }
"$KILN" serve "$T/m" --host 127.0.0.1 --port 0 --shutdown-grace 60 --threads 1 2> "$T/log" &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$T/log" && break; sleep 0.1; done
port=$(sed -n 's/.*listening on http:\/\/[0-9.]*:\([0-9]*\).*/\1/p' "$T/log")
[ -n "$port" ] || { echo "server did not start"; cat "$T/log"; exit 1; }
curl -s "http://127.0.0.1:$port/v1/completions" -d '{"model":"m","prompt":[1,2,3],"max_tokens":1500,"ignore_eos":true}' > "$T/long.json" &
cpid=$!
sleep 0.5
kill -TERM "$pid"
sleep 0.2
t0=$(date +%s%N)
h=$(curl -s -m 5 -o "$T/h.json" -w "%{http_code}" "http://127.0.0.1:$port/health")
c=$(curl -s -m 5 -o "$T/c.json" -w "%{http_code}" "http://127.0.0.1:$port/v1/completions" -d '{"model":"m","prompt":[1],"max_tokens":2}')
dt=$(( ($(date +%s%N) - t0) / 1000000 ))
[ "$h" = 503 ] && grep -q shutting_down "$T/h.json" || { echo "/health during shutdown: $h $(cat "$T/h.json")"; exit 1; }
[ "$c" = 503 ] && grep -q server_shutting_down "$T/c.json" || { echo "a new completion during shutdown: $c $(cat "$T/c.json")"; exit 1; }
[ "$dt" -lt 1000 ] || { echo "the 503s took $dt ms"; exit 1; }
wait "$cpid"
grep -q '"finish_reason":"length"' "$T/long.json" || { echo "the running request did not finish: $(head -c 300 "$T/long.json")"; exit 1; }
wait "$pid"; rc=$?; pid=
[ $rc -eq 0 ] || { echo "server exited $rc"; exit 1; }
echo "503s answered in $dt ms during the grace period; the running request finished; exit 0"
