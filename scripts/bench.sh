#!/usr/bin/env bash
# `make bench`: the benchmarks whose figures go in docs/BENCHMARKS.md (never part of `make test`).
# Synthetic models are written once into $KILN_BENCH_DIR (default build/bench-models).
# BENCH_QUICK=1 shortens every run.
set -euo pipefail
cd "$(dirname "$0")/.."
K=${KILN:-./kiln}
D=${KILN_BENCH_DIR:-build/bench-models}
mkdir -p "$D"
M=$(bash scripts/default_model.sh)
[ -f "$D/bench-500m/model.safetensors" ] || "$K" mkmodel --arch llama --preset bench-500m --seq 16448 --dtype bf16 "$D/bench-500m"
GEN=32; [ -n "${BENCH_QUICK:-}" ] && GEN=8
echo "== weights: batch-1 decode per weight format vs the measured read bandwidth (bench-500m) =="
"$K" bench "$D/bench-500m" --weights bf16,fp8,int4 --prompt 32 --gen "$GEN" --repeat 8  # as docs/BENCHMARKS.md
echo "== GEMV alone: each format's streaming rate per byte, gate/up- and down-shaped bench-500m weights =="
ROUNDS=30; [ -n "${BENCH_QUICK:-}" ] && ROUNDS=5
"$K" bench --gemv --weights fp8,int4,int4-g128 --shape 5632x2048,2048x5632 --rounds "$ROUNDS"
echo "== KV cache: FP8 vs BF16 decode at 512 / 4,096 / 16,384 tokens of context =="
"$K" bench "$D/bench-500m" --kv-context 512,4096,16384 --kv-dtype bf16,fp8 --decode 4 --repeat 8
"$K" bench "$D/bench-500m" --kv-context 512,4096,16384 --kv-dtype bf16,fp8 --decode 4 --repeat 8 --weights int4
echo "== KV integrity: cost of each mode vs off, detection campaign =="
"$K" bench "$D/bench-500m" --integrity || echo "(integrity bench unavailable)"
echo "== server: output tokens/s at concurrency 1, 4, 16 =="
"$K" bench --server "$D/bench-500m" --concurrency 1,4,16 --requests 1 --max-tokens 16 --prompt-tokens 32
echo "== tokenizer: encoding MB/s (deepseek-v3 tokenizer.json) beside the npm implementation =="
"$K" bench --tokenizer || echo "(tokenizer bench unavailable)"
echo "== stories260K: decode speed =="
"$K" bench "$M" --weights f32,bf16,fp8 --prompt 64 --gen 64
