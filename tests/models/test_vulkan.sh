#!/usr/bin/env bash
# The vulkan backend end to end (on Mesa's lavapipe in make test, on a GPU where there is one):
#   - stories260K greedy text byte-identical to llama2.c's printed outputs (F32 weights and KV);
#   - its logits within 1e-5 relative of the ref backend's over a prompt and 40 decode steps, and
#     byte for byte the same with gate, up and SwiGLU in one dispatch or three (KILN_VK_FFN_PAIR);
#   - GGUF Q8_0 / Q4_0 conversions: the same greedy text as the ref backend (both compute the
#     dequantized weights' products in f32; only summation order differs);
#   - FP8 and BF16 KV with the integrity fault campaign (every fault kind; attention and the content
#     hashes computed by the shader): every injected fault detected, the healed text equal to the
#     fault-free one;
#   - no op the backend runs natively fell back to the host (it says so on stderr when one does).
#   - tiny-dsv3 (MLA + MoE): the cpu backend's text with routing and experts on the device, one submit
#     per decode token (stories260K too: the KV store is on the device); both again with weights the
#     host cannot map (KILN_VK_UNMAPPED=1: uploaded through staging, as on a discrete GPU), and with
#     activations placed as on a discrete GPU with mapped VRAM (KILN_VK_ACTIVATIONS=device);
# The architecture tests against PyTorch run on the device too (scripts/run_tests.sh: KILN_DEVICES).
# Skipped (77) only when the build has no Vulkan; a build with it but no usable device fails.
set -euo pipefail
M=$SHARED/models/stories260K
E=$M/expected
[ -f "$M/stories260K.bin" ] || { echo "no stories260K under $SHARED"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
if ! "$KILN" inspect --devices > "$T/devices" 2>&1; then
    grep -q "built without Vulkan" "$T/devices" && { echo "kiln built without Vulkan"; exit 77; }
    echo "vulkan build without a usable device:"; cat "$T/devices"; exit 1
fi
DEV=${KILN_VK_DEVICE:-vulkan:0} # scripts/gpu_check.sh names the GPU
grep -q "^$DEV " "$T/devices" || { echo "no $DEV in:"; cat "$T/devices"; exit 1; }
V=(--device "$DEV")
no_fallback() { if grep -q "instead of the device" "$1"; then echo "an op left the device:"; cat "$1"; exit 1; fi; }

begins_with() { # file-with-output, expected-file
    local n; n=$(stat -c %s "$2")
    if ! cmp -s <(head -c "$n" "$1") "$2"; then
        echo "output does not begin with $2"; echo "--- got:"; head -c "$n" "$1"; echo; echo "--- expected:"; cat "$2"; exit 1
    fi
}
"$KILN" run "$M" --temp 0 -n 200 "${V[@]}" > "$T/bos.txt" 2> "$T/bos.err"
grep -q "compute: $DEV" "$T/bos.err" || { echo "start-up summary does not name the device:"; cat "$T/bos.err"; exit 1; }
no_fallback "$T/bos.err"
begins_with "$T/bos.txt" "$E/bos_greedy_n200.txt"
"$KILN" run "$M" --temp 0 -n 64 -p "Once upon a time" "${V[@]}" > "$T/once.txt" 2> "$T/once.err"
P=$(sed -n 's/^prompt: \([0-9]*\) tokens.*/\1/p' "$T/once.err")
"$KILN" run "$M" --temp 0 -n $((64 - P + 1)) -p "Once upon a time" "${V[@]}" 2>/dev/null | head -c -1 > "$T/once_exact.txt"
head -c -1 "$E/once_upon_a_time_n64.txt" > "$T/once_ref.txt"
cmp "$T/once_exact.txt" "$T/once_ref.txt"

# Logits against the ref backend.
"$KILN" run "$M" --temp 0 -n 40 --tokens 1,403,407,261,412 --dump-logits "$T/vk.bin" "${V[@]}" > /dev/null 2> "$T/l.err"
no_fallback "$T/l.err"
"$KILN" run "$M" --temp 0 -n 40 --tokens 1,403,407,261,412 --dump-logits "$T/ref.bin" --device ref > /dev/null 2>&1
"$PY" - "$T/vk.bin" "$T/ref.bin" <<'EOF'
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 512)
b = np.fromfile(sys.argv[2], dtype=np.float32).reshape(-1, 512)
assert a.shape == b.shape and a.shape[0] == 5 + 39, (a.shape, b.shape)
err = (np.abs(a - b).max(axis=1) / np.abs(b).max(axis=1)).max()
print("vulkan vs ref logits: %d rows, max relative error %.3g" % (a.shape[0], err))
sys.exit(0 if err < 1e-5 else 1)
EOF
# Gate, up and SwiGLU in one decode dispatch (KILN_VK_FFN_PAIR=1; lavapipe's default is three):
# the logits of the three dispatches, byte for byte, and the pair ran
for p in 0 1; do
    KILN_VK_FFN_PAIR=$p KILN_VK_STATS=1 "$KILN" run "$M" --temp 0 -n 40 --tokens 1,403,407,261,412 --dump-logits "$T/pair$p.bin" "${V[@]}" \
        > /dev/null 2> "$T/pair$p.err"
    no_fallback "$T/pair$p.err"
