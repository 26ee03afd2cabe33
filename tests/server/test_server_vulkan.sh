#!/usr/bin/env bash
# test_server_vulkan.sh — the server suite of the official `openai` client (test_server_api.mjs:
# completions and chat, streaming and not, greedy text equal to llama2.c's, usage, prefix reuse,
# stop strings, logprobs; test_server_echo.mjs: the prompt's log-probabilities against llama2.c's
# logits) with the server computing on the vulkan backend (lavapipe in make test).
# The other suites exercise the scheduler, HTTP and limits, which do not depend on the backend; on
# lavapipe each op's submit-and-wait makes them minutes long, so they run on the cpu backend only.
# Skipped (77) when the build has no Vulkan or under make check (node suites run in the release pass).
set -u
KILN=${KILN:-./kiln}
[ -n "${KILN_CHECK:-}" ] && { echo "node suites run in the release pass"; exit 77; }
command -v node >/dev/null || { echo "node not installed"; exit 77; }
out=$("$KILN" inspect --devices 2>&1)
if [ $? -ne 0 ]; then
    echo "$out" | grep -q "built without Vulkan" && { echo "kiln built without Vulkan"; exit 77; }
    echo "vulkan build without a usable device: $out"; exit 1
fi
cd "$(dirname "$0")/../.."
KILN_SERVE_DEVICE=vulkan node tests/server/test_server_api.mjs && KILN_SERVE_DEVICE=vulkan node tests/server/test_server_echo.mjs
