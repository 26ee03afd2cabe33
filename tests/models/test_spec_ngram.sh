#!/usr/bin/env bash
# Speculative decoding with prompt lookup (`kiln run --spec ngram`, docs/SPECULATIVE.md): greedy
# output token-identical to --spec off on stories260K for k = 1..4, from BOS and from a prompt, with
# F32 and FP8 KV; the dumped logits have the same rows and are identical with AVX-512 and AVX2
# (few-token kernels; both checked where the CPU has them), within 1e-5 relative elsewhere; some drafts are accepted; greedy with presence, frequency or
# repetition penalties token-identical too; sampling keeps speculation on (rejection rule) and accepts drafts.
set -euo pipefail
M=$SHARED/models/stories260K
[ -f "$M/stories260K.bin" ] || { echo "no stories260K under $SHARED"; exit 77; }
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
for kv in f32 fp8; do
    "$KILN" run "$M" --temp 0 -n 200 --kv-dtype $kv > "$T/off.txt" 2>/dev/null
    "$KILN" run "$M" --temp 0 -n 120 --kv-dtype $kv -p "Once upon a time, Lily" > "$T/offp.txt" 2>/dev/null
    for k in 1 2 3 4; do
        "$KILN" run "$M" --temp 0 -n 200 --kv-dtype $kv --spec ngram --spec-k $k > "$T/on.txt" 2> "$T/on.err"
        cmp "$T/off.txt" "$T/on.txt" || { echo "kv $kv k=$k: text differs from --spec off"; exit 1; }
        "$KILN" run "$M" --temp 0 -n 120 --kv-dtype $kv -p "Once upon a time, Lily" --spec ngram --spec-k $k > "$T/onp.txt" 2>/dev/null
        cmp "$T/offp.txt" "$T/onp.txt" || { echo "kv $kv k=$k: prompted text differs from --spec off"; exit 1; }
    done
    acc=$(sed -n 's/^speculation: .* \([0-9]*\) accepted.*/\1/p' "$T/on.err")
    [ "${acc:-0}" -gt 0 ] || { echo "kv $kv: no draft accepted:"; cat "$T/on.err"; exit 1; }
    grep "^speculation" "$T/on.err"
done
# the verify steps' logits are the 1-token decode's bit for bit with the SIMD kernels (AVX-512 and
# AVX2: few-token matmuls give each token its 1-token result, and every other op of a step computes
# each token's values as a 1-token step does), on the CPU's own ISA and on AVX2 where it has it
# $1 = 1: the two dumps must be equal bit for bit; $2 names the case
check_logits() {
    "$PY" - "$T/a.bin" "$T/b.bin" "$1" "$2" <<'EOF'
import sys
import numpy as np
a = np.fromfile(sys.argv[1], dtype=np.float32).reshape(-1, 512)
b = np.fromfile(sys.argv[2], dtype=np.float32).reshape(-1, 512)
assert a.shape == b.shape, (a.shape, b.shape)
err = (np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)).max()
print("logits (%s): %d rows, max relative error %.3g" % (sys.argv[4], a.shape[0], err))
if sys.argv[3] == "1" and not np.array_equal(a, b):
    sys.exit("%s: the verify steps' logits are not the 1-token decode's bit for bit" % sys.argv[4])
sys.exit(0 if err < 1e-5 else 1)
EOF
}
isas="auto"; grep -qw avx2 /proc/cpuinfo 2>/dev/null && isas="auto avx2"
for isa in $isas; do
    "$KILN" run "$M" --temp 0 -n 60 --tokens 1,403,407 --isa $isa --dump-logits "$T/a.bin" > /dev/null 2>&1
    "$KILN" run "$M" --temp 0 -n 60 --tokens 1,403,407 --isa $isa --dump-logits "$T/b.bin" --spec ngram --spec-k 3 > /dev/null 2>&1
    exact=0; grep -qw avx2 /proc/cpuinfo 2>/dev/null && exact=1
    check_logits "$exact" "--isa $isa"
done
# the same with FP8 block weights (tiny-llama-hd64 quantized by kiln: 128-blocks, the few-token FP8
# kernels of both ISAs)
H=$SHARED/models/tiny-llama-hd64/model.bin
if [ -f "$H" ]; then
    "$KILN" quantize "$H" "$T/hd64-fp8" --weights fp8 > /dev/null 2>&1
    for isa in $isas; do
        "$KILN" run "$T/hd64-fp8" --temp 0 -n 60 -p "Once upon a time" --isa $isa --dump-logits "$T/a.bin" > /dev/null 2>&1
        "$KILN" run "$T/hd64-fp8" --temp 0 -n 60 -p "Once upon a time" --isa $isa --dump-logits "$T/b.bin" --spec ngram --spec-k 3 > /dev/null 2>&1
        exact=0; grep -qw avx2 /proc/cpuinfo 2>/dev/null && exact=1
        check_logits "$exact" "FP8 weights, --isa $isa"
    done
fi
# greedy with logit processors: the penalties' state follows every accepted draft, so the text is
# the same as without speculation
for pen in "--presence-penalty 0.6" "--frequency-penalty 0.3" "--repeat-penalty 1.3"; do
    "$KILN" run "$M" --temp 0 -n 150 $pen > "$T/poff.txt" 2>/dev/null
    "$KILN" run "$M" --temp 0 -n 150 $pen --spec ngram > "$T/pon.txt" 2> "$T/pon.err"
    cmp "$T/poff.txt" "$T/pon.txt" || { echo "$pen: text differs from --spec off"; exit 1; }
    grep speculation "$T/pon.err"
done
# sampling: speculation stays on and drafts are accepted (the rule's exactness: tests/unit/test_sampler_spec.c)
"$KILN" run "$M" --temp 0.8 --seed 5 -n 300 --spec ngram > /dev/null 2> "$T/s.err"
acc=$(sed -n 's/.* drafted, \([0-9]*\) accepted.*/\1/p' "$T/s.err")
[ -n "$acc" ] && [ "$acc" -gt 0 ] || { echo "sampling: no draft accepted:"; cat "$T/s.err"; exit 1; }
grep speculation "$T/s.err"
echo ok
