#!/usr/bin/env bash
# test_server_spec_mtp.sh — speculative decoding with the model's own MTP layer inside the server's
# continuous batching (docs/SPECULATIVE.md, "In the server"; --spec-max-batch 16: the concurrent
# requests speculate inside one batch): for a DeepSeek-V3 model and a GLM-5
# (glm_moe_dsa: sparse attention, the MTP layer with its own indexer), tiny presets with one MTP
# layer, F32 weights (batched and single steps bit-identical), the DeepSeek-V3 tokenizer:
#   - greedy completions with "speculative": "mtp" (k = 1..3 per request, sequential, then 16
#     concurrent clients at k = 1..4, streamed and not) give exactly the text of the same requests
#     without speculation, and the MTP layer drafted (kiln_spec_drafted_tokens_total grows);
#   - MTP requests on cached prefix pages: the MTP layer's rows come with the pages (the same drafts
#     as the request that computed them), only where they are whole; also with KV faults healed;
#   - "speculative": "mtp" on a model without an MTP layer is refused naming the field (400), and
#     `kiln serve --spec mtp` on it does not start, naming the option.
# The presets' MTP layers are random and almost never right, so the checkpoints are rewired first
# (scripts/mtp_rewire.py: a target that mostly repeats its last token, an MTP layer that drafts the last
# token again): some drafts are kept and some rejected, both required. Exactness and the drafting
# plumbing (hidden rows from the batched steps, the drafter's KV, rollback) are what is checked, not
# a speed-up.
set -u
. "$(dirname "$0")/lib.sh"
TOK=$SHARED/tokenizers/deepseek-v3
[ -f "$TOK/tokenizer.json" ] || { echo "no deepseek-v3 tokenizer under $SHARED"; exit 77; }

# KILN_SERVE_TP=N (tests/dist/test_tp_serve.sh): every server runs as `mpirun -np N kiln serve ... --tp N`
TP=${KILN_SERVE_TP:-1}
launch=()
[ "$TP" -gt 1 ] && launch=(mpirun --oversubscribe --allow-run-as-root --mca orte_abort_on_non_zero_status 0 -x OMP_NUM_THREADS=1 -np "$TP")
start() { # model dir, extra args...: starts a server, sets url
    local d=$1; shift
    local tpa=(); [ "$TP" -gt 1 ] && tpa=(--tp "$TP")
    "${launch[@]}" "$KILN" serve "$d" --host 127.0.0.1 --port 0 --max-batch 16 --spec-max-batch 16 --model-name m "${tpa[@]}" "$@" 2>"$T/log" &
    pid=$!
    wait_listening "$T/log" || fail "server did not start for $d"
}
stop() { # under mpirun the signal goes to rank 0 (as tests/server/lib.mjs does); mpirun's own status is not the server's
    local r0; r0=$(sed -n 's/.*rank 0 serves, pid \([0-9]*\).*/\1/p' "$T/log" | head -1)
    if [ -n "$r0" ]; then kill -TERM "$r0"; wait "$pid"; pid=; return; fi
    kill -TERM "$pid"; wait "$pid"; local rc=$?; pid=; [ $rc -eq 0 ] || fail "server exit status $rc"
}
text() { "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["choices"][0]["text"])' "$1"; }
drafted() { curl -sf "$url/metrics" | awk '$1 == "kiln_spec_drafted_tokens_total" {print $2}'; }
accepted() { curl -sf "$url/metrics" | awk '$1 == "kiln_spec_accepted_tokens_total" {print $2}'; }

prompts=("In the beginning the model read every token of the context" "Once upon a time there was a tiny model that"
         "The quick brown fox jumps over the lazy dog and the quick brown")
for arch in deepseek_v3 glm_moe_dsa; do
    d=$T/$arch
    "$KILN" mkmodel --arch "$arch" --preset tiny --vocab 129280 --seq 1024 --dtype f32 "$d" > /dev/null 2>&1 || fail "mkmodel $arch"
    grep -q '"num_nextn_predict_layers": *[1-9]' "$d/config.json" || fail "$arch tiny preset has no MTP layer"
    "$PY" "$(dirname "$0")/../../scripts/mtp_rewire.py" "$d" 2.0 || fail "rewiring $arch's MTP layer"
    cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$d/"
    start "$d"
    before=$(drafted); acc0=$(accepted)
    for i in 0 1 2; do
        body() { printf '{"model":"m","prompt":"%s","max_tokens":40,"temperature":0,"ignore_eos":true%s}' "${prompts[$i]}" "$1"; }
        curl -sf -m 120 "$url/v1/completions" -d "$(body '')" > "$T/ref$i.json" || fail "$arch: completion $i without speculation"
        text "$T/ref$i.json" > "$T/ref$i.txt"
        for k in 1 2 3; do
            curl -sf -m 120 "$url/v1/completions" -d "$(body ",\"speculative\":{\"method\":\"mtp\",\"num_speculative_tokens\":$k}")" > "$T/s$i.$k.json" ||
                fail "$arch: completion $i with mtp k = $k: $(cat "$T/s$i.$k.json")"
            text "$T/s$i.$k.json" > "$T/s$i.$k.txt"
            cmp -s "$T/ref$i.txt" "$T/s$i.$k.txt" || fail "$arch: prompt $i, mtp k = $k: '$(cat "$T/s$i.$k.txt")' vs '$(cat "$T/ref$i.txt")'"
        done
        # streamed
        curl -sfN -m 120 "$url/v1/completions" -d "$(body ',"speculative":"mtp","stream":true')" > "$T/st$i.sse" || fail "$arch: streamed $i"
        "$PY" - "$T/st$i.sse" "$T/ref$i.txt" <<'EOF' || fail "$arch: streamed completion $i differs"
