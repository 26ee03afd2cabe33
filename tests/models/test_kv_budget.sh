#!/usr/bin/env bash
# KV cache at the CLI on stories260K (docs/KV.md):
#   - capacity: for the same --kv-mem, FP8 holds >= 1.99x the tokens of BF16 (page metadata
#     counted), bytes per token exactly half, from `kiln inspect --kv --json`;
#   - a run whose context fits the budget in FP8 but not in BF16: FP8 completes, BF16 stops with a
#     clear "KV budget exhausted" error (exit 1, no crash);
#   - a budget below one page, bad kv_scales.json files: errors naming the option / field;
#   - the FP8 start-up summary announces where the scales come from (never a silent 1.0);
#   - kiln calibrate writes a kv_scales.json that the next run picks up.
set -euo pipefail
M=$SHARED/models/stories260K
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
PY=${PY:-/usr/bin/python3}

field() { "$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

# ---- capacity ----
for mem in 1M 64M; do
    "$KILN" inspect "$M" --kv --json --kv-dtype bf16 --kv-mem $mem > "$T/b.json"
    "$KILN" inspect "$M" --kv --json --kv-dtype fp8 --kv-mem $mem > "$T/f.json"
    cb=$(field "$T/b.json" capacity_tokens); cf=$(field "$T/f.json" capacity_tokens)
    bb=$(field "$T/b.json" bytes_per_token); bf=$(field "$T/f.json" bytes_per_token)
    echo "kv-mem $mem: bf16 $cb tokens ($bb B/token), fp8 $cf tokens ($bf B/token)"
    [ "$bb" -eq 640 ] || { echo "bf16 bytes/token $bb != 5 layers x 2 x 4 heads x 8 x 2 = 640"; exit 1; }
    [ "$bf" -eq 320 ] || { echo "fp8 bytes/token $bf != 320"; exit 1; }
    "$PY" -c "import sys; r=$cf/$cb; print('ratio %.4f' % r); sys.exit(0 if 1.99 <= r <= 2.0 else 1)"
    [ "$(field "$T/f.json" kv_dtype)" = fp8_e4m3 ] && [ "$(field "$T/f.json" page_tokens)" = 16 ]
done

# ---- fits in FP8, not in BF16: 100,000 bytes = 9 BF16 pages (144 tokens) or 19 FP8 pages (304) ----
"$KILN" run "$M" --temp 0 -n 250 --kv-dtype fp8 --kv-mem 100000 > "$T/fp8.txt" 2> "$T/fp8.err" || { echo "fp8 run failed:"; cat "$T/fp8.err"; exit 1; }
grep -q "decode: 250 tokens" "$T/fp8.err" || { echo "fp8 run did not generate 250 tokens:"; cat "$T/fp8.err"; exit 1; }
grep -q "capacity\|tokens in" "$T/fp8.err"
set +e
"$KILN" run "$M" --temp 0 -n 250 --kv-dtype bf16 --kv-mem 100000 > "$T/bf16.txt" 2> "$T/bf16.err"
rc=$?
set -e
[ $rc -eq 1 ] || { echo "bf16 run: exit $rc, expected 1"; cat "$T/bf16.err"; exit 1; }
grep -q "kiln run: error: KV budget exhausted: 145 tokens need 10 pages" "$T/bf16.err" || { echo "no clear exhaustion error:"; cat "$T/bf16.err"; exit 1; }
# the text generated before the budget ran out is the FP8 run's beginning or at least non-empty
[ -s "$T/bf16.txt" ]

# ---- a budget below one page ----
set +e
"$KILN" run "$M" -n 4 --kv-dtype bf16 --kv-mem 1000 > /dev/null 2> "$T/small.err"; rc=$?
"$KILN" inspect "$M" --kv --kv-mem 1000 > /dev/null 2> "$T/small2.err"; rc2=$?
set -e
[ $rc -eq 1 ] && [ $rc2 -eq 1 ] || { echo "tiny budget: exits $rc $rc2"; exit 1; }
grep -q "KV budget exhausted: --kv-mem (kv_mem_bytes) = 1000 bytes is smaller than one KV page" "$T/small.err" || { cat "$T/small.err"; exit 1; }
grep -q "kv_mem_bytes" "$T/small2.err"

# ---- scale sources: built-in calibration is announced; calibrate → kv_scales.json ----
"$KILN" run "$M" -n 2 --temp 0 --kv-dtype fp8 2> "$T/cal.err" > /dev/null
grep -q "fp8 scales: built-in calibration (256 tokens" "$T/cal.err" || { cat "$T/cal.err"; exit 1; }
cp "$M"/stories260K.bin "$M"/tok512.bin "$T/"
"$KILN" calibrate "$T/stories260K.bin" --data "$SHARED/data/more/tinystories_sample.txt" 2> "$T/calib.err"
[ -f "$T/kv_scales.json" ] || { echo "calibrate wrote no kv_scales.json beside the model"; cat "$T/calib.err"; exit 1; }
[ "$(field "$T/kv_scales.json" num_layers)" = 5 ] && [ "$(field "$T/kv_scales.json" num_kv_heads)" = 4 ]
"$KILN" inspect "$T/stories260K.bin" --kv --json --kv-dtype fp8 > "$T/i.json"
field "$T/i.json" scale_source | grep -q "kv_scales.json (kiln calibrate; K smoothing)"
"$KILN" run "$T/stories260K.bin" -n 8 --temp 0 --kv-dtype fp8 2> "$T/run.err" > /dev/null
grep -q "fp8 scales: .*kv_scales.json" "$T/run.err"

# ---- checkpoint scales (vLLM convention: model.layers.N.self_attn.k_scale / v_scale) win over the
#      built-in pass; a bad one is an error naming the tensor ----
"$KILN" convert "$M" "$T/hf" 2>/dev/null
add_scales() { # dir, v_scale of layer 3
    "$PY" - "$1/model.safetensors" "$2" <<'PYEOF'
import json, struct, sys
path, v3 = sys.argv[1], float(sys.argv[2])
b = open(path, 'rb').read()
n = struct.unpack('<Q', b[:8])[0]
hdr = json.loads(b[8:8 + n]); data = b[8 + n:]
extra = b''
for l in range(5):
    for kind, val in (('k_scale', 0.08), ('v_scale', v3 if l == 3 else 0.01)):
        hdr['model.layers.%d.self_attn.%s' % (l, kind)] = {'dtype': 'F32', 'shape': [], 'data_offsets': [len(data) + len(extra), len(data) + len(extra) + 4]}
        extra += struct.pack('<f', val)
h = json.dumps(hdr).encode(); h += b' ' * ((8 - len(h) % 8) % 8)
open(path, 'wb').write(struct.pack('<Q', len(h)) + h + data + extra)
PYEOF
}
cp -r "$T/hf" "$T/hf_bad"
add_scales "$T/hf" 0.01
add_scales "$T/hf_bad" -1
"$KILN" run "$T/hf" -n 16 --temp 0 --kv-dtype fp8 > /dev/null 2> "$T/ck.err" || { cat "$T/ck.err"; exit 1; }
grep -q "fp8 scales: checkpoint (model.layers.N.self_attn.k_scale / v_scale)" "$T/ck.err" || { cat "$T/ck.err"; exit 1; }
set +e
"$KILN" run "$T/hf_bad" -n 4 --kv-dtype fp8 > /dev/null 2> "$T/ck.err"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "tensor 'model.layers.3.self_attn.v_scale'\[0\] = -1 is not a positive finite scale" "$T/ck.err" || { echo "bad checkpoint scale: exit $rc"; cat "$T/ck.err"; exit 1; }

# ---- bad kv_scales.json: clear errors naming the field ----
bad() { # name, json text, expected message part
    printf '%s' "$2" > "$T/$1"
    set +e
    "$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-scales "$T/$1" > /dev/null 2> "$T/bad.err"; local rc=$?
    set -e
    [ $rc -eq 1 ] && grep -qF "$3" "$T/bad.err" || { echo "$1: exit $rc, wanted '$3' in:"; cat "$T/bad.err"; exit 1; }
}
H='{"format":"kiln-kv-scales","version":1,"dtype":"fp8_e4m3",'
R='[1,1,1,1]'
bad layers.json "$H\"num_layers\":4,\"num_kv_heads\":4,\"k_scale\":[$R],\"v_scale\":[$R]}" "field 'num_layers' = 4 but the model has 5 layers"
bad heads.json "$H\"num_layers\":5,\"num_kv_heads\":2,\"k_scale\":[$R],\"v_scale\":[$R]}" "field 'num_kv_heads' = 2 but the model has 4 KV heads"
bad rows.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[$R,$R,$R,$R,[1,1,1]],\"v_scale\":[$R,$R,$R,$R,$R]}" "field 'k_scale[4]' has 3 heads but the model has 4 KV heads"
bad neg.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[$R,$R,$R,$R,$R],\"v_scale\":[$R,[1,-0.5,1,1],$R,$R,$R]}" "field 'v_scale[1][1]' = -0.5 is not a positive finite scale"
bad zero.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[$R,$R,[0,1,1,1],$R,$R],\"v_scale\":[$R,$R,$R,$R,$R]}" "field 'k_scale[2][0]' = 0 is not a positive finite scale"
bad tiny.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[$R,$R,$R,$R,$R],\"v_scale\":[$R,$R,[1,1,2e-127,1],$R,$R]}" "field 'v_scale[2][2]' = 2e-127 is not a positive finite scale (a normal float"
bad denormal.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[[1e-40,1,1,1],$R,$R,$R,$R],\"v_scale\":[$R,$R,$R,$R,$R]}" "field 'k_scale[0][0]' = 1e-40 is not a positive finite scale"
bad inf.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[$R,$R,[1e999,1,1,1],$R,$R],\"v_scale\":[$R,$R,$R,$R,$R]}" "inf.json: line 1"
bad nan.json "$H\"num_layers\":5,\"num_kv_heads\":4,\"k_scale\":[$R,$R,[NaN,1,1,1],$R,$R],\"v_scale\":[$R,$R,$R,$R,$R]}" "nan.json: line 1"
set +e
"$KILN" run "$M" -n 2 --kv-dtype fp8 --kv-scales "$T/missing.json" > /dev/null 2> "$T/bad.err"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "missing.json: cannot open" "$T/bad.err"
echo ok
