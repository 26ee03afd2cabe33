#!/usr/bin/env bash
# gpu_check.sh — issue 26's check on a machine with a real GPU, in one prepared run (about 8
# minutes on an H200): builds kiln, picks the first Vulkan device that is not a CPU (lavapipe),
# runs the op tests and the model tests on it, then the benchmarks, and writes everything under
# $OUT (default gpu_check_out/): devices.txt, ops.log, models.log, bench_decode.json, bench_ab_*.json, bench_moe.json, bench_dsa.json,
# bench_integrity.json, kv_bf16.json / kv_fp8.json, profile.log (device time per shader),
# summary.json, and a log of each step.
#   bash scripts/gpu_check.sh [SHARED_DIR]     (SHARED_DIR: ../shared by default, for stories260K)
# Each step has its own time limit and a failed step does not stop the later ones; summary.json
# says which passed. Nothing here is a GPU claim by itself: docs/BENCHMARKS.md records what a run
# on a lent GPU printed, with the machine named.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu_check_out}
SHARED=${1:-${SHARED:-$(cd .. && pwd)/shared}}
mkdir -p "$OUT"
# a Python with numpy for the model tests' comparisons (the first python3 on PATH may lack it)
if [ -z "${PY:-}" ]; then
    for c in python3 /usr/bin/python3; do "$c" -c "import numpy" 2>/dev/null && { PY=$c; break; }; done
