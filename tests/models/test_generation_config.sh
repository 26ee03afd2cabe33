#!/usr/bin/env bash
# generation_config.json's sampling defaults (issue 22): kiln serve uses its temperature / top_p /
# top_k / repetition_penalty for the fields a request leaves out (as vLLM does), the request's own
# fields win, top_k (vLLM's extension) is honoured, and bad values are refused naming file and field.
# The model: a synthetic glm4 checkpoint (no tokenizer: a completion's text is its token ids).
set -euo pipefail
PY=${PY:-/usr/bin/python3}
T=$(mktemp -d)
SRV=
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$T"' EXIT
M=$T/m
"$KILN" mkmodel --arch glm4 --preset tiny "$M" 2>/dev/null
PORT=$((20000 + RANDOM % 20000))
serve() {
    [ -n "$SRV" ] && { kill $SRV; wait $SRV 2>/dev/null || true; }
    "$KILN" serve "$M" --port $PORT >"$T/serve.log" 2>&1 &
    SRV=$!
    for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
    MODEL_ID=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
}
text() { # extra JSON fields → the completion's text
    curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\": \"$MODEL_ID\", \"prompt\": [1, 2, 3], \"max_tokens\": 16, \"seed\": 5 $1}" |
        "$PY" -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
serve
GREEDY=$(text ', "temperature": 0')
SAMPLED=$(text '')          # the server's default: temperature 1
TOPK1=$(text ', "top_k": 1') # top_k 1 is greedy whatever the temperature
[ "$SAMPLED" != "$GREEDY" ] || { echo "temperature 1 with seed 5 gave the greedy text; the test cannot tell defaults apart"; exit 1; }
[ "$TOPK1" = "$GREEDY" ] || { echo "top_k 1: '$TOPK1', greedy '$GREEDY'"; exit 1; }
echo "ok: top_k is honoured (top_k 1 = greedy)"
bad() { # extra JSON fields, the parameter the error must name, a phrase its message must hold
    curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
        -d "{\"model\": \"$MODEL_ID\", \"prompt\": [1, 2, 3], \"max_tokens\": 2 $1}" |
        "$PY" -c 'import json,sys; e=json.load(sys.stdin).get("error") or {}; p,m=sys.argv[1],sys.argv[2]
assert e.get("param") == p and e.get("type") == "invalid_request_error" and m in e.get("message", ""), e' "$2" "$3"
}
bad ', "top_k": -2' top_k "must be in [-1"
bad ', "top_k": 1.5' top_k "top_k"
bad ', "stop_token_ids": 5' stop_token_ids "must be an array"
bad ', "stop_token_ids": ["x"]' stop_token_ids "must be an integer"
bad ', "stop_token_ids": [-1]' stop_token_ids "token ids are in [0,"
bad ', "stop_token_ids": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]' stop_token_ids "at most 16"
curl -sf "http://127.0.0.1:$PORT/health" >/dev/null || { echo "the server stopped answering after bad requests"; exit 1; }
echo "ok: bad top_k / stop_token_ids values get 400 errors naming the parameter; the server keeps serving"
echo '{"temperature": 0.0, "top_p": 0.9}' > "$M/generation_config.json"
serve
DEF=$(text '')
[ "$DEF" = "$GREEDY" ] || { echo "generation_config temperature 0: '$DEF', greedy '$GREEDY'"; exit 1; }
OVR=$(text ', "temperature": 1.0, "top_p": 1.0')
[ "$OVR" = "$SAMPLED" ] || { echo "the request's temperature 1 / top_p 1 did not win: '$OVR' vs '$SAMPLED'"; exit 1; }
echo "ok: generation_config.json's temperature is the default; the request's fields win"
kill $SRV; wait $SRV 2>/dev/null || true; SRV=
for bad in '{"temperature": "hot"}' '{"top_p": 0}' '{"top_k": 2.5}' '{"repetition_penalty": -1}'; do
    echo "$bad" > "$M/generation_config.json"
    if "$KILN" run "$M" --tokens 1 -n 1 2>"$T/err" >/dev/null; then echo "accepted $bad"; exit 1; fi
    key=$("$PY" -c 'import json,sys; print(next(iter(json.loads(sys.argv[1]))))' "$bad")
    grep -q "generation_config.json: field '$key'" "$T/err" || { echo "$bad:"; cat "$T/err"; exit 1; }
done
echo "ok: bad generation_config.json sampling fields are refused naming file and field"
