#!/usr/bin/env bash
# test_server_fp8_batch.sh — a request's logits do not depend on what else is in the batch, with FP8
# weights: stories260K re-quantized to FP8 blocks (`kiln quantize --weights fp8`), four greedy
# completions with logprobs from one-token prompts sent at once (stepped together: steps of several decodes, which run the
# few-token kernels in the 1-token step's form, kiln_kctx.decode_steps) give exactly the text and
# the logprobs of the same four requests sent one at a time. Before, such steps ran FP8 in its exact
# form while a lone request's 1-token steps ran the BF16-dot form (AVX512_BF16 CPUs), so batched and
# single logits differed in their last bits.
set -u
. "$(dirname "$0")/lib.sh"
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "no stories260K under $SHARED"; exit 77; }
"$KILN" quantize "$M" "$T/m" --weights fp8 > /dev/null 2>&1 || fail "kiln quantize --weights fp8"
"$KILN" serve "$T/m" --host 127.0.0.1 --port 0 --max-batch 8 --model-name m 2>"$T/log" &
pid=$!
wait_listening "$T/log" || fail "server did not start"
# one-token prompts (token ids), so that every step of the concurrent run is decodes only: a prompt
# chunk of several requests goes through the prefill GEMM, whose rounding a lone short prompt does
# not share (that is prefill, not what this test is about)
prompts=(1 403 407 32)
body() { printf '{"model":"m","prompt":[%s],"max_tokens":60,"temperature":0,"ignore_eos":true,"logprobs":3}' "${prompts[$1]}"; }
for i in 0 1 2 3; do curl -sf -m 60 "$url/v1/completions" -d "$(body $i)" > "$T/one$i.json" || fail "completion $i alone"; done
cpids=()
for i in 0 1 2 3; do curl -sf -m 60 "$url/v1/completions" -d "$(body $i)" > "$T/all$i.json" & cpids+=($!); done
wait "${cpids[@]}"
for i in 0 1 2 3; do
    "$PY" - "$T/one$i.json" "$T/all$i.json" <<'EOF' || fail "request $i: batched output differs from the same request alone"
import json, sys
a, b = (json.load(open(p))["choices"][0] for p in sys.argv[1:3])
assert a["text"] == b["text"], (a["text"], b["text"])
assert a["logprobs"]["token_logprobs"] == b["logprobs"]["token_logprobs"], "logprobs differ"
assert a["logprobs"]["top_logprobs"] == b["logprobs"]["top_logprobs"], "top logprobs differ"
EOF
done
kill -TERM "$pid"; wait "$pid"; rc=$?; pid=
[ $rc -eq 0 ] || fail "exit status $rc"
echo "ok: FP8 weights, 4 greedy completions stepped together: text and logprobs identical to each request alone"
