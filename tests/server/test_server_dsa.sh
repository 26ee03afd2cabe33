#!/usr/bin/env bash
# test_server_dsa.sh — a DeepSeek sparse attention model (glm_moe_dsa with GLM-5.2's shared-indexer
# layers, F32, index_topk 16, the DeepSeek-V3 tokenizer and GLM-4.6's template from $SHARED) behind
# `kiln serve`: three greedy completions of a 40-token prompt sent at once (stepped together in the
# scheduler's batches: one indexer scan and sparse attention call over several sequences) and the
# same request afterwards alone (its prompt pages from the prefix cache) give the same text — F32
# weights make batched and single steps bit-identical, so any difference is a selection or cache
# bug; a chat completion through the template; then a clean stop. Where the build has a Vulkan
# device (lavapipe in make test) the same on `--device vulkan` — the indexer's scan and top-k, the
# compact rows' store and the sparse attention in shaders, KV integrity (heal) hashing the pages the
# scan reads — plus eight concurrent requests sharing a long prefix: every text equal to the cpu
# backend's, nothing computed on the host.
set -u
KILN=${KILN:-./kiln}
PY=${PY:-/usr/bin/python3}
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
devices=(cpu)
if "$KILN" inspect --devices 2>/dev/null | grep -q '^vulkan:0 '; then devices+=(vulkan); fi
base="The history of the long document begins with a very long prefix that is shared by every request in this batch so that prefix caching and sparse attention both matter"
for dev in "${devices[@]}"; do
"$KILN" serve "$T/m" --host 127.0.0.1 --port 0 --device "$dev" --kv-integrity heal 2>"$log" &
pid=$!
for _ in $(seq 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
url=$(grep -o 'http://127.0.0.1:[0-9]*' "$log" | head -1)
fail() { echo "FAIL ($dev): $*"; cat "$log"; exit 1; }
[ -n "$url" ] || fail "server did not start"
grep -q "sparse-attention KV rows" "$log" || fail "the start-up line does not describe the sparse-attention KV rows"
req='{"model":"m","prompt":"In the beginning the model read every token of the context, and then it learned to pick the sixteen that mattered most for the next word","max_tokens":32,"temperature":0,"ignore_eos":true}'
cpids=()
for i in 1 2 3; do curl -sf -m 120 "$url/v1/completions" -d "$req" > "$T/c$i.json" & cpids+=($!); done
wait "${cpids[@]}" # the curls only (the server is a child too)
curl -sf -m 120 "$url/v1/completions" -d "$req" > "$T/c4.json" || fail "single completion"
for i in 1 2 3 4; do
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["usage"]["completion_tokens"] == 32, d; print(d["choices"][0]["text"])' \
        "$T/c$i.json" > "$T/t$i.txt" || fail "completion $i: $(cat "$T/c$i.json")"
done
for i in 2 3 4; do cmp -s "$T/t1.txt" "$T/t$i.txt" || fail "completion $i differs from completion 1 ($(head -c 80 "$T/t$i.txt") vs $(head -c 80 "$T/t1.txt"))"; done
cp "$T/t1.txt" "$T/same.$dev"
# eight different prompts with a shared prefix, at once (batched steps over several sequences,
# prefix pages shared)
cpids=()
for i in 0 1 2 3 4 5 6 7; do
    curl -sf -m 300 "$url/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"$base number $i and then\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true}" \
        > "$T/p$i.json" & cpids+=($!)
done
wait "${cpids[@]}"
for i in 0 1 2 3 4 5 6 7; do
    "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["usage"]["completion_tokens"] == 40, d; print(d["choices"][0]["text"])' \
        "$T/p$i.json" > "$T/p$i.$dev" || fail "prefix request $i: $(cat "$T/p$i.json")"
done
curl -sf -m 120 "$url/v1/chat/completions" -d '{"model":"m","messages":[{"role":"user","content":"Say hi"}],"max_tokens":8}' | grep -q '"finish_reason"' || fail "chat completion"
kill -TERM "$pid"
wait "$pid"
rc=$?
pid=
[ $rc -eq 0 ] || fail "exit status $rc"
if [ "$dev" = vulkan ]; then
    grep -q "instead of the device" "$log" && fail "an op left the device"
    cmp -s "$T/same.cpu" "$T/same.vulkan" || fail "vulkan's greedy text differs from the cpu backend's"
    for i in 0 1 2 3 4 5 6 7; do cmp -s "$T/p$i.cpu" "$T/p$i.vulkan" || fail "prefix request $i: vulkan's text differs from the cpu backend's"; done
fi
done
echo "ok (${devices[*]}): 4 identical greedy completions (3 batched, 1 alone from the prefix cache), 8 concurrent prefix-sharing requests, a chat completion, a clean stop"
