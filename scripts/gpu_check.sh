#!/usr/bin/env bash
# gpu_check.sh — issue 26's check on a machine with a real GPU, in one prepared run (under 9
# minutes, the device tool's 10-minute command limit): picks the first Vulkan device that is not a
# CPU (lavapipe), runs the op tests and the model tests on it, then the benchmarks.
#   bash scripts/gpu_check.sh [SHARED_DIR]     (SHARED_DIR: ../shared by default, for stories260K)
# Binaries: the bundle scripts/gpu_bundle.sh made here (.gpu/kiln-gpu.tar.xz: kiln, the op test,
# the shared libraries and the models the tests read; the lent machine has none of kiln's -dev
# libraries, no glslc and no ../shared), else a build on the spot (make kiln tests).
# Results: $OUT (the device tool's folder; default gpu_check_out/) receives summary.json and
# gpu_check.tar.gz (every step's log and JSON: devices.txt, ops.log, models.log, bench_decode.json,
# bench_ab_*.json, bench_moe.json, bench_dsa.json, bench_integrity.json, kv_bf16.json / kv_fp8.json,
# profile*.log with the device time per shader, decode and a 512-token prefill), both refreshed after every step: the device tool
# returns at most 8 files, and what a killed run left. Models go to $GPU_CHECK_WORK
# (/tmp/kiln-gpu-check), never to $OUT.
# Each step has its own time limit, cut to what is left of GPU_CHECK_BUDGET (default 540 s); a
# failed step does not stop the later ones, a step past the budget is skipped; summary.json says
# which passed. Nothing here is a GPU claim by itself: docs/BENCHMARKS.md records what a run on a
# lent GPU printed, with the machine named.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
WORK=${GPU_CHECK_WORK:-/tmp/kiln-gpu-check}
RES=$WORK/results
BUDGET=${GPU_CHECK_BUDGET:-540}
# the run-order switches take one value each; anything else is refused before the device is used
case ${GPU_CHECK_OPS:-} in "" | late) ;; *) echo "gpu_check: GPU_CHECK_OPS='$GPU_CHECK_OPS' is not 'late' (or unset)" >&2; exit 2 ;; esac
case ${GPU_CHECK_DECODE:-} in "" | skip) ;; *) echo "gpu_check: GPU_CHECK_DECODE='$GPU_CHECK_DECODE' is not 'skip' (or unset)" >&2; exit 2 ;; esac
rm -rf "$RES" && mkdir -p "$OUT" "$RES" # results of this run only (the models are kept for a rerun)
OUT=$(cd "$OUT" && pwd)
SHARED=${1:-${SHARED:-$(cd .. && pwd)/shared}}
# a Python with numpy for the model tests' comparisons (the first python3 on PATH may lack it)
if [ -z "${PY:-}" ]; then
    for c in python3 /usr/bin/python3; do "$c" -c "import numpy" 2>/dev/null && { PY=$c; break; }; done
fi
declare -A status
pack() { # what is done so far, into $OUT
    tar -czf "$OUT/gpu_check.tar.gz" -C "$RES" . 2> /dev/null
    {
        printf '{"device": "%s",\n "steps": {' "$(grep "^${DEV:-none} " "$RES/devices.txt" 2> /dev/null | sed 's/"/\\"/g')"
        local sep="" k
        for k in "${!status[@]}"; do printf '%s"%s": "%s"' "$sep" "$k" "${status[$k]}"; sep=", "; done
        printf '}}\n'
    } > "$RES/summary.json"
    cp "$RES/summary.json" "$OUT/summary.json"
}
step() { # name, time limit (s), command...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS left=$((BUDGET - SECONDS))
    if [ "$left" -lt 10 ]; then
        status[$name]="skipped (budget)"
    else
        [ "$limit" -gt "$left" ] && limit=$left
        if timeout "$limit" "$@" > "$RES/$name.log" 2>&1; then status[$name]=pass; else status[$name]="fail (rc $?)"; fi
    fi
    echo "$name: ${status[$name]} in $((SECONDS - t0)) s"
    pack
}
if [ -f .gpu/kiln-gpu.tar.xz ]; then
    BUNDLE=${GPU_BUNDLE_DIR:-/tmp/kiln-gpu}
    rm -rf "$BUNDLE" && mkdir -p "$BUNDLE" && tar -xJf .gpu/kiln-gpu.tar.xz -C "$BUNDLE" || { echo "cannot unpack .gpu/kiln-gpu.tar.xz"; exit 1; }
    export LD_LIBRARY_PATH=$BUNDLE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    KILN=$BUNDLE/kiln
    OPS=$BUNDLE/tests/ops/test_backend_ops
    [ -f "$SHARED/models/stories260K/stories260K.bin" ] || SHARED=$BUNDLE/shared
    echo "binaries: the bundle (.gpu/kiln-gpu.tar.xz)"
