#!/usr/bin/env bash
# Bad input to the CLI: every case must fail with exit status 1 or 2 (never a crash or a signal),
# print exactly one "error:" line, and name the file / field / offset at fault.
set -u
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
M=$SHARED/models/stories260K
fails=0
expect_error() { # description, expected-substring, command...
    local desc=$1 want=$2; shift 2
    "$@" > "$T/out" 2> "$T/err"
    local rc=$?
    local n; n=$(grep -c "error:" "$T/err")
    if [ $rc -eq 0 ] || [ $rc -ge 128 ] || [ "$n" -ne 1 ] || ! grep -qF -- "$want" "$T/err"; then
        echo "FAIL: $desc: rc=$rc, want one error line containing '$want', got:"; cat "$T/err"; fails=$((fails+1))
    else
        echo "ok: $desc: $(grep error: "$T/err")"
    fi
}
PYW=${PY:-python3}
# llama2.c checkpoints
head -c 20 "$M/stories260K.bin" > "$T/trunc_header.bin"
expect_error "truncated llama2.c header" "truncated llama2.c header" "$KILN" run "$T/trunc_header.bin" --tokens 1 -n 1
head -c 100000 "$M/stories260K.bin" > "$T/trunc.bin"
expect_error "truncated llama2.c weights" "runs past the end of the file" "$KILN" run "$T/trunc.bin" --tokens 1 -n 1
"$PYW" - "$M/stories260K.bin" "$T/neg.bin" <<'PY'
import sys, struct
d = bytearray(open(sys.argv[1], 'rb').read()); struct.pack_into('<i', d, 8, -3); open(sys.argv[2], 'wb').write(d)
PY
expect_error "negative n_layers in header" "n_layers = -3" "$KILN" run "$T/neg.bin" --tokens 1 -n 1
# GGUF
printf 'GGUX\3\0\0\0' > "$T/bad.gguf"; head -c 64 /dev/zero >> "$T/bad.gguf"
expect_error "GGUF wrong magic" "bad.gguf" "$KILN" inspect "$T/bad.gguf"
"$KILN" convert "$M" "$T/s.gguf" 2>/dev/null
head -c 30000 "$T/s.gguf" > "$T/trunc.gguf"
expect_error "truncated GGUF" "trunc.gguf" "$KILN" inspect "$T/trunc.gguf"
# Hugging Face directories
"$KILN" convert "$M" "$T/hf" 2>/dev/null
mkhf() { rm -rf "$T/$1"; cp -r "$T/hf" "$T/$1"; }
mkhf missing_field; "$PYW" - "$T/missing_field/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); del c['hidden_size']; json.dump(c, open(sys.argv[1], 'w'))
PY
expect_error "config.json missing field" "'hidden_size' is missing" "$KILN" run "$T/missing_field" --tokens 1 -n 1
mkhf neg_field; "$PYW" - "$T/neg_field/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c['num_hidden_layers'] = -2; json.dump(c, open(sys.argv[1], 'w'))
PY
expect_error "config.json negative field" "'num_hidden_layers' = -2" "$KILN" run "$T/neg_field" --tokens 1 -n 1
mkhf absurd_field; "$PYW" - "$T/absurd_field/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c['vocab_size'] = 10**12; json.dump(c, open(sys.argv[1], 'w'))
PY
expect_error "config.json absurd field" "'vocab_size' = 1000000000000" "$KILN" run "$T/absurd_field" --tokens 1 -n 1
mkhf wrong_shape; "$PYW" - "$T/wrong_shape/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c['intermediate_size'] += 8; json.dump(c, open(sys.argv[1], 'w'))
PY
expect_error "config.json disagrees with a tensor shape" "mlp.gate_proj.weight' has shape" "$KILN" run "$T/wrong_shape" --tokens 1 -n 1
# safetensors surgery: rewrite the header
st_edit() { # dir, python-snippet operating on dict h (header) ; file rewritten with same data
    "$PYW" - "$T/$1/model.safetensors" "$2" <<'PY'
import json, struct, sys
p, code = sys.argv[1], sys.argv[2]
b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n]); data = b[8+n:]
exec(code)
hb = json.dumps(h).encode(); open(p, 'wb').write(struct.pack('<Q', len(hb)) + hb + data)
PY
}
mkhf past_end; st_edit past_end "t=h['model.norm.weight']; L=len(data); s=t['data_offsets'][1]-t['data_offsets'][0]; t['data_offsets']=[L-s+64, L+64]"
expect_error "tensor offset past end of file" "run past the end of the data" "$KILN" run "$T/past_end" --tokens 1 -n 1
mkhf overlap; st_edit overlap "a=h['model.norm.weight']; b=h['model.layers.0.input_layernorm.weight']; b['data_offsets']=list(a['data_offsets'])"
expect_error "overlapping tensors" "overlap" "$KILN" run "$T/overlap" --tokens 1 -n 1
mkhf missing_tensor; st_edit missing_tensor "del h['model.layers.1.mlp.up_proj.weight']"
expect_error "missing tensor" "missing tensor 'model.layers.1.mlp.up_proj.weight'" "$KILN" run "$T/missing_tensor" --tokens 1 -n 1
mkhf bad_shape; st_edit bad_shape "h['model.norm.weight']['shape']=[65]"
expect_error "tensor shape disagrees with its byte span" "model.norm.weight" "$KILN" run "$T/bad_shape" --tokens 1 -n 1
mkhf bad_header; printf '\xff\xff\xff\xff\xff\x00\x00\x00' | dd of="$T/bad_header/model.safetensors" bs=1 count=8 conv=notrunc 2>/dev/null
expect_error "safetensors header length past end" "header length" "$KILN" inspect "$T/bad_header"
# prompts and options
expect_error "non-UTF-8 prompt" "UTF-8" "$KILN" run "$M" -p $'Once \xff\xfe upon' -n 4
expect_error "token id out of range" "token id 9999" "$KILN" run "$M" --tokens 1,9999 -n 2
expect_error "frequency penalty out of range" "option --frequency-penalty: '3' is not a number in [-2, 2]" "$KILN" run "$M" --tokens 1 -n 2 --frequency-penalty 3
expect_error "repeat penalty not positive" "option --repeat-penalty" "$KILN" run "$M" --tokens 1 -n 2 --repeat-penalty 0
expect_error "bad -n value" "option -n" "$KILN" run "$M" -n -5
expect_error "missing model" "no such file" "$KILN" run "$T/nope" -n 1
[ $fails -eq 0 ] || { echo "$fails bad-input cases failed"; exit 1; }
