#!/usr/bin/env bash
# Runs every test kiln has and prints one closing line "N passed, N failed".
#   C tests:      $BUILD/tests/{unit,kernels}/test_*   (cmocka; each binary is one test suite)
#   script tests: tests/{models,integrity,server,unit}/*.sh  (exit 0 = pass; 77 = skipped)
#   python tests: tests/**/test_*.py run with Debian's /usr/bin/python3 (numpy/torch references)
# Under `make check` (KILN_CHECK=1) the C suites and the CLI tests run against sanitizer builds;
# python/node-driven tests are skipped there (they exercise the same code as the release run).
set -u
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
export KILN=${KILN:-$PWD/kiln}
case "$KILN" in /*) ;; *) KILN=$PWD/$KILN ;; esac
export SHARED=${SHARED:-$(cd .. && pwd)/shared}
export PY=${PY:-/usr/bin/python3}
# The python architecture tests also run on the vulkan backend when the build has a Vulkan device
# (tests/reference/harness.py); a build with Vulkan but no device fails tests/ops/test_backend_ops.
if "$KILN" inspect --devices 2>/dev/null | grep -q '^vulkan:0 '; then export KILN_DEVICES=${KILN_DEVICES:-cpu vulkan}; fi
# the sanitizer run: leaks kept by the Vulkan driver (lavapipe) are not kiln's (tests/lsan.supp)
if [ -n "${KILN_CHECK:-}" ]; then export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"; fi
export TMPDIR_KILN=$(mktemp -d)
trap 'rm -rf "$TMPDIR_KILN"' EXIT
pass=0; fail=0; skip=0; failed=()
run_one() { # name, command...
    local name=$1; shift
    local log="$TMPDIR_KILN/log.$pass.$fail.$skip"
    local t0=$(date +%s%N)
    "$@" >"$log" 2>&1
    local rc=$?
    local dt=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [ $rc -eq 0 ]; then pass=$((pass+1)); echo "PASS  $name (${dt} ms)"
    elif [ $rc -eq 77 ]; then skip=$((skip+1)); echo "SKIP  $name: $(tail -n 1 "$log")"
    else
        fail=$((fail+1)); failed+=("$name"); echo "FAIL  $name (rc=$rc)"
        # node:test logs end with every subtest's summary: show the failing subtests' own lines first
        grep -q '^ *not ok' "$log" && grep -A 30 '^ *not ok' "$log" | head -n 80 | sed 's/^/    ! /'
        tail -n 40 "$log" | sed 's/^/    | /'
    fi
}
for t in $(find "$BUILD/tests" -type f -name 'test_*' ! -name '*.o' ! -name '*.d' 2>/dev/null | sort); do
    run_one "${t#$BUILD/}" "$t"
done
for t in $(find tests -name 'test_*.sh' | sort); do
    run_one "$t" bash "$t"
done
if [ -z "${KILN_CHECK:-}" ]; then
    for t in $(find tests -name 'test_*.py' | sort); do
        run_one "$t" "$PY" "$t"
    done
    for t in $(find tests -name 'test_*.mjs' | sort); do
        run_one "$t" node "$t"
    done
fi
echo
[ ${#failed[@]} -gt 0 ] && printf 'failed: %s\n' "${failed[@]}"
if [ $skip -gt 0 ]; then echo "$pass passed, $fail failed, $skip skipped"; else echo "$pass passed, $fail failed"; fi
[ $fail -eq 0 ]