done
grep -q "gate, up and SwiGLU in one" "$T/pair1.err" || { echo "KILN_VK_FFN_PAIR=1: the pair did not run"; tail -3 "$T/pair1.err"; exit 1; }
cmp "$T/pair1.bin" "$T/pair0.bin" || { echo "KILN_VK_FFN_PAIR=1 and =0 logits differ"; exit 1; }

# GGUF Q8_0 / Q4_0: same greedy text as the ref backend.
for q in q8_0 q4_0; do
    "$KILN" convert "$M" "$T/$q.gguf" --outtype $q > /dev/null 2>&1
    "$KILN" run "$T/$q.gguf" --temp 0 -n 120 "${V[@]}" > "$T/$q.vk" 2> "$T/$q.err"
    no_fallback "$T/$q.err"
    "$KILN" run "$T/$q.gguf" --temp 0 -n 120 --device ref > "$T/$q.ref" 2>/dev/null
    cmp "$T/$q.vk" "$T/$q.ref" || { echo "$q: vulkan and ref greedy texts differ"; exit 1; }
    # the portable shared-memory reductions (a device without subgroup arithmetic) give it too
    KILN_VK_SUBGROUPS=0 "$KILN" run "$T/$q.gguf" --temp 0 -n 120 "${V[@]}" > "$T/$q.tree" 2> "$T/$q.tree.err"
    no_fallback "$T/$q.tree.err"
    cmp "$T/$q.tree" "$T/$q.ref" || { echo "$q: vulkan (KILN_VK_SUBGROUPS=0) and ref greedy texts differ"; exit 1; }
done