import json, sys
out = ""
for line in open(sys.argv[1]):
    if line.startswith("data: ") and line.strip() != "data: [DONE]":
        ev = json.loads(line[6:])
        out += "".join(c.get("text", "") for c in ev.get("choices", []))
ref = open(sys.argv[2]).read()[:-1]
assert out == ref, (out, ref)
EOF
    done
    cpids=()
    for j in $(seq 0 15); do
        i=$((j % 3))
        curl -sf -m 120 "$url/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"${prompts[$i]}\",\"max_tokens\":40,\"temperature\":0,\"ignore_eos\":true,\"speculative\":{\"method\":\"mtp\",\"num_speculative_tokens\":$((1 + j % 4))}}" > "$T/c$j.json" &
        cpids+=($!)
    done
    wait "${cpids[@]}"
    for j in $(seq 0 15); do
        text "$T/c$j.json" > "$T/c$j.txt" 2>/dev/null || fail "$arch: concurrent $j: $(cat "$T/c$j.json")"
        cmp -s "$T/ref$((j % 3)).txt" "$T/c$j.txt" || fail "$arch: concurrent $j differs from the unspeculated text"
    done
    after=$(drafted); acc1=$(accepted)
    [ -n "$before" ] && [ -n "$after" ] && [ "$after" -gt "$before" ] || fail "$arch: the MTP layer drafted nothing ($before → $after)"
    # both paths taken: drafts kept (their hidden rows and KV stay) and drafts rejected (rolled back)
    [ $((acc1 - acc0)) -gt 0 ] && [ $((acc1 - acc0)) -lt $((after - before)) ] ||
        fail "$arch: $((acc1 - acc0)) of $((after - before)) drafts accepted: the test needs some kept and some rejected"
    # speculation paused while more than 2 requests run: the drafters catch up on pending pairs
    # (kiln_mtp_catch_up keeps their hidden rows bounded) and draft again once the batch is small
    for i in 0 1 2; do
        curl -sf -m 120 "$url/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"${prompts[$i]}\",\"max_tokens\":$((100 + 60 * i)),\"temperature\":0,\"ignore_eos\":true}" > "$T/long$i.json" ||
            fail "$arch: long completion $i"
        text "$T/long$i.json" > "$T/long$i.txt"
    done
    stop
    start "$d" --spec-max-batch 2
    d0=$(drafted)
    cpids=()
    for i in 0 1 2; do
        curl -sf -m 120 "$url/v1/completions" -d "{\"model\":\"m\",\"prompt\":\"${prompts[$i]}\",\"max_tokens\":$((100 + 60 * i)),\"temperature\":0,\"ignore_eos\":true,\"speculative\":\"mtp\"}" > "$T/lm$i.json" &
        cpids+=($!)
    done
    wait "${cpids[@]}"
    for i in 0 1 2; do
        text "$T/lm$i.json" > "$T/lm$i.txt" 2>/dev/null || fail "$arch: paused-speculation completion $i: $(cat "$T/lm$i.json")"
        cmp -s "$T/long$i.txt" "$T/lm$i.txt" || fail "$arch: paused-speculation completion $i differs from the unspeculated text"
    done
    d1=$(drafted)
    [ "$d1" -gt "$d0" ] || fail "$arch: no drafts once the batch had shrunk ($d0 → $d1)"
    stop
    echo "ok   $arch: greedy text with MTP drafts (k = 1..3, streamed; 16 concurrent clients at k = 1..4 speculating in one batch; paused in a batch of 3 and resumed) identical to no speculation; $((after - before)) tokens drafted, $((acc1 - acc0)) accepted"