fi
export KILN=$PWD/kiln SHARED PY=${PY:-python3}
declare -A status
step() { # name, time limit (s), command...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    if timeout "$limit" "$@" > "$OUT/$name.log" 2>&1; then status[$name]=pass; else status[$name]="fail (rc $?)"; fi
    echo "$name: ${status[$name]} in $((SECONDS - t0)) s"
}
step build 300 make -j"$(nproc)" kiln tests
./kiln inspect --devices > "$OUT/devices.txt" 2>&1
# GPU_CHECK_DEVICE=vulkan:N forces a device (a dry run of this script on lavapipe, with
# GPU_CHECK_SHAPE="--preset tiny --seq 8192" and GPU_CHECK_MOE="--preset tiny" for models lavapipe
# runs in seconds)
DEV=${GPU_CHECK_DEVICE:-$(awk '/^vulkan:[0-9]+ / && $0 !~ /\(CPU,/ {print $1; exit}' "$OUT/devices.txt")}
if [ -z "$DEV" ]; then echo "no GPU among the Vulkan devices:"; cat "$OUT/devices.txt"; exit 1; fi
echo "device: $(grep "^$DEV " "$OUT/devices.txt")"
export KILN_VK_DEVICE=$DEV KILN_VK_DEVICE_INDEX=${DEV#vulkan:}

# correctness on the device: every op x format against the ref backend, stories260K against
# llama2.c, the integrity campaign, the architectures' PyTorch references (where torch is there)
step ops 240 build/tests/ops/test_backend_ops
step models 240 bash tests/models/test_vulkan.sh
if $PY -c "import torch, numpy" 2>/dev/null; then
    step arch_deepseek_v3 120 env KILN_DEVICES="$DEV" $PY tests/models/test_arch_deepseek_v3.py
    step arch_glm4_moe 120 env KILN_DEVICES="$DEV" $PY tests/models/test_arch_glm4_moe.py
fi

# the 1.7B shape of the CPU benchmarks (dim 3072, ffn 8192, 16 layers, 24 heads, 8 KV heads)
M=$OUT/b17
SHAPE=${GPU_CHECK_SHAPE:---preset bench-500m --dim 3072 --ffn 8192 --layers 16 --heads 24 --kv-heads 8 --seq 8192}
# shellcheck disable=SC2086
[ -f "$M/config.json" ] || step mkmodel 240 ./kiln mkmodel --arch llama $SHAPE --dtype bf16 "$M"
# batch-1 decode against the device's read bandwidth, INT4 / FP8 / BF16 side by side, and prefill
# at 512 tokens (prompt_tps)
step bench_decode 300 sh -c "./kiln bench '$M' --device $DEV --weights bf16,fp8,int4 --prompt 512 --gen 64 --repeat 3 --json > '$OUT/bench_decode.json'"
# where a decode step's device time goes: timestamp queries per shader (KILN_VK_PROFILE), INT4 weights
step profile 180 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 ./kiln bench "$M" --device "$DEV" --weights int4 --prompt 16 --gen 64 --repeat 1
# the two host/device choices a GPU decides, A/B in alternation (INT4 decode): command buffers
# recorded once per step shape and replayed (KILN_VK_REUSE=0: recorded every step) and subgroup
# reductions (KILN_VK_SUBGROUPS=0: the portable shared-memory tree sums); KILN_VK_STATS in the .err
ab_bench() {
    local i=0 c
    for c in base reuse0 sg0 base reuse0 sg0; do
        i=$((i + 1))
        case $c in reuse0) set -- KILN_VK_REUSE=0 ;; sg0) set -- KILN_VK_SUBGROUPS=0 ;; *) set -- KILN_VK_REUSE=1 ;; esac
        env "$@" KILN_VK_STATS=1 ./kiln bench "$M" --device "$DEV" --weights int4 --prompt 16 --gen 64 --repeat 2 --json \
            > "$OUT/bench_ab_${i}_$c.json" 2> "$OUT/bench_ab_${i}_$c.err" || return 1
    done
}
export -f ab_bench
export M DEV OUT
step bench_ab 240 bash -c ab_bench
# MoE + MLA on the device (routing and experts by id: moe_routed): the GLM-4.7-Flash-shaped preset,
# BF16 / FP8 / INT4 experts, decode against the device bandwidth and the per-shader profile
# (GPU_CHECK_MOE="--preset tiny" for a dry run on lavapipe)
F=$OUT/flash
MOE=${GPU_CHECK_MOE:---preset glm47-flash}
# shellcheck disable=SC2086
[ -f "$F/config.json" ] || step mkmodel_moe 240 ./kiln mkmodel --arch glm4_moe_lite $MOE --dtype bf16 "$F"
step bench_moe 240 sh -c "./kiln bench '$F' --device $DEV --weights bf16,fp8,int4 --scope experts --prompt 128 --gen 64 --repeat 3 --json > '$OUT/bench_moe.json'"
step profile_moe 120 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 ./kiln bench "$F" --device "$DEV" --weights int4 --scope experts --prompt 16 --gen 32 --repeat 1
# GLM-5.x sparse attention on the device (indexer scan + top-k + sparse attention, DSA compact rows):
# the glm52 preset (GLM-5's per-layer shapes, 2 layers), a 2,048-token prompt so that the top-2048
# selection is the whole context at first and a strict subset while decoding, BF16 / INT4 weights,
# and the per-shader profile (GPU_CHECK_DSA="--preset tiny" for a dry run on lavapipe)
G=$OUT/glm52
DSA=${GPU_CHECK_DSA:---preset glm52}
# shellcheck disable=SC2086
[ -f "$G/config.json" ] || step mkmodel_dsa 240 ./kiln mkmodel --arch glm_moe_dsa $DSA --seq 8192 --dtype bf16 "$G"
step bench_dsa 240 sh -c "./kiln bench '$G' --device $DEV --weights bf16,int4 --prompt 2048 --gen 64 --repeat 2 --json > '$OUT/bench_dsa.json'"
step profile_dsa 120 env KILN_VK_PROFILE=1 KILN_VK_STATS=1 ./kiln bench "$G" --device "$DEV" --weights int4 --prompt 2048 --gen 32 --repeat 1
# KV capacity: bytes per token of BF16 and FP8 pools
for dt in bf16 fp8; do ./kiln inspect "$M" --kv --kv-dtype $dt --json > "$OUT/kv_$dt.json" 2>/dev/null; done
# integrity: heal vs off at 4,000 tokens of context (decode and time to first token)
step bench_integrity 300 sh -c "./kiln bench '$M' --integrity --device $DEV --ctx 4000 --prompt 16 --decode 16 --repeat 3 --modes off,heal \
    --kv-dtype bf16,fp8 --no-campaign --json > '$OUT/bench_integrity.json'"

{
    printf '{"device": "%s",\n "steps": {' "$(grep "^$DEV " "$OUT/devices.txt" | sed 's/"/\\"/g')"
    sep=""
    for k in "${!status[@]}"; do printf '%s"%s": "%s"' "$sep" "$k" "${status[$k]}"; sep=", "; done
    printf '}}\n'
} > "$OUT/summary.json"
$PY - "$OUT" <<'PYEOF'
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
if ab:
    s["vk_ab_int4_decode_tps"] = ab  # base / reuse0 (no replay) / sg0 (no subgroups), alternated
json.dump(s, open(os.path.join(out, "summary.json"), "w"), indent=1)
print(json.dumps(s, indent=1)[:4000])
PYEOF
