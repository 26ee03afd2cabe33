#!/usr/bin/env bash
# run_fuzz.sh — runs libFuzzer targets built by `make fuzz-build` (make fuzz calls this).
#   bash tests/fuzz/run_fuzz.sh [TARGET...]      (default: every tests/fuzz/fuzz_*.c)
# Environment:
#   FUZZ_BUILD    where the binaries are (build/fuzz)
#   FUZZ_LOGS     one log per target and summary.txt ($FUZZ_BUILD/logs)
#   FUZZ_ARTIFACTS  crash / leak / timeout reproducers, one folder per target ($FUZZ_BUILD/artifacts)
#   FUZZ_SECONDS  seconds per target (600)
#   FUZZ_JOBS     targets run at once (the CPU count)
#   FUZZ_WORK     the working corpus, one folder per target, kept between runs ($FUZZ_BUILD/corpus)
#   FUZZ_SEEDS    extra seed folders per target made at run time (default: made here with
#                 tests/fuzz/make_seeds.py from $KILN mkmodel and $SHARED when they are there)
#   FUZZ_FLAGS    extra libFuzzer flags
# Seeds: tests/fuzz/corpus/TARGET (committed), tests/fuzz/regress/TARGET (reproducers), the run-time
# ones. Exit status 1 when a target found a crash, a leak or a timeout (its log is printed).
# The whole script is one function, read before it runs: editing the file during a run
# cannot change what the run does.
main() {
set -u
cd "$(dirname "$0")/../.."
FUZZ_BUILD=${FUZZ_BUILD:-build/fuzz}
FUZZ_SECONDS=${FUZZ_SECONDS:-600}
FUZZ_JOBS=${FUZZ_JOBS:-$(nproc)}
FUZZ_WORK=${FUZZ_WORK:-$FUZZ_BUILD/corpus}
FUZZ_LOGS=${FUZZ_LOGS:-$FUZZ_BUILD/logs}
FUZZ_ARTIFACTS=${FUZZ_ARTIFACTS:-$FUZZ_BUILD/artifacts}
SHARED=${SHARED:-$(cd .. && pwd)/shared}
export SHARED
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=($(ls tests/fuzz/fuzz_*.c | sed 's|.*/fuzz_||; s|\.c$||'))
mkdir -p "$FUZZ_LOGS" "$FUZZ_WORK"
if [ -z "${FUZZ_SEEDS:-}" ]; then
    FUZZ_SEEDS=$FUZZ_BUILD/seeds
    rm -rf "$FUZZ_SEEDS"; mkdir -p "$FUZZ_SEEDS"
    KILN=${KILN:-./kiln}
    case "$KILN" in /*) ;; *) KILN=$PWD/$KILN ;; esac # make fuzz passes KILN=kiln; make_seeds.py runs it as a command
    if [ -x "$KILN" ] && command -v "${PY:-python3}" >/dev/null; then
        "${PY:-python3}" tests/fuzz/make_seeds.py runtime "$FUZZ_SEEDS" "$KILN" "$SHARED" || echo "run_fuzz: make_seeds.py failed; committed seeds only"
    else
        echo "run_fuzz: no $KILN (or python3): committed seeds only"
    fi
fi

run_target() { # target
    local t=$1 bin=$FUZZ_BUILD/fuzz_$1 log=$FUZZ_LOGS/$1.log
    local dirs=() d
    for d in tests/fuzz/corpus/$t tests/fuzz/regress/$t "$FUZZ_SEEDS/$t"; do [ -d "$d" ] && dirs+=("$d"); done
    mkdir -p "$FUZZ_WORK/$t" "$FUZZ_ARTIFACTS/$t"
    local dict=()
    [ -f tests/fuzz/dict/$t.dict ] && dict=(-dict=tests/fuzz/dict/$t.dict)
    # -timeout: one input may take 25 s (ASan, a 256 MiB template render); -rss_limit_mb: a
    # target may use 3 GiB; leaks are findings
    "$bin" -max_total_time="$FUZZ_SECONDS" -timeout=25 -rss_limit_mb=3072 -print_final_stats=1 \
        -artifact_prefix="$FUZZ_ARTIFACTS/$t/" "${dict[@]}" ${FUZZ_FLAGS:-} "$FUZZ_WORK/$t" "${dirs[@]}" >"$log" 2>&1
    echo $? >"$log.rc"
}

pids=()
for t in "${targets[@]}"; do
    [ -x "$FUZZ_BUILD/fuzz_$t" ] || { echo "run_fuzz: $FUZZ_BUILD/fuzz_$t is missing (make fuzz-build)"; exit 2; }
    run_target "$t" &
    pids+=($!)
    while [ "$(jobs -rp | wc -l)" -ge "$FUZZ_JOBS" ]; do sleep 1; done
done
wait

fail=0
{
    printf '%-14s %8s %10s %8s %8s %8s %6s  %s\n' target seconds execs exec/s cov ft corpus result
    for t in "${targets[@]}"; do
        log=$FUZZ_LOGS/$t.log
        rc=$(cat "$log.rc" 2>/dev/null || echo 99)
        execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        eps=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
        last=$(grep -E '^#[0-9]+' "$log" | tail -1)
        cov=$(echo "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
        ft=$(echo "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
        corp=$(echo "$last" | sed -n 's/.* corp: \([0-9]*\).*/\1/p')
        res=ok
        [ "$rc" != 0 ] && res="FOUND (rc=$rc, $log)" && fail=1
        printf '%-14s %8s %10s %8s %8s %8s %6s  %s\n' "$t" "$FUZZ_SECONDS" "${execs:-?}" "${eps:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$res"
    done
} | tee "$FUZZ_LOGS/summary.txt"
grep -q FOUND "$FUZZ_LOGS/summary.txt" && fail=1
if [ $fail -ne 0 ]; then
    for t in "${targets[@]}"; do
        rc=$(cat "$FUZZ_LOGS/$t.log.rc" 2>/dev/null || echo 99)
        [ "$rc" = 0 ] && continue
        echo "---- $t (rc=$rc): the end of $FUZZ_LOGS/$t.log"
        grep -v '^#[0-9]' "$FUZZ_LOGS/$t.log" | tail -n 60
    done
fi
exit $fail
}
main "$@"
exit $?
