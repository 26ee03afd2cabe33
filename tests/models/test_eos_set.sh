#!/usr/bin/env bash
# End-of-generation ids as a set (issue 22, stopping): every id of a list-valued eos_token_id in
# config.json, and of generation_config.json's eos_token_id, ends generation — in `kiln run` (the
# session path) and in `kiln serve` (the engine's scheduler: finish_reason "stop"); a request's
# stop_token_ids (vLLM's extension) end it too. GLM-4.x configs
# list three (<|endoftext|>, <|user|>, <|observation|>); before, only the first was honoured.
# The model: a synthetic glm4 checkpoint (kiln mkmodel) without eos; its greedy continuation of
# 1,2,3 is read first, then a token it emits later is made an end id in each position of a list.
set -euo pipefail
PY=${PY:-/usr/bin/python3}
T=$(mktemp -d)
SRV=
trap '[ -n "$SRV" ] && kill $SRV 2>/dev/null; rm -rf "$T"' EXIT
M=$T/m
"$KILN" mkmodel --arch glm4 --preset tiny "$M" 2>/dev/null
run() { "$KILN" run "$M" --tokens 1,2,3 -n 12 --temp 0 2>/dev/null; }
FULL=$(run)
# k: the first position >= 2 whose token did not occur before it; expected output: the tokens before it
read -r K TARGET EXPECT < <("$PY" -c '
import sys
ids = [int(x) for x in sys.argv[1].split(",")]
for k in range(2, len(ids)):
    if ids[k] not in ids[:k]:
        print(k, ids[k], ",".join(map(str, ids[:k]))); break
else: sys.exit("no usable token")' "$FULL")
VOCAB=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$M/config.json")
A=$((VOCAB - 1)); B=$((VOCAB - 2))
setcfg() { "$PY" - "$M/config.json" "$1" <<'EOF'
import json, sys
p, v = sys.argv[1], sys.argv[2]
c = json.load(open(p))
if v == "none": c.pop("eos_token_id", None)
else: c["eos_token_id"] = json.loads(v)
json.dump(c, open(p, "w"))
EOF
}
for list in "[$TARGET, $A, $B]" "[$A, $TARGET, $B]" "[$A, $B, $TARGET]" "$TARGET"; do
    setcfg "$list"
    OUT=$(run)
    [ "$OUT" = "$EXPECT" ] || { echo "config.json eos_token_id $list: generated $OUT, expected $EXPECT (stop at $TARGET)"; exit 1; }
done
echo "ok: config.json eos_token_id lists stop at every position ($EXPECT then $TARGET)"
setcfg none
echo "{\"eos_token_id\": [$A, $TARGET]}" > "$M/generation_config.json"
OUT=$(run)
[ "$OUT" = "$EXPECT" ] || { echo "generation_config.json: generated $OUT, expected $EXPECT"; exit 1; }
echo "ok: generation_config.json eos_token_id stops generation"

# the server's engine: finish_reason stop after k tokens (the eos itself is not part of the text)
PORT=$((20000 + RANDOM % 20000))
"$KILN" serve "$M" --port $PORT >"$T/serve.log" 2>&1 &
SRV=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
MODEL_ID=$(curl -sf "http://127.0.0.1:$PORT/v1/models" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["data"][0]["id"])')
RESP=$(curl -sf "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$MODEL_ID\", \"prompt\": [1, 2, 3], \"max_tokens\": 12, \"temperature\": 0}")
"$PY" - "$RESP" "$K" <<'EOF'
import json, sys
r, k = json.loads(sys.argv[1]), int(sys.argv[2])
fr, n = r["choices"][0]["finish_reason"], r["usage"]["completion_tokens"]
assert fr == "stop", f"finish_reason {fr}, expected stop ({r})"
assert n in (k, k + 1), f"completion_tokens {n}, expected {k} (+ the eos)"
print(f"ok: kiln serve stops with finish_reason stop after {n} tokens")
EOF
# stop_token_ids (vLLM's extension): without any model end id, the request's own ids stop it
rm -f "$M/generation_config.json"
kill $SRV; wait $SRV 2>/dev/null || true
"$KILN" serve "$M" --port $PORT >"$T/serve2.log" 2>&1 &
SRV=$!
for _ in $(seq 100); do curl -sf "http://127.0.0.1:$PORT/health" >/dev/null && break; sleep 0.1; done
comp() { curl -s "http://127.0.0.1:$PORT/v1/completions" -H 'content-type: application/json' -d "$1"; }
R1=$(comp "{\"model\": \"$MODEL_ID\", \"prompt\": [1, 2, 3], \"max_tokens\": 12, \"temperature\": 0}")
R2=$(comp "{\"model\": \"$MODEL_ID\", \"prompt\": [1, 2, 3], \"max_tokens\": 12, \"temperature\": 0, \"stop_token_ids\": [$A, $TARGET]}")
R3=$(comp "{\"model\": \"$MODEL_ID\", \"prompt\": [1, 2, 3], \"max_tokens\": 4, \"stop_token_ids\": [$VOCAB]}")
"$PY" - "$R1" "$R2" "$R3" "$K" <<'EOF'
import json, sys
r1, r2, r3, k = json.loads(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
assert r1["choices"][0]["finish_reason"] == "length", r1
assert r2["choices"][0]["finish_reason"] == "stop" and r2["usage"]["completion_tokens"] == k + 1, r2
e = r3.get("error") or {}
assert e.get("param") == "stop_token_ids" and e.get("type") == "invalid_request_error", r3
print("ok: stop_token_ids end a request without model end ids; an id past the vocabulary is refused naming the parameter")
EOF

# bad files name the file and the field
echo "{\"eos_token_id\": [$A, $VOCAB]}" > "$M/generation_config.json"
if "$KILN" run "$M" --tokens 1 -n 1 2>"$T/err"; then echo "an eos id past the vocabulary was accepted"; exit 1; fi
grep -q "generation_config.json" "$T/err" || { cat "$T/err"; exit 1; }
echo '{"eos_token_id": ["x"]}' > "$M/generation_config.json"
if "$KILN" run "$M" --tokens 1 -n 1 2>"$T/err"; then echo "a non-integer eos id was accepted"; exit 1; fi
grep -q "eos_token_id" "$T/err" || { cat "$T/err"; exit 1; }
echo '[1' > "$M/generation_config.json"
if "$KILN" run "$M" --tokens 1 -n 1 2>"$T/err"; then echo "malformed generation_config.json was accepted"; exit 1; fi
grep -q "generation_config.json" "$T/err" || { cat "$T/err"; exit 1; }
echo "ok: bad generation_config.json files are refused naming the file and field"