else
    KILN=$PWD/kiln
    OPS=build/tests/ops/test_backend_ops
    step build 300 make -j"$(nproc)" kiln tests
fi
export KILN SHARED PY=${PY:-python3}
"$KILN" inspect --devices > "$RES/devices.txt" 2>&1
command -v nvidia-smi > /dev/null && nvidia-smi > "$RES/nvidia_smi.txt" 2>&1 # the driver and clocks, where NVIDIA's
# NVIDIA's driver may sit outside the loader's search path (the lent machines mount it under
# /usr/local/nvidia): named for the loader when no GPU was found without it
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if ! awk '/^vulkan:[0-9]+ / && $0 !~ /\(CPU,/ {f = 1} END {exit !f}' "$RES/devices.txt" && [ -z "${VK_DRIVER_FILES:-}" ] && [ -f "$NV_ICD" ]; then
    export VK_DRIVER_FILES=$NV_ICD
    "$KILN" inspect --devices > "$RES/devices.txt" 2>&1
fi
# GPU_CHECK_DEVICE=vulkan:N forces a device (a dry run of this script on lavapipe, with
# GPU_CHECK_SHAPE="--preset tiny --seq 8192" and GPU_CHECK_MOE="--preset tiny" for models lavapipe
# runs in seconds)
DEV=${GPU_CHECK_DEVICE:-$(awk '/^vulkan:[0-9]+ / && $0 !~ /\(CPU,/ {print $1; exit}' "$RES/devices.txt")}
if [ -z "$DEV" ]; then
    # what the loader tried (driver manifests, libraries and why they failed to load), for the next try
    VK_LOADER_DEBUG=error,warn,info,driver "$KILN" inspect --devices > "$RES/loader_debug.txt" 2>&1
    for icd in /usr/share/vulkan/icd.d/*.json /etc/vulkan/icd.d/*.json "$NV_ICD"; do [ -f "$icd" ] && { echo "== $icd"; cat "$icd"; }; done >> "$RES/loader_debug.txt" 2>&1
    echo "no GPU among the Vulkan devices:"; cat "$RES/devices.txt"; tail -20 "$RES/loader_debug.txt"; pack; exit 1
fi
echo "device: $(grep "^$DEV " "$RES/devices.txt")"
export KILN_VK_DEVICE=$DEV KILN_VK_DEVICE_INDEX=${DEV#vulkan:}

# the benchmark models (a few GB of random BF16 weights) are written in the background while the
# correctness steps run, so that the host's cores and disk overlap the device's work:
# M: the 1.7B shape of the CPU benchmarks (dim 3072, ffn 8192, 16 layers, 24 heads, 8 KV heads);
# F: MoE + MLA, the GLM-4.7-Flash-shaped preset (GPU_CHECK_MOE="--preset tiny" for a dry run on
# lavapipe); G: GLM-5.x sparse attention, the glm52 preset (GLM-5's per-layer shapes, 2 layers)
M=$WORK/b17 F=$WORK/flash G=$WORK/glm52
SHAPE=${GPU_CHECK_SHAPE:---preset bench-500m --dim 3072 --ffn 8192 --layers 16 --heads 24 --kv-heads 8 --seq 8192}
MOE=${GPU_CHECK_MOE:---preset glm47-flash}
DSA=${GPU_CHECK_DSA:---preset glm52}
make_models() {
    # shellcheck disable=SC2086
    { [ -f "$M/config.json" ] || "$KILN" mkmodel --arch llama $SHAPE --dtype bf16 "$M"; } &&
        { [ -f "$F/config.json" ] || "$KILN" mkmodel --arch glm4_moe_lite $MOE --dtype bf16 "$F"; } &&
        { [ -f "$G/config.json" ] || "$KILN" mkmodel --arch glm_moe_dsa $DSA --seq 8192 --dtype bf16 "$G"; }
}
make_models > "$RES/mkmodel.log" 2>&1 &
MKMODEL_PID=$!

# correctness on the device: every op x format against the ref backend, stories260K against
# llama2.c, the integrity campaign (the architectures' PyTorch references run last, where torch is)
# GPU_CHECK_OPS=late: the op tests after the decode figures, the profile and the A/B (a second run
# in one session, whose first already passed them: the figures first)
[ "${GPU_CHECK_OPS:-}" = late ] || step ops 120 "$OPS"
step models 120 bash tests/models/test_vulkan.sh
t0=$SECONDS
if wait "$MKMODEL_PID"; then status[mkmodel]=pass; else status[mkmodel]="fail (rc $?)"; fi
echo "mkmodel: ${status[mkmodel]} (waited $((SECONDS - t0)) s)"
# batch-1 decode against the device's read bandwidth, INT4 / FP8 / BF16 side by side, and prefill
# at 512 tokens (prompt_tps)
[ "${GPU_CHECK_DECODE:-}" = skip ] || step bench_decode 150 sh -c "'$KILN' bench '$M' --device $DEV --weights bf16,fp8,int4 --prompt 512 --gen 64 --repeat 3 --json > '$RES/bench_decode.json'"
# the new binary against an old one (the bundle's kiln-base: GPU_BUNDLE_BASE=<commit> in
# gpu_bundle.sh), alternated base / new twice, the same decode and 512-token prefill
if [ -x "${BUNDLE:-}/kiln-base" ]; then
    base_ab() {
        local i=0 c bin
        for c in base new base new; do
            i=$((i + 1)); bin=$KILN; [ "$c" = base ] && bin=$BUNDLE/kiln-base
            "$bin" bench "$M" --device "$DEV" --weights bf16,fp8,int4 --prompt 512 --gen 64 --repeat 1 --json \
                > "$RES/bench_base_${i}_$c.json" 2> "$RES/bench_base_${i}_$c.err" || return 1
        done
    }
    export -f base_ab
    export M DEV RES KILN BUNDLE
    step bench_base_ab 150 bash -c base_ab
fi
# KV capacity: bytes per token of BF16 and FP8 pools
for dt in bf16 fp8; do "$KILN" inspect "$M" --kv --kv-dtype $dt --json > "$RES/kv_$dt.json" 2>/dev/null; done
# where a decode step's device time goes: timestamp queries per shader (KILN_VK_PROFILE), INT4 weights
step profile 60 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 "$KILN" bench "$M" --device "$DEV" --weights int4,bf16 --prompt 16 --gen 64 --repeat 1
# integrity: heal vs off at 4,000 tokens of context (decode and time to first token)
step bench_integrity 120 sh -c "'$KILN' bench '$M' --integrity --device $DEV --ctx 4000 --prompt 16 --decode 16 --repeat 2 --modes off,heal \
    --kv-dtype bf16,fp8 --no-campaign --json > '$RES/bench_integrity.json'"
# the host/device choices a GPU decides, A/B in alternation (INT4 decode): command buffers
# recorded once per step shape and replayed (KILN_VK_REUSE=0: recorded every step), subgroup
# reductions (KILN_VK_SUBGROUPS=0: the portable shared-memory tree sums), the 4-row INT4 GEMV
# (KILN_VK_GEMV_ROWS=4: X loaded once per 4 rows, the same floats), gate, up and SwiGLU in one
# dispatch (KILN_VK_FFN_PAIR=0: three, the same floats; alternated twice with base); KILN_VK_STATS in the .err
ab_bench() {
    local i=0 c
    for c in base pair0 base pair0 reuse0 sg0 gemv4; do
        i=$((i + 1))
        case $c in reuse0) set -- KILN_VK_REUSE=0 ;; sg0) set -- KILN_VK_SUBGROUPS=0 ;; acthost) set -- KILN_VK_ACTIVATIONS=host ;; gemv4) set -- KILN_VK_GEMV_ROWS=4 ;;
            pair0) set -- KILN_VK_FFN_PAIR=0 ;; *) set -- KILN_VK_REUSE=1 ;; esac
        env "$@" KILN_VK_STATS=1 "$KILN" bench "$M" --device "$DEV" --weights int4 --prompt 16 --gen 64 --repeat 2 --json \
            > "$RES/bench_ab_${i}_$c.json" 2> "$RES/bench_ab_${i}_$c.err" || return 1
    done
}
export -f ab_bench
export M DEV RES
step bench_ab 150 bash -c ab_bench
# and a prefill's: one 512-token prompt, one decoded token
step profile_prefill 60 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 "$KILN" bench "$M" --device "$DEV" --weights int4 --prompt 512 --gen 1 --repeat 1
[ "${GPU_CHECK_OPS:-}" = late ] && step ops 120 "$OPS"
# MoE + MLA on the device (routing and experts by id: moe_routed): the GLM-4.7-Flash-shaped preset,
# BF16 / FP8 / INT4 experts, decode against the device bandwidth and the per-shader profile
# (GPU_CHECK_MOE="--preset tiny" for a dry run on lavapipe)
step bench_moe 100 sh -c "'$KILN' bench '$F' --device $DEV --weights bf16,fp8,int4 --scope experts --prompt 128 --gen 64 --repeat 3 --json > '$RES/bench_moe.json'"
step profile_moe 60 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 "$KILN" bench "$F" --device "$DEV" --weights int4 --scope experts --prompt 16 --gen 32 --repeat 1
# GLM-5.x sparse attention on the device (indexer scan + top-k + sparse attention, DSA compact rows):
# the glm52 preset (GLM-5's per-layer shapes, 2 layers), a 2,048-token prompt so that the top-2048
# selection is the whole context at first and a strict subset while decoding, BF16 / INT4 weights,
# and the per-shader profile (GPU_CHECK_DSA="--preset tiny" for a dry run on lavapipe)
step bench_dsa 100 sh -c "'$KILN' bench '$G' --device $DEV --weights bf16,int4 --prompt 2048 --gen 64 --repeat 2 --json > '$RES/bench_dsa.json'"
step profile_dsa 60 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 "$KILN" bench "$G" --device "$DEV" --weights int4 --prompt 2048 --gen 32 --repeat 1

# the host's CPU (issue 20): the lent machines' CPUs may have AMX, which the development VMs lack.
# lscpu goes into the results; where AMX is present, a prompt's Q8_0 GEMM on the AMX tiles against
# the same binary with KILN_AMX=0 (the AVX-512 VNNI kernel, the same bits), alternated twice, all cores
lscpu > "$RES/host_cpu.txt" 2>&1
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null; then
    amx_ab() {
        local i=0 c
        for c in amx avx512 amx avx512; do
            i=$((i + 1))
            env KILN_AMX=$([ "$c" = amx ] && echo 1 || echo 0) "$KILN" bench "$M" --weights q8_0 --prompt 512 --gen 4 --repeat 1 \
                --threads "$(nproc)" --json > "$RES/host_amx_${i}_$c.json" 2> "$RES/host_amx_${i}_$c.err" || return 1
        done
    }
    export -f amx_ab
    export M RES KILN
    step host_amx 120 bash -c amx_ab
fi

# the architectures' PyTorch references on the device (where the budget leaves time and torch is there)
if $PY -c "import torch, numpy" 2>/dev/null; then
    step arch_deepseek_v3 120 env KILN_DEVICES="$DEV" $PY tests/models/test_arch_deepseek_v3.py
    step arch_glm4_moe 120 env KILN_DEVICES="$DEV" $PY tests/models/test_arch_glm4_moe.py
fi
pack
$PY - "$RES" <<'PYEOF'
import json, os, sys
out = sys.argv[1]
s = json.load(open(os.path.join(out, "summary.json")))
def load(name):
    p = os.path.join(out, name)
    try:
        txt = open(p).read().strip()
        return [json.loads(l) for l in txt.splitlines() if l.startswith("{")]
    except (OSError, ValueError):
        return []
rows = {r.get("weights"): r for r in load("bench_decode.json")}
if rows:
    s["decode"] = {w: {"decode_tps": r["decode_tps"], "prompt_tps_512": r["prompt_tps"], "fraction_of_device_bandwidth": r["roofline_fraction"],
                       "device_gbps": r["measured_gbps"]} for w, r in rows.items()}
    if "int4" in rows and "fp8" in rows:
        s["int4_over_fp8_decode"] = rows["int4"]["decode_tps"] / rows["fp8"]["decode_tps"]
moe = {r.get("weights"): r for r in load("bench_moe.json")}
if moe:
    s["moe_decode"] = {w: {"decode_tps": r["decode_tps"], "prompt_tps_128": r["prompt_tps"], "fraction_of_device_bandwidth": r["roofline_fraction"]}
                       for w, r in moe.items()}
dsa = {r.get("weights"): r for r in load("bench_dsa.json")}
if dsa:
    s["dsa_decode"] = {w: {"decode_tps": r["decode_tps"], "prompt_tps_2048": r["prompt_tps"], "fraction_of_device_bandwidth": r["roofline_fraction"]}
                       for w, r in dsa.items()}
kv = {dt: load("kv_%s.json" % dt) for dt in ("bf16", "fp8")}
if kv["bf16"] and kv["fp8"]:
    s["kv_fp8_tokens_per_bf16_token"] = kv["bf16"][0]["bytes_per_token"] / kv["fp8"][0]["bytes_per_token"]
s["integrity"] = load("bench_integrity.json")
ab = {}
for f in sorted(os.listdir(out)):
    if f.startswith("bench_ab_") and f.endswith(".json"):
        for r in load(f):
            ab.setdefault(f[len("bench_ab_"):-5].split("_", 1)[1], []).append(r.get("decode_tps"))
base = {}
for f in sorted(os.listdir(out)):
    if f.startswith("bench_base_") and f.endswith(".json"):
        for r in load(f):
            base.setdefault(f[len("bench_base_"):-5].split("_", 1)[1], {}).setdefault(r.get("weights"), []).append(
                [r.get("decode_tps"), r.get("prompt_tps")])
amx = {}
for f in sorted(os.listdir(out)):
    if f.startswith("host_amx_") and f.endswith(".json"):
        for r in load(f):
            amx.setdefault(f[len("host_amx_"):-5].split("_", 1)[1], []).append(r.get("prompt_tps"))
if amx:
    s["host_cpu_q8_0_prefill_512_tps"] = amx  # amx (KILN_AMX=1) / avx512 (KILN_AMX=0), alternated, all host cores
if base:
    s["base_vs_new_decode_prefill_tps"] = base  # kiln-base (an older commit) vs this binary, alternated
if ab:
    s["vk_ab_int4_decode_tps"] = ab  # base / pair0 (gate, up, SwiGLU as three dispatches) / reuse0 (no replay) / sg0 (no subgroups) / gemv4 (4-row INT4 GEMV), alternated
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(s, indent=1)[:4000])
PYEOF
cp "$RES/summary.json" "$OUT/summary.json"
tar -czf "$OUT/gpu_check.tar.gz" -C "$RES" .
