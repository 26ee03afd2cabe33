#!/usr/bin/env bash
# test_server_start_stop.sh — `kiln serve` started, used (a completion, a stream, n = 2, a client
# that drops mid-stream, a trickled half request) and stopped with SIGTERM: exit 0, "stopped", and
# nothing on stderr from a sanitizer. Under `make check` ($KILN is the ASan + UBSan build) this is
# the LeakSanitizer check of a server start / stop (every allocation of the scheduler thread and of
# the HTTP threads freed at stop).
set -u
KILN=${KILN:-./kiln}
SHARED=${SHARED:-../shared}
MODEL=$SHARED/models/stories260K
command -v curl >/dev/null || { echo "curl not installed"; exit 77; }
[ -d "$MODEL" ] || { echo "no $MODEL"; exit 77; }
log=$(mktemp)
trap 'rm -f "$log"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null' EXIT
"$KILN" serve "$MODEL" --host 127.0.0.1 --port 0 --header-timeout 1 2>"$log" &
pid=$!
for _ in $(seq 200); do grep -q "listening on" "$log" && break; sleep 0.1; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
[ -n "$url" ] || { echo "server did not start"; cat "$log"; exit 1; }
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
curl -sf -m 30 "$url/health" | grep -q '"ok"' || fail "/health"
curl -sf -m 30 "$url/v1/completions" -d '{"model":"stories260K","prompt":"Once upon a time","max_tokens":8,"temperature":0}' \
    | grep -q '"completion_tokens":8' || fail "completion"
curl -sfN -m 30 "$url/v1/chat/completions" -d '{"model":"stories260K","messages":[{"role":"user","content":"Hi"}],"max_tokens":6,"n":2,"stream":true}' \
    | grep -q 'data: \[DONE\]' || fail "stream"
# a stream dropped after its first bytes, and a half-sent request left to its header deadline
curl -sN -m 30 "$url/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":400,"ignore_eos":true,"stream":true}' | head -c 100 >/dev/null
exec 3<>/dev/tcp/127.0.0.1/"${url##*:}" && printf 'GET /health HTTP/1.1\r\nHost: x\r\n' >&3
sleep 1.5
exec 3>&-
# one request still running when the stop comes (cancelled at the end of the grace period)
curl -sN -m 30 "$url/v1/completions" -d '{"model":"stories260K","prompt":"Once","max_tokens":500,"ignore_eos":true,"stream":true}' >/dev/null &
sleep 0.2
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] || fail "exit status $rc"
grep -q "stopped" "$log" || fail "no 'stopped' line"
if grep -q "Sanitizer\|runtime error" "$log"; then fail "sanitizer report"; fi
echo "ok: start, requests, stop: exit 0, no sanitizer report"
