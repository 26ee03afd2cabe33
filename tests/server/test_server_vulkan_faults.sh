#!/usr/bin/env bash
# test_server_vulkan_faults.sh — the vulkan backend when the device fails (issue 26's bad
# environment), with the faults injected by KILN_VK_FAULT (backend/vulkan/vk_device.c):
#   - device lost in the middle of serving: every request — one in flight when it happens and the
#     concurrent ones after — completes with the same greedy text as a server on the cpu backend
#     (the backend computes on the host from the failing op on; every KV page a request reads is
#     still verified, so pages a real lost device left undefined would be detected and recomputed),
#     the log names the device and the failure once, /health keeps answering;
#   - out of device memory when the KV pool is sized: the server starts, says which array did not
#     fit (device and bytes) and serves the same text;
#   - no Vulkan loader: --device vulkan fails naming the loader file, --device cpu still works;
#   - a malformed KILN_VK_FAULT, KILN_VK_REUSE or KILN_VK_SUBGROUPS is refused naming the variable.
# Skipped (77) when the build has no Vulkan.
set -u
. "$(dirname "$0")/lib.sh"
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "no stories260K under $SHARED"; exit 77; }
out=$("$KILN" inspect --devices 2>&1)
if [ $? -ne 0 ]; then
    echo "$out" | grep -q "built without Vulkan" && { echo "kiln built without Vulkan"; exit 77; }
    echo "vulkan build without a usable device: $out"; exit 1
fi

start() { # log-file, extra args...
    local log=$1; shift
    "$KILN" serve "$M" --host 127.0.0.1 --port 0 --max-batch 4 --model-name m "$@" 2>"$log" &
    pid=$!
    wait_listening "$log" || fail "server did not start ($*)"
}
stop() { kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; }
body() { printf '{"model":"m","prompt":"%s","max_tokens":80,"temperature":0}' "$1"; }
prompts=("Once upon a time" "The little dog" "Lily and Tom" "One day, a bird")
run_all() { # dir: one request alone, then the four at once
    mkdir -p "$1"
    curl -sf -m 120 "$url/v1/completions" -d "$(body "${prompts[0]}")" > "$1/solo.json" || fail "solo request ($1)"
    local cp=()
    for i in 0 1 2 3; do curl -sf -m 120 "$url/v1/completions" -d "$(body "${prompts[$i]}")" > "$1/c$i.json" & cp+=($!); done
    for p in "${cp[@]}"; do wait "$p" || fail "a concurrent request failed ($1)"; done
}
text() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$1"; }

start "$T/cpu.log" --device cpu
run_all "$T/cpu"
stop

# device lost at the 150th submit: inside the first request (stories260K: ~50 submits per token)
KILN_VK_FAULT=lost:150 start "$T/log" --device vulkan
run_all "$T/lost"
curl -sf -m 10 "$url/health" > /dev/null || fail "/health after the device was lost"
grep -q "device lost); computing on the host from now on" "$T/log" || fail "the log does not report the lost device"
[ "$(grep -c "computing on the host from now on" "$T/log")" = 1 ] || fail "the failure is reported more than once"
grep -q "vulkan:0 " "$T/log" || fail "the failure does not name the device"
stop
for f in solo c0 c1 c2 c3; do [ "$(text "$T/lost/$f.json")" = "$(text "$T/cpu/$f.json")" ] || fail "$f: text after the device was lost differs from the cpu server's"; done

# no device memory for the KV arrays (1.6 MB each here; every other buffer is smaller)
KILN_VK_FAULT=oom:1000000 start "$T/oom.log" --device vulkan --kv-mem 16000000
grep -q "a KV layer array of [0-9]* bytes does not fit on the device" "$T/oom.log" || fail "the KV array fallback is not reported"
run_all "$T/oom"
stop
for f in solo c0; do [ "$(text "$T/oom/$f.json")" = "$(text "$T/cpu/$f.json")" ] || fail "$f: text with host KV differs from the cpu server's"; done

# no loader; malformed fault spec
if KILN_VULKAN_LOADER=/nonexistent/libvulkan.so.1 "$KILN" run "$M" -n 2 --device vulkan > /dev/null 2> "$T/noloader.err"; then fail "--device vulkan without a loader succeeded"; fi
grep -q "cannot load the Vulkan loader /nonexistent/libvulkan.so.1" "$T/noloader.err" || fail "no-loader error: $(cat "$T/noloader.err")"
KILN_VULKAN_LOADER=/nonexistent/libvulkan.so.1 "$KILN" run "$M" -n 2 --device cpu > /dev/null 2>&1 || fail "--device cpu without a loader"
if KILN_VK_FAULT=lost "$KILN" run "$M" -n 2 --device vulkan > /dev/null 2> "$T/spec.err"; then fail "KILN_VK_FAULT=lost accepted"; fi
grep -q "KILN_VK_FAULT: 'lost'" "$T/spec.err" || fail "bad KILN_VK_FAULT error: $(cat "$T/spec.err")"
for v in KILN_VK_REUSE KILN_VK_SUBGROUPS; do # on/off switches: 0 or 1 only
    if env $v=yes "$KILN" run "$M" -n 2 --device vulkan > /dev/null 2> "$T/sw.err"; then fail "$v=yes accepted"; fi
    grep -q "$v: 'yes' is not 0 or 1" "$T/sw.err" || fail "bad $v error: $(cat "$T/sw.err")"
    env $v=0 "$KILN" run "$M" -n 2 --device vulkan > /dev/null 2>&1 || fail "$v=0 refused"
done
echo "ok"
