#!/usr/bin/env bash
# test_cli_bad_values.sh — unknown or out-of-range values of the options added for devices, speculative
# decoding and agent serving: each must exit non-zero at once (no server left running, no crash) with
# one error line naming the option and the offending value (and, for a choice, the valid ones).
set -u
KILN=${KILN:-./kiln}
SHARED=${SHARED:-$(cd "$(dirname "$0")/../../.." && pwd)/shared}
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "no stories260K under $SHARED/models"; exit 77; }
fail=0
# expect LABEL "PATTERN..." -- COMMAND...: exit 1..127 within 20 s and stderr holds every pattern
expect() {
    local label=$1; shift
    local pats=()
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    local err rc
    err=$(timeout 20 "$@" 2>&1 >/dev/null); rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 124 ]; then echo "FAIL $label: exit $rc: $err"; fail=1; return; fi
    for p in "${pats[@]}"; do
        grep -qF -- "$p" <<<"$err" || { echo "FAIL $label: error does not mention '$p': $err"; fail=1; return; }
    done
    echo "ok   $label: $(tail -1 <<<"$err")"
}
expect "--spec unknown" "--spec" "bogus" "ngram" -- "$KILN" run "$M" --spec bogus -n 1
expect "--spec-k 0" "--spec-k" "'0'" -- "$KILN" run "$M" --spec ngram --spec-k 0 -n 1
expect "--spec-k 99" "--spec-k" "'99'" -- "$KILN" run "$M" --spec ngram --spec-k 99 -n 1
expect "--device unknown" "--device" "bogus" "vulkan:N" -- "$KILN" run "$M" --device bogus -n 1
if "$KILN" inspect --devices 2>/dev/null | grep -q '^vulkan:0'; then # a build with Vulkan and a device
    expect "--device vulkan:99" "vulkan" "99" "out of range" -- "$KILN" run "$M" --device vulkan:99 -n 1
fi
expect "--tool-parser unknown" "--tool-parser" "bogus" "glm45" "kimi_k2" -- "$KILN" serve "$M" --port 0 --tool-parser bogus
expect "--reasoning-parser unknown" "--reasoning-parser" "bogus" "deepseek_r1" -- "$KILN" serve "$M" --port 0 --reasoning-parser bogus
expect "--kv-dtype unknown" "--kv-dtype" "fp4" -- "$KILN" run "$M" --kv-dtype fp4 -n 1
exit $fail