done

# MTP requests and the prefix cache (docs/SPECULATIVE.md, "In the server"): the MTP layer's KV rows
# live in the draft pool at the target's own pages, so a cached page carries them. Checked on the
# presets' random MTP layers, whose drafts follow every row the layer attends over: an MTP request
# that takes cached pages must draft exactly what the request that computed them drafted at each
# position (KILN_SPEC_TRACE lists every step's drafts); it takes only pages whose MTP rows are whole
# (computed by an MTP request, the last row with its own next token), and its text is the text
# without speculation. (Negative control, run by hand: accepting pages without whole MTP rows makes
# the drafts differ from the first position on.)
ids() { "$PY" -c 'import random,sys; random.seed(int(sys.argv[1])); print(",".join(str(random.randrange(1000, 50000)) for _ in range(int(sys.argv[2]))))' "$@"; }
P1=$(ids 1 100); P2=$(ids 2 100)
P3="$(echo "$P1" | cut -d, -f1-64),$(ids 3 36)" # P1's first 4 pages (page 16), then other tokens
for arch in deepseek_v3 glm_moe_dsa; do
    d=$T/$arch-raw
    "$KILN" mkmodel --arch "$arch" --preset tiny --vocab 129280 --seq 1024 --dtype f32 "$d" > /dev/null 2>&1 || fail "mkmodel $arch"
    tr=$T/trace.$arch; rm -f "$tr"
    export KILN_SPEC_TRACE=$tr
    saved=("${launch[@]}"); [ "$TP" -gt 1 ] && launch+=(-x KILN_SPEC_TRACE)
    start "$d" --kv-page 16
    unset KILN_SPEC_TRACE
    n=0
    req() { # prompt ids, speculative json or "" → prints "cached_tokens text"; checks the text against the unspeculated one
        local sp=; [ -n "$2" ] && sp=",\"speculative\":$2"
        curl -sf -m 120 "$url/v1/completions" -d "{\"model\":\"m\",\"prompt\":[$1],\"max_tokens\":24,\"temperature\":0,\"ignore_eos\":true$sp}" > "$T/p$n.json" ||
            fail "$arch: prefix request $n"
        "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); print(d["usage"]["prompt_tokens_details"]["cached_tokens"], d["choices"][0]["text"])' "$T/p$n.json"
        n=$((n + 1))
    }
    same_drafts() { # arrivals a b: the same drafts at the same positions, and some
        "$PY" - "$tr" "$1" "$2" <<'EOF2'
import collections, sys
t = collections.defaultdict(list)
for line in open(sys.argv[1]):
    a, *rest = line.split()
    t[a].append(rest)
a, b = t[sys.argv[2]], t[sys.argv[3]]
assert a and a == b, (len(a), len(b), a[:2], b[:2])
EOF2
    }
    r0=$(req "$P1" '"mtp"'); r1=$(req "$P1" '"mtp"'); o1=$(req "$P1" '"off"')
    [ "${r0%% *}" = 0 ] && [ "${r1%% *}" = 96 ] || fail "$arch: P1 with MTP twice: cached tokens ${r0%% *}, ${r1%% *} (want 0, 96)"
    [ "${r0#* }" = "${o1#* }" ] && [ "${r1#* }" = "${o1#* }" ] || fail "$arch: P1: MTP text differs from the unspeculated text"
    same_drafts 0 1 || fail "$arch: the MTP request on cached pages drafted differently from the one that computed them"
    o2=$(req "$P2" '"off"'); r3=$(req "$P2" '"mtp"'); r4=$(req "$P2" '"mtp"')
    [ "${o2%% *}" = 0 ] && [ "${r3%% *}" = 0 ] && [ "${r4%% *}" = 96 ] ||
        fail "$arch: P2 without, then twice with MTP: cached tokens ${o2%% *}, ${r3%% *}, ${r4%% *} (want 0, 0: no MTP rows yet, 96)"
    [ "${r3#* }" = "${o2#* }" ] && [ "${r4#* }" = "${o2#* }" ] || fail "$arch: P2: MTP text differs from the unspeculated text"
    same_drafts 4 5 || fail "$arch: P2: the MTP request on cached pages drafted differently"
    o6=$(req "$P3" '"off"'); r7=$(req "$P3" '"mtp"')
    [ "${o6%% *}" = 64 ] && [ "${r7%% *}" = 48 ] ||
        fail "$arch: P3 (P1's first 64 tokens): cached tokens ${o6%% *} without MTP, ${r7%% *} with (want 64, and 48: page 3's last MTP row paired P1's token 65)"
    [ "${r7#* }" = "${o6#* }" ] || fail "$arch: P3: MTP text differs from the unspeculated text"
    stop
    launch=("${saved[@]}")
    # KV faults injected while MTP requests run on cached pages: every heal replays (the drafter's
    # rows of the replayed positions too) and the text stays the unspeculated one
    start "$d" --kv-page 16 --inject-kv-faults bitflip=4,multibit=2,wrongpage=2,stale=2,every=5
    n=20
    for p in "$P1" "$P2" "$P1" "$P3"; do
        got=$(req "$p" '"mtp"'); want=$o1; [ "$p" = "$P2" ] && want=$o2; [ "$p" = "$P3" ] && want=$o6
        [ "${got#* }" = "${want#* }" ] || fail "$arch: with injected KV faults, an MTP request's text differs from the unspeculated text"
    done
    heals=$(curl -sf "$url/metrics" | awk '$1 == "kiln_kv_integrity_heals_total" {print $2}')
    [ -n "$heals" ] && [ "$heals" -gt 0 ] || fail "$arch: no heal happened under injected faults (heals: '$heals')"
    stop
    echo "ok   $arch: MTP requests share cached pages with their MTP rows (same drafts as the request that computed them), only pages whose rows are whole (0 / 48 tokens where 96 / 64 are cached), text unchanged, also through $heals heals of injected KV faults"
