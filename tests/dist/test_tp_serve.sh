#!/usr/bin/env bash
# `kiln serve --tp N` under mpirun (docs/SCALE.md, "kiln serve under mpirun"):
#   - the official-client server suite (tests/server/test_server_api.mjs: greedy text equal to
#     llama2.c's and `kiln run`, streaming, prefix reuse, stop strings, logprobs) at -np 2 and 4, and
#     the integrity (faults injected on every rank, heal and strict), concurrency, sampling and
#     speculative-decoding suites at -np 2, each against one-process references;
#   - tests/dist/tp_serve.mjs: an MLA + MoE model with FP8 KV identical to one process, faults on one
#     rank healed by all, a hung and a killed rank, mismatched ranks refused.
# Skipped (77) without mpirun, node or an MPI build, and under make check.
set -euo pipefail
[ -n "${KILN_CHECK:-}" ] && { echo "MPI runs are not sanitizer-checked (Open MPI's allocations read as leaks)"; exit 77; }
command -v mpirun >/dev/null || { echo "mpirun not installed (openmpi-bin)"; exit 77; }
command -v node >/dev/null || { echo "node not installed"; exit 77; }
KILN=${KILN:-./kiln}
KILN=$(cd "$(dirname "$KILN")" && pwd)/$(basename "$KILN")
export KILN
if "$KILN" serve "$SHARED/models/stories260K" --tp 2 --port 0 > /dev/null 2> /tmp/kiln_tp_probe.$$; then echo "--tp 2 without mpirun was accepted"; exit 1; fi
grep -q "built without MPI" /tmp/kiln_tp_probe.$$ && { rm -f /tmp/kiln_tp_probe.$$; echo "kiln built without MPI"; exit 77; }
rm -f /tmp/kiln_tp_probe.$$
cd "$(dirname "$0")/../.."
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$KILN" mkmodel --arch deepseek_v3 --preset tiny "$T/mla" > /dev/null
"$KILN" mkmodel --arch llama --dim 512 --ffn 1024 --layers 8 --heads 8 --kv-heads 4 --vocab 512 --seq 4096 "$T/long" > /dev/null 2>&1
TP_MLA=$T/mla TP_LONG=$T/long node tests/dist/tp_serve.mjs
KILN_SERVE_TP=2 node tests/server/test_server_api.mjs
KILN_SERVE_TP=4 node tests/server/test_server_api.mjs
for s in integrity concurrency sampling spec; do KILN_SERVE_TP=2 node tests/server/test_server_$s.mjs; done
KILN_SERVE_TP=2 bash tests/server/test_server_spec_mtp.sh # MTP drafts: the layer sharded, rank 0's drafts broadcast
