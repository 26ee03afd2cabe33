#!/usr/bin/env bash
# test_fuzz_replay.sh — the fuzz targets in make test / make check:
#  1. replays tests/fuzz/corpus/<target>, tests/fuzz/regress/<target> (reproducers of findings)
#     and seeds made now from `kiln mkmodel` and ../shared through the replay binaries
#     ($BUILD/tests/fuzz/fuzz_*, tests/fuzz/driver_main.c: gcc, ASan + UBSan under make check);
#     a crash or sanitizer report fails the test;
#  2. when clang with libFuzzer is there (and not under make check), a short libFuzzer run of each
#     target: FUZZ_SHORT seconds each (default 10; 0 skips), two at a time: about 40 s, plus
#     about 1 min the first time for the clang build ($BUILD/libfuzzer) on 2 cores (make fuzz is the
#     long run: 600 s per target).
# The whole script is one function, read before it runs: editing the file during a run
# cannot change what the run does.
main() {
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
SHARED=${SHARED:-$(cd .. && pwd)/shared}
export SHARED
targets=($(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||'))
bins=("${targets[@]/#/$BUILD/tests/fuzz/fuzz_}")
if [ -z "${KILN_CHECK:-}" ]; then
    make -s BUILD="$BUILD" "${bins[@]}" || { echo "cannot build the replay binaries"; exit 1; }
else
    for b in "${bins[@]}"; do [ -x "$b" ] || { echo "$b is missing (make check builds it)"; exit 1; }; done
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
KILN=${KILN:-./kiln}
mkdir -p "$tmp/seeds"
if [ -x "$KILN" ] && command -v "${PY:-python3}" >/dev/null; then
    "${PY:-python3}" tests/fuzz/make_seeds.py runtime "$tmp/seeds" "$KILN" "$SHARED" || { echo "make_seeds.py failed"; exit 1; }
fi
fail=0
for t in "${targets[@]}"; do
    dirs=()
    for d in tests/fuzz/corpus/$t tests/fuzz/regress/$t "$tmp/seeds/$t"; do [ -d "$d" ] && dirs+=("$d"); done
    t0=$(date +%s%N)
    out=$("$BUILD/tests/fuzz/fuzz_$t" "${dirs[@]}" 2>&1)
    rc=$?
    dt=$(( ($(date +%s%N) - t0) / 1000000 ))
    if [ $rc -ne 0 ]; then
        fail=1
        echo "FAIL replay $t (rc=$rc):"
        echo "$out" | tail -n 40
        # name the input that failed
        for d in "${dirs[@]}"; do for f in "$d"/*; do
            [ -f "$f" ] || continue
            "$BUILD/tests/fuzz/fuzz_$t" "$f" >/dev/null 2>&1 || echo "  failing input: $f"
        done; done
    else
        echo "ok   replay $t: $(echo "$out" | tail -n 1) (${dt} ms)"
    fi
done
FUZZ_SHORT=${FUZZ_SHORT:-10}
if [ -z "${KILN_CHECK:-}" ] && [ "$FUZZ_SHORT" != 0 ] && command -v clang >/dev/null; then
    echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { (void)d; (void)n; return 0; }' >"$tmp/probe.c"
    if clang -fsanitize=fuzzer "$tmp/probe.c" -o "$tmp/probe" >/dev/null 2>&1; then
        # its own clang tree beside $BUILD ($BUILD/libfuzzer), so that a `make fuzz` (build/fuzz) or
        # a make test of another build folder running at the same time shares nothing with it
        fb=${FUZZ_SHORT_BUILD:-$BUILD/libfuzzer}
        make -s FUZZ_BUILD="$fb" fuzz-build >"$tmp/build.log" 2>&1 || { tail -n 30 "$tmp/build.log"; echo "make fuzz-build failed"; exit 1; }
        FUZZ_BUILD=$fb FUZZ_SECONDS=$FUZZ_SHORT FUZZ_JOBS=2 FUZZ_WORK=$tmp/work FUZZ_SEEDS=$tmp/seeds FUZZ_LOGS=$tmp/logs FUZZ_FLAGS="-timeout=15" \
            bash tests/fuzz/run_fuzz.sh "${targets[@]}" || fail=1
    else
        echo "clang cannot link -fsanitize=fuzzer (libclang-rt-14-dev): libFuzzer runs skipped"
    fi
fi
exit $fail
}
main "$@"
exit $?