done

# a model without an MTP layer
d=$T/llama
"$KILN" mkmodel --arch deepseek_v3 --preset tiny --vocab 129280 --seq 1024 --dtype f32 "$d" > /dev/null 2>&1 || fail "mkmodel"
"$PY" - "$d/config.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1])); c["num_nextn_predict_layers"] = 0; json.dump(c, open(sys.argv[1], "w"))
EOF
cp "$TOK/tokenizer.json" "$TOK/tokenizer_config.json" "$d/"
start "$d"
code=$(curl -s -o "$T/e.json" -w '%{http_code}' "$url/v1/completions" -d '{"model":"m","prompt":"hi","max_tokens":4,"speculative":"mtp"}')
[ "$code" = 400 ] && grep -q '"param": *"speculative"' "$T/e.json" && grep -q "MTP layer" "$T/e.json" || fail "no MTP layer: expected 400 naming 'speculative', got $code $(cat "$T/e.json")"
stop
"$KILN" serve "$d" --host 127.0.0.1 --port 0 --spec mtp > /dev/null 2>"$T/log2" & p2=$!
for _ in $(seq 100); do kill -0 $p2 2>/dev/null || break; sleep 0.1; done
if kill -0 $p2 2>/dev/null; then kill -9 $p2; fail "kiln serve --spec mtp started on a model without an MTP layer"; fi
grep -q -- "--spec mtp" "$T/log2" || fail "kiln serve --spec mtp without an MTP layer: $(cat "$T/log2")"
echo "ok   refused: \"speculative\": \"mtp\" without an MTP layer (400 naming the field), kiln serve --spec mtp on it ($(tail -n 1 "$T/log2"))"