# FP8 / BF16 / F32 KV + fault injection (every kind): all caught, healed output identical, the same
# text as the cpu backend's. Attention runs in the shader over the pool's pages and the seals are
# checked against the hashes it computed; the rows are stored by the shader too, which hashes what
# it writes into the seals (and leaves the row of an injected lost write unwritten) — except FP8
# with K smoothing (the default), whose rows the host stores. The store on the device leaves one
# submit per decode step on this dense model (KILN_VK_STATS).
for dt in "fp8" "fp8 --kv-smooth off" "bf16" "f32"; do
    tag=${dt// /_}
    "$KILN" run "$M" --temp 0 -n 150 --kv-dtype $dt "${V[@]}" > "$T/$tag.txt" 2>/dev/null
    "$KILN" run "$M" --temp 0 -n 150 --kv-dtype $dt --device cpu > "$T/$tag.cpu" 2>/dev/null
    cmp "$T/$tag.txt" "$T/$tag.cpu" || { echo "$dt KV: vulkan and cpu greedy texts differ"; exit 1; }
    "$KILN" run "$M" --temp 0 -n 150 --kv-dtype $dt --inject-kv-faults "all=3,every=3" "${V[@]}" > "$T/${tag}f.txt" 2> "$T/${tag}f.err"
    no_fallback "$T/${tag}f.err"
    cmp "$T/$tag.txt" "$T/${tag}f.txt" || { echo "healed $dt output differs from the fault-free one"; exit 1; }
    grep -Eq "injected ([1-9][0-9]*), detected \1, before use \1, false alarms 0" "$T/${tag}f.err" ||
        { echo "$dt: not every injected fault detected before use:"; tail -2 "$T/${tag}f.err"; exit 1; }
done
KILN_VK_STATS=1 "$KILN" run "$M" --temp 0 -n 200 --kv-dtype bf16 "${V[@]}" > /dev/null 2> "$T/stats.err"
submits=$(sed -n 's/.* dispatches in \([0-9]*\) submits.*/\1/p' "$T/stats.err")
[ -n "$submits" ] && [ "$submits" -le 201 ] || { echo "expected one submit per token (200 tokens), got:"; tail -1 "$T/stats.err"; exit 1; }
# the Q / K / V projections of one input go without barriers between them (matmul_many: 2 a layer,
# 5 layers, 200 tokens)
indep=$(sed -n 's/.*: \([0-9]*\) of them with no barrier before them.*/\1/p' "$T/stats.err")
[ -n "$indep" ] && [ "$indep" -ge 2000 ] || { echo "expected the Q / K / V dispatches without barriers between them, got:"; cat "$T/stats.err"; exit 1; }
# Command buffers recorded once per step shape (vk_device.c): the decode steps replay a recorded
# one (a few are recorded: the prompt, the first decode steps, a staged table outgrowing its arena
# region); KILN_VK_REUSE=0, the control, records every one. The text above (cpu's) came from replays.
recorded=$(sed -n 's/.*submits (\([0-9]*\) command buffers recorded.*/\1/p' "$T/stats.err")
replayed=$(sed -n 's/.* recorded, \([0-9]*\) replayed.*/\1/p' "$T/stats.err")
[ -n "$recorded" ] && [ "$recorded" -le 8 ] && [ "$replayed" -ge 190 ] ||
    { echo "expected the decode steps to replay recorded command buffers, got:"; tail -1 "$T/stats.err"; exit 1; }
KILN_VK_STATS=1 KILN_VK_REUSE=0 "$KILN" run "$M" --temp 0 -n 20 --kv-dtype bf16 "${V[@]}" > /dev/null 2> "$T/stats0.err"
grep -q "in 20 submits (20 command buffers recorded, 0 replayed;" "$T/stats0.err" || { echo "KILN_VK_REUSE=0:"; tail -1 "$T/stats0.err"; exit 1; }
# MLA + MoE (tiny-dsv3): the routing and the experts on the device too (moe_routed) — the cpu
# backend's greedy text, one submit per decode token (+ one for the one-time check that the
# device's routing equals the host's)
D=$SHARED/models/tiny-dsv3
KILN_VK_STATS=1 "$KILN" run "$D" --temp 0 -n 40 "${V[@]}" > "$T/dsv3.vk" 2> "$T/dsv3.err"
no_fallback "$T/dsv3.err"
"$KILN" run "$D" --temp 0 -n 40 --device cpu > "$T/dsv3.cpu" 2>/dev/null
cmp "$T/dsv3.vk" "$T/dsv3.cpu" || { echo "tiny-dsv3: vulkan and cpu greedy texts differ"; exit 1; }
submits=$(sed -n 's/.* dispatches in \([0-9]*\) submits.*/\1/p' "$T/dsv3.err")
grep -q "MoE layers route on the host" "$T/dsv3.err" && { echo "tiny-dsv3: the device's routing check failed:"; cat "$T/dsv3.err"; exit 1; }
[ -n "$submits" ] && [ "$submits" -le 41 ] || { echo "tiny-dsv3: expected one submit per token (40 tokens), got:"; tail -1 "$T/dsv3.err"; exit 1; }

# DeepSeek sparse attention (deepseek_v32; glm_moe_dsa with GLM-5.2's shared-indexer layers): the
# indexer's LayerNorm and FP8 rounding, the compact rows' store, the indexer's scan and top-k and the
# sparse attention all on the device — the cpu backend's greedy text, one submit per decode token,
# nothing on the host; with F32 and FP8 (rope in bf16) rows and KV integrity (pages hashed where the
# scan reads them); the fault campaign on the device: every fault caught, the healed text the
# fault-free one. (Logits are not compared here: the model rounds through FP8 and BF16, so 1e-7
# differences in the matmuls move a value across a rounding midpoint now and then — see
# tests/models/test_arch_kv_quant.c.)
for am in "deepseek_v32 tiny" "glm_moe_dsa tiny-shared"; do
    set -- $am
    "$KILN" mkmodel --arch "$1" --preset "$2" --dtype f32 --seed 1 "$T/dsa" > /dev/null 2>&1
    for kv in f32 fp8; do
        KILN_VK_STATS=1 "$KILN" run "$T/dsa" --kv-dtype $kv --kv-integrity heal --tokens 1,5,9,13,17,21,25,29 -n 40 --temp 0 "${V[@]}" \
            > "$T/dsa.vk" 2> "$T/dsa.err"
        no_fallback "$T/dsa.err"
        "$KILN" run "$T/dsa" --kv-dtype $kv --kv-integrity heal --tokens 1,5,9,13,17,21,25,29 -n 40 --temp 0 --device cpu > "$T/dsa.cpu" 2>/dev/null
        cmp "$T/dsa.vk" "$T/dsa.cpu" || { echo "$1/$2 $kv KV: vulkan and cpu greedy texts differ"; exit 1; }
        submits=$(sed -n 's/.* dispatches in \([0-9]*\) submits.*/\1/p' "$T/dsa.err")
        # 40 tokens: the prompt, 39 decode steps, the routing check, the indexer's scratch grown once
        [ -n "$submits" ] && [ "$submits" -le 42 ] || { echo "$1/$2: expected one submit per token (40 tokens), got:"; tail -1 "$T/dsa.err"; exit 1; }
        grep -q "heal, [1-9][0-9]* page checks .* 0 detections" "$T/dsa.err" || { echo "$1/$2: no clean checks:"; tail -3 "$T/dsa.err"; exit 1; }
    done
    # the indexer's scores limited to 192 bytes (48 positions of one token): the 8-token prompt
    # scans and selects in two token groups, as a long chunk at a long context does — same text,
    # every page still verified clean, and one scan + top-k more per indexed layer than above
    d_one=$(sed -n 's/.*: \([0-9]*\) dispatches in .*/\1/p' "$T/dsa.err")
    KILN_VK_STATS=1 KILN_VK_INDEX_BYTES=192 "$KILN" run "$T/dsa" --kv-dtype fp8 --kv-integrity heal --tokens 1,5,9,13,17,21,25,29 -n 40 --temp 0 \
        "${V[@]}" > "$T/dsa.vk" 2> "$T/dsa.err"
    no_fallback "$T/dsa.err"
    cmp "$T/dsa.vk" "$T/dsa.cpu" || { echo "$1/$2: vulkan with the indexer in token groups and cpu greedy texts differ"; exit 1; }
    grep -q "heal, [1-9][0-9]* page checks .* 0 detections" "$T/dsa.err" || { echo "$1/$2 (token groups): no clean checks:"; tail -3 "$T/dsa.err"; exit 1; }
    d_grp=$(sed -n 's/.*: \([0-9]*\) dispatches in .*/\1/p' "$T/dsa.err")
    [ -n "$d_one" ] && [ -n "$d_grp" ] && [ "$d_grp" -gt "$d_one" ] ||
        { echo "$1/$2: the prompt was not scanned in token groups ($d_grp dispatches, $d_one without the bound)"; exit 1; }
    "$KILN" run "$T/dsa" --kv-dtype fp8 --tokens 1,5,9,13 -n 40 --temp 0 "${V[@]}" > "$T/dsa.clean" 2>/dev/null
    "$KILN" run "$T/dsa" --kv-dtype fp8 --tokens 1,5,9,13 -n 40 --temp 0 --inject-kv-faults "all=3,every=3" "${V[@]}" > "$T/dsa.f" 2> "$T/dsa.ferr"
    no_fallback "$T/dsa.ferr"
    cmp "$T/dsa.clean" "$T/dsa.f" || { echo "$1/$2: healed output differs from the fault-free one"; exit 1; }
    grep -Eq "injected ([1-9][0-9]*), detected \1, before use \1, false alarms 0" "$T/dsa.ferr" ||
        { echo "$1/$2: not every injected fault detected before use:"; tail -2 "$T/dsa.ferr"; exit 1; }
    rm -rf "$T/dsa"
done

# A step of more dispatches than one chunk of parameter slots holds (48 layers: ~770; chunks of
# 512) is still one submit, with the cpu backend's tokens, and replayed
"$KILN" mkmodel --arch llama --preset tiny --layers 48 "$T/deep" > /dev/null 2>&1
KILN_VK_STATS=1 "$KILN" run "$T/deep" --tokens 1,2,3 -n 10 --temp 0 "${V[@]}" > "$T/deep.vk" 2> "$T/deep.err"
"$KILN" run "$T/deep" --tokens 1,2,3 -n 10 --temp 0 --device cpu > "$T/deep.cpu" 2>/dev/null
cmp "$T/deep.vk" "$T/deep.cpu" || { echo "48-layer model: vulkan and cpu tokens differ"; exit 1; }
submits=$(sed -n 's/.* dispatches in \([0-9]*\) submits.*/\1/p' "$T/deep.err")
[ -n "$submits" ] && [ "$submits" -le 10 ] || { echo "48-layer model: expected one submit per step (10), got:"; tail -1 "$T/deep.err"; exit 1; }
grep -q "recorded, [5-9] replayed" "$T/deep.err" || { echo "48-layer model: expected replayed steps, got:"; tail -1 "$T/deep.err"; exit 1; }

# Weights in device memory the host cannot map (a discrete GPU's; KILN_VK_UNMAPPED=1 keeps
# lavapipe's unmapped): uploaded through the staging buffer, the same greedy text as the cpu
# backend (tiny-dsv3: MLA, the experts by id) and as llama2.c (stories260K), nothing on the host
KILN_VK_UNMAPPED=1 "$KILN" run "$D" --temp 0 -n 40 "${V[@]}" > "$T/dsv3.um" 2> "$T/dsv3.umerr"
no_fallback "$T/dsv3.umerr"
cmp "$T/dsv3.um" "$T/dsv3.cpu" || { echo "tiny-dsv3 with unmapped weights: vulkan and cpu greedy texts differ"; exit 1; }
KILN_VK_UNMAPPED=1 "$KILN" run "$M" --temp 0 -n 40 --kv-dtype f32 "${V[@]}" > "$T/stories.um" 2> "$T/stories.umerr"
no_fallback "$T/stories.umerr"
"$KILN" run "$M" --temp 0 -n 40 --kv-dtype f32 --device cpu > "$T/stories.cpu" 2>/dev/null
cmp "$T/stories.um" "$T/stories.cpu" || { echo "stories260K with unmapped weights: vulkan and cpu greedy texts differ"; exit 1; }

# Activations and read-only staged operands placed as on a discrete GPU with mapped VRAM
# (KILN_VK_ACTIVATIONS=device; lavapipe's one memory type either way, so this checks the placement
# logic and the two staging arenas, not speed): the same texts; a bad value is refused by name.
KILN_VK_ACTIVATIONS=device "$KILN" run "$D" --temp 0 -n 40 "${V[@]}" > "$T/dsv3.act" 2> "$T/dsv3.acterr"
no_fallback "$T/dsv3.acterr"
cmp "$T/dsv3.act" "$T/dsv3.cpu" || { echo "tiny-dsv3 with KILN_VK_ACTIVATIONS=device: vulkan and cpu greedy texts differ"; exit 1; }
KILN_VK_ACTIVATIONS=host "$KILN" run "$M" --temp 0 -n 40 --kv-dtype f32 "${V[@]}" > "$T/stories.act" 2> "$T/stories.acterr"
cmp "$T/stories.act" "$T/stories.cpu" || { echo "stories260K with KILN_VK_ACTIVATIONS=host: vulkan and cpu greedy texts differ"; exit 1; }
if KILN_VK_ACTIVATIONS=vram "$KILN" run "$M" -n 2 "${V[@]}" > /dev/null 2> "$T/act.err"; then echo "KILN_VK_ACTIVATIONS=vram accepted"; exit 1; fi
grep -q "KILN_VK_ACTIVATIONS: 'vram' is not device or host" "$T/act.err" || { echo "bad KILN_VK_ACTIVATIONS error:"; cat "$T/act.err"; exit 1; }

# The 4-row INT4 decode GEMV (KILN_VK_GEMV_ROWS=4; 1 is the default) gives the one-row variant's floats:
# stories260K requantized to INT4 group 32 decodes the same text on the device with either
"$KILN" quantize "$M/stories260K.bin" "$T/s_int4" --weights int4 --group 32 > /dev/null 2>&1
KILN_VK_GEMV_ROWS=1 "$KILN" run "$T/s_int4" --temp 0 -n 60 "${V[@]}" > "$T/int4.r1" 2> "$T/int4.r1err"
KILN_VK_STATS=1 KILN_VK_GEMV_ROWS=4 "$KILN" run "$T/s_int4" --temp 0 -n 60 "${V[@]}" > "$T/int4.r4" 2> "$T/int4.r4err"
no_fallback "$T/int4.r4err"
grep -q "[1-9][0-9]* of them the 4-row INT4 GEMV" "$T/int4.r4err" || { echo "stories260K INT4: the 4-row GEMV did not run:"; tail -2 "$T/int4.r4err"; exit 1; }
[ -s "$T/int4.r1" ] || { echo "stories260K INT4: no text"; cat "$T/int4.r1err"; exit 1; }
cmp "$T/int4.r1" "$T/int4.r4" || { echo "stories260K INT4: KILN_VK_GEMV_ROWS=4 changed the text"; exit 1; }

# Bad device index: a clear error naming it.
if "$KILN" run "$M" -n 2 --device vulkan:9 > /dev/null 2> "$T/bad.err"; then echo "vulkan:9 accepted"; exit 1; fi
grep -q "device index 9 is out of range" "$T/bad.err" || { echo "bad error:"; cat "$T/bad.err"; exit 1; }
echo "ok"
