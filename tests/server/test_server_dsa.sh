#!/usr/bin/env bash
# test_server_dsa.sh — a DeepSeek sparse attention model (glm_moe_dsa with GLM-5.2's shared-indexer
# layers, F32, index_topk 16, the DeepSeek-V3 tokenizer and GLM-4.6's template from $SHARED) behind
# `kiln serve`: three greedy completions of a 40-token prompt sent at once (stepped together in the
# scheduler's batches: one indexer scan and sparse attention call over several sequences) and the
# same request afterwards alone (its prompt pages from the prefix cache) give the same text — F32
# weights make batched and single steps bit-identical, so any difference is a selection or cache
# bug; a chat completion through the template; then a clean stop.
set -u
KILN=${KILN:-./kiln}
SHARED=${SHARED:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
TOK=$SHARED/tokenizers/deepseek-v3
command -v curl >/dev/null || { echo "curl not installed"; exit 77; }
[ -f "$TOK/tokenizer.json" ] && [ -f "$SHARED/tokenizers/templates/glm-4.6.jinja" ] || { echo "no deepseek-v3 tokenizer / glm-4.6 template under $SHARED"; exit 77; }
T=$(mktemp -d)
log=$T/log
trap 'rm -rf "$T"; [ -n "${pid:-}" ] && kill -9 "$pid" 2>/dev/null' EXIT
"$KILN" mkmodel --arch glm_moe_dsa --preset tiny-shared --vocab 129280 --seq 2048 --dtype f32 "$T/m" > /dev/null || { echo "mkmodel failed"; exit 1; }
cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$T/m/"
cp "$SHARED/tokenizers/templates/glm-4.6.jinja" "$T/m/chat_template.jinja"
"$KILN" serve "$T/m" --host 127.0.0.1 --port 0 2>"$log" &
pid=$!
for _ in $(seq 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
fail() { echo "FAIL: $*"; cat "$log"; exit 1; }
[ -n "$url" ] || fail "server did not start"
grep -q "sparse-attention KV rows" "$log" || fail "the start-up line does not describe the sparse-attention KV rows"
req='{"model":"m","prompt":"In the beginning the model read every token of the context, and then it learned to pick the sixteen that mattered most for the next word","max_tokens":32,"temperature":0,"ignore_eos":true}'
cpids=()
for i in 1 2 3; do curl -sf -m 120 "$url/v1/completions" -d "$req" > "$T/c$i.json" & cpids+=($!); done
wait "${cpids[@]}" # the curls only (the server is a child too)
curl -sf -m 120 "$url/v1/completions" -d "$req" > "$T/c4.json" || fail "single completion"
for i in 1 2 3 4; do
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["usage"]["completion_tokens"] == 32, d; print(d["choices"][0]["text"])' \
        "$T/c$i.json" > "$T/t$i.txt" || fail "completion $i: $(cat "$T/c$i.json")"
done
for i in 2 3 4; do cmp -s "$T/t1.txt" "$T/t$i.txt" || fail "completion $i differs from completion 1 ($(head -c 80 "$T/t$i.txt") vs $(head -c 80 "$T/t1.txt"))"; done
curl -sf -m 120 "$url/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"Say hi"}],"max_tokens":8}' | grep -q '"finish_reason"' || fail "chat completion"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] || fail "exit status $rc"
echo "ok: 4 identical greedy completions (3 batched, 1 alone from the prefix cache), a chat completion, a clean stop"
