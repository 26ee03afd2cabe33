#!/usr/bin/env bash
# Weight checksums: `kiln verify --write` records them; an untouched model verifies; a one-byte
# change in a tensor's data is reported naming that tensor, with a non-zero exit.
set -euo pipefail
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
"$KILN" mkmodel --arch llama --preset tiny "$T/m" 2>/dev/null
"$KILN" verify "$T/m" --write > /dev/null
"$KILN" verify "$T/m" | grep -q "0 bad"
# Flip one bit inside the data of model.norm.weight (offset from the safetensors header).
off=$(${PY:-python3} - "$T/m/model.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])
print(8 + n + h['model.norm.weight']['data_offsets'][0] + 5)
PY
)
printf '\x55' | dd of="$T/m/model.safetensors" bs=1 seek="$off" count=1 conv=notrunc 2>/dev/null
if "$KILN" verify "$T/m" > "$T/out" 2> "$T/err"; then echo "corruption not detected"; exit 1; fi
grep -q "MISMATCH model.norm.weight" "$T/out" || { cat "$T/out"; exit 1; }
[ "$(grep -c MISMATCH "$T/out")" -eq 1 ]
grep -q "1 tensors do not match" "$T/err"
echo ok
