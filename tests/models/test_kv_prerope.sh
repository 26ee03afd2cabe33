#!/usr/bin/env bash
# --kv-smooth prerope at the CLI (docs/KV.md "Pre-RoPE K smoothing"): bad inputs give errors that
# name the option or the kv_scales.json field, and the mode recorded by `kiln calibrate` must match
# the session's. (Numerics: tests/models/test_kv_fp8.py against numpy; kernels:
# tests/kernels/test_attention.c.)
set -uo pipefail
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "SKIP: no stories260K"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
DATA=$SHARED/data/more/tinystories_sample.txt
fails=0

want_err() { # expected message part, command...
    local msg=$1; shift
    "$@" > /dev/null 2> "$T/err"; local rc=$?
    if [ $rc -ne 0 ] && [ $rc -ne 139 ] && [ $rc -ne 134 ] && grep -qF -- "$msg" "$T/err"; then return 0; fi
    echo "FAIL: '$*' exit $rc, wanted '$msg' in:"; cat "$T/err"; fails=$((fails + 1))
}
want_ok() { # expected stderr part, command...
    local msg=$1; shift
    "$@" > /dev/null 2> "$T/err"; local rc=$?
    if [ $rc -eq 0 ] && grep -qF -- "$msg" "$T/err"; then return 0; fi
    echo "FAIL: '$*' exit $rc, wanted '$msg' in:"; cat "$T/err"; fails=$((fails + 1))
}

# the option itself
want_err "option --kv-smooth: 'pre' is not one of post, prerope, off" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-smooth pre
want_err "--kv-smooth prerope (kv_smooth): applies to FP8 KV only (--kv-dtype fp8), not bf16" "$KILN" run "$M" -n 2 --kv-dtype bf16 --kv-smooth prerope
want_err "--kv-smooth prerope (kv_smooth): needs static FP8 scales" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-scale dynamic --kv-smooth prerope
# a model kind it does not apply to: GLM-4 (partial rotary; its own forward)
"$KILN" mkmodel --arch glm4 --preset tiny "$T/glm" > /dev/null 2>&1 || { echo "FAIL: mkmodel glm4"; exit 1; }
printf '1 2 3 4 5 6 7 8 9 10\n' > "$T/ids.txt"
want_err "--kv-smooth prerope (kv_smooth): model architecture 'glm4' is not supported" "$KILN" run "$T/glm" --tokens 1,2,3 -n 2 --kv-dtype fp8 --kv-smooth prerope
want_err "--kv-smooth prerope (kv_smooth): model architecture 'glm4' is not supported" "$KILN" calibrate "$T/glm" --data "$T/ids.txt" --kv-smooth prerope --out "$T/g.json"

# built-in calibration with prerope
want_ok "built-in calibration (256 tokens of a built-in English text, margin 2, pre-RoPE K smoothing)" "$KILN" run "$M" -n 8 --kv-dtype fp8 --kv-smooth prerope
# calibrate: the mode is recorded, and must match the session's
want_err "--no-smooth and --kv-smooth prerope contradict each other" "$KILN" calibrate "$M" --data "$DATA" --no-smooth --kv-smooth prerope --out "$T/x.json"
"$KILN" calibrate "$M" --data "$DATA" --kv-smooth prerope --out "$T/pre.json" > /dev/null 2>&1 || { echo "FAIL: calibrate prerope"; fails=$((fails + 1)); }
"$KILN" calibrate "$M" --data "$DATA" --out "$T/post.json" > /dev/null 2>&1 || { echo "FAIL: calibrate post"; fails=$((fails + 1)); }
"$KILN" calibrate "$M" --data "$DATA" --no-smooth --out "$T/none.json" > /dev/null 2>&1 || { echo "FAIL: calibrate --no-smooth"; fails=$((fails + 1)); }
/usr/bin/python3 -c "import json,sys; d=json.load(open(sys.argv[1])); e=json.load(open(sys.argv[2])); sys.exit(0 if d['k_smooth']=='prerope' and e['k_smooth']=='post' else 1)" "$T/pre.json" "$T/post.json" \
    || { echo "FAIL: k_smooth fields"; fails=$((fails + 1)); }
want_ok "pre.json (--kv-scales; pre-RoPE K smoothing)" "$KILN" run "$M" -n 8 --kv-dtype fp8 --kv-smooth prerope --kv-scales "$T/pre.json"
want_ok "post.json (--kv-scales; K smoothing)" "$KILN" run "$M" -n 8 --kv-dtype fp8 --kv-scales "$T/post.json"
want_ok "none.json (--kv-scales)" "$KILN" run "$M" -n 8 --kv-dtype fp8 --kv-scales "$T/none.json"
want_err "pre.json: field 'k_smooth' = prerope does not match --kv-smooth post (the default)" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-scales "$T/pre.json"
want_err "post.json: field 'k_smooth' = post does not match --kv-smooth prerope" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-smooth prerope --kv-scales "$T/post.json"
want_err "none.json: field 'k_smooth' = none (no k_mean) does not match --kv-smooth prerope" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-smooth prerope --kv-scales "$T/none.json"
want_err "post.json: field 'k_smooth' = post (its k_scale applies to K - k_mean) does not match --kv-smooth off" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-smooth off --kv-scales "$T/post.json"
want_ok "none.json (--kv-scales)" "$KILN" run "$M" -n 8 --kv-dtype fp8 --kv-smooth off --kv-scales "$T/none.json"
# the file beside the model is checked the same way
mkdir "$T/m" && cp "$M"/stories260K.bin "$M"/tok512.bin "$T/m/" && cp "$T/pre.json" "$T/m/kv_scales.json"
want_err "kv_scales.json: field 'k_smooth' = prerope does not match --kv-smooth post (the default)" "$KILN" run "$T/m/stories260K.bin" -n 2 --kv-dtype fp8
want_ok "kv_scales.json (kiln calibrate; pre-RoPE K smoothing)" "$KILN" run "$T/m/stories260K.bin" -n 8 --kv-dtype fp8 --kv-smooth prerope
# a bad k_smooth value, and a mode without means
/usr/bin/python3 - "$T/pre.json" "$T/bad.json" "$T/nomean.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
d["k_smooth"] = "pre"
json.dump(d, open(sys.argv[2], "w"))
d["k_smooth"] = "prerope"
del d["k_mean"]
json.dump(d, open(sys.argv[3], "w"))
PY
want_err "bad.json: field 'k_smooth' is not \"post\" or \"prerope\"" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-smooth prerope --kv-scales "$T/bad.json"
want_err "nomean.json: field 'k_smooth' = \"prerope\" but the file has no 'k_mean'" "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-smooth prerope --kv-scales "$T/nomean.json"

[ $fails -eq 0 ] && echo ok || { echo "$fails failed"; exit 1; }
