#!/usr/bin/env bash
# test_kv_heal.sh — KV integrity end to end through `kiln run` (issue 5; docs/INTEGRITY.md).
#   heal:   faults of every kind injected during generation (--inject-kv-faults) → the greedy output
#           is byte-identical to the fault-free run with integrity off, every fault is detected before
#           use, no false alarm — stories260K (f32, bf16, fp8 static, fp8 dynamic; a short prompt and a
#           150-token prompt that prefills in several chunks) and a bench-500m-shaped synthetic model
#           (`kiln mkmodel --preset small`, BF16 KV), and a sparse-attention model (glm_moe_dsa with
#           shared-indexer layers);
#   strict: the call fails with a clear KILN_ERR_INTEGRITY message; detect: counts, exits 0;
#   bad --kv-integrity / --inject-kv-faults values are named in the error.
set -u
KILN=${KILN:-./kiln}
SHARED=${SHARED:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "no stories260K under $SHARED/models"; exit 77; }
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0
err() { echo "FAIL: $*"; fail=1; }

# counts "injected I, detected D, before use B, false alarms F" of a run's summary line
check_counts() { # stderr-file label
    local line
    line=$(grep -o 'injected [0-9]*, detected [0-9]*, before use [0-9]*, false alarms [0-9]*' "$1")
    [ -n "$line" ] || { err "$2: no injection counts in the summary"; cat "$1"; return; }
    read -r i d b f <<<"$(echo "$line" | sed 's/[^0-9 ]//g' | tr -s ' ')"
    echo "$2: injected $i detected $d before-use $b false-alarms $f"
    [ "$i" -gt 0 ] && [ "$i" = "$d" ] && [ "$i" = "$b" ] && [ "$f" = 0 ] || err "$2: $line"
}

heal_case() { # label spec model args...
    local label=$1 spec=$2; shift 2
    "$KILN" run "$@" --temp 0 --kv-integrity off >"$T/ref" 2>"$T/ref.err" || { err "$label: fault-free run failed"; cat "$T/ref.err"; return; }
    "$KILN" run "$@" --temp 0 --inject-kv-faults "$spec" >"$T/out" 2>"$T/out.err" || { err "$label: healing run failed"; cat "$T/out.err"; return; }
    cmp -s "$T/ref" "$T/out" || { err "$label: output differs from the fault-free run"; diff <(head -c 400 "$T/ref") <(head -c 400 "$T/out"); }
    check_counts "$T/out.err" "$label"
    grep -q ' heals' "$T/out.err" || err "$label: no heal counter"
}

P="Once upon a time, there was a little girl named Lily"
heal_case "stories260K f32" "all=2,every=3,seed=1" "$M" -p "$P" -n 120
heal_case "stories260K bf16" "all=2,every=3,seed=2" "$M" -p "$P" -n 120 --kv-dtype bf16
heal_case "stories260K fp8" "all=2,every=3,seed=3" "$M" -p "$P" -n 120 --kv-dtype fp8
heal_case "stories260K fp8 dynamic" "all=2,every=3,seed=4" "$M" -p "$P" -n 120 --kv-dtype fp8 --kv-scale dynamic
LONG=$(awk 'BEGIN{for(i=0;i<150;i++) printf "%s%d", (i?",":""), (i*37+11)%500}')
heal_case "stories260K 150-token prompt" "bitflip=3,stale=2,wrongpage=2,lostwrite=2,partialcopy=2,every=2,after=1,seed=5" "$M" --tokens "$LONG" -n 60 --kv-dtype bf16

"$KILN" mkmodel --arch llama --preset small "$T/small" >/dev/null 2>&1 || err "mkmodel small"
heal_case "small preset bf16" "all=1,every=5,seed=6" "$T/small" --tokens "$LONG" -n 40 --kv-dtype bf16
# sparse attention (DSA): the indexer scan verifies every page it reads, the shared-indexer layers
# verify theirs in the sparse attention; a heal replays the selection as well
"$KILN" mkmodel --arch glm_moe_dsa --preset tiny-shared "$T/dsa" >/dev/null 2>&1 || err "mkmodel glm_moe_dsa"
DSA_P=$(awk 'BEGIN{for(i=0;i<150;i++) printf "%s%d", (i?",":""), (i*37+11)%256}')
heal_case "glm_moe_dsa tiny-shared bf16" "all=2,every=3,seed=7" "$T/dsa" --tokens "$DSA_P" -n 40 --kv-dtype bf16

# `kiln bench --integrity` with its defaults on the default model (stories260K's context is 512: the
# bench measures at the longest context that fits and says so)
"$KILN" bench "$M" --integrity > "$T/bi.out" 2> "$T/bi.err" || { err "bench --integrity with its defaults failed"; cat "$T/bi.err"; }
grep -q "^context 496: the default 4096" "$T/bi.out" || err "bench --integrity: no line saying which context it measured"
grep -q "^bitflip *100000 *100000 *100000 *0 " "$T/bi.out" || err "bench --integrity: the default campaign's bit flips are not all detected"

# strict: the request fails with a message that says what failed
"$KILN" run "$M" -p "$P" -n 80 --temp 0 --kv-integrity strict --inject-kv-faults bitflip=1,after=10 >"$T/s" 2>"$T/s.err"
rc=$?
[ $rc = 1 ] || err "strict: exit $rc (want 1)"
grep -q 'integrity check failed: KV integrity (--kv-integrity strict): KV page .* failed its seal: content mismatch' "$T/s.err" || { err "strict message"; cat "$T/s.err"; }

# detect: counted, logged, the run goes on
"$KILN" run "$M" -p "$P" -n 80 --temp 0 --kv-integrity detect --inject-kv-faults bitflip=2,every=10 >"$T/d" 2>"$T/d.err" || err "detect: run failed"
check_counts "$T/d.err" "detect"
grep -q 'kv integrity: detect, .* 0 heals' "$T/d.err" || { err "detect summary"; cat "$T/d.err"; }

# off: no counters line; fault-free heal run: zero detections
"$KILN" run "$M" -p "$P" -n 40 --temp 0 --kv-integrity off 2>"$T/o.err" >/dev/null
grep -q 'kv integrity' "$T/o.err" && err "off prints integrity counters"
"$KILN" run "$M" -p "$P" -n 40 --temp 0 2>"$T/h.err" >/dev/null
grep -q 'kv integrity: heal, [1-9][0-9]* page checks .* 0 detections, 0 heals' "$T/h.err" || { err "default heal summary"; cat "$T/h.err"; }

# bad values name the option
"$KILN" run "$M" -n 4 --kv-integrity sometimes 2>"$T/b1" && err "bad mode accepted"
grep -q "option --kv-integrity: 'sometimes' is not one of off, detect, heal, strict" "$T/b1" || err "bad mode message"
"$KILN" run "$M" -n 4 --inject-kv-faults bitflop=3 2>"$T/b2" && err "bad spec accepted"
grep -q "unknown item 'bitflop'" "$T/b2" || err "bad spec message"
"$KILN" run "$M" -n 4 --kv-integrity off --inject-kv-faults bitflip 2>"$T/b3" && err "injection with integrity off accepted"
grep -q "needs --kv-integrity detect, heal or strict" "$T/b3" || err "injection-off message"

[ $fail = 0 ] && echo ok
exit $fail
