#!/usr/bin/env bash
# The hostile inputs of issue 23, each made from a file kiln wrote itself, then edited the way an
# attacker would: every one must be refused with exit status 1 or 2 and one error line naming the
# file and the field, or (for legal-but-huge files) load in bounded time. A case that takes longer
# than $HOSTILE_LIMIT seconds (default 20: generous for sanitizer builds; the quadratic loads this
# guards against took over a minute) counts as a failure. tests/reference/gguf_edit.py edits GGUF.
set -u
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
M=$SHARED/models/stories260K
PYW=${PY:-python3}
LIMIT=${HOSTILE_LIMIT:-20}
export PYTHONPATH=$PWD/tests/reference
fails=0
run_timed() { # runs "$@" with stdout/stderr to $T/out, $T/err; sets rc
    timeout "$LIMIT" "$@" > "$T/out" 2> "$T/err"; rc=$?
}
expect_error() { # description, expected-substring, command...
    local desc=$1 want=$2; shift 2
    run_timed "$@"
    local n; n=$(grep -c "error:" "$T/err")
    if [ $rc -eq 124 ]; then echo "FAIL: $desc: still running after ${LIMIT}s"; fails=$((fails+1)); return; fi
    if [ $rc -eq 0 ] || [ $rc -gt 2 ] || [ "$n" -ne 1 ] || ! grep -qF -- "$want" "$T/err"; then
        echo "FAIL: $desc: rc=$rc, want one error line containing '$want', got:"; cat "$T/err"; fails=$((fails+1))
    else
        echo "ok: $desc: $(grep error: "$T/err")"
    fi
}
expect_ok() { # description, expected-substring-in-stderr-or-stdout, command...
    local desc=$1 want=$2; shift 2
    run_timed "$@"
    if [ $rc -ne 0 ] || ! cat "$T/out" "$T/err" | grep -qF -- "$want"; then
        echo "FAIL: $desc: rc=$rc, want success with '$want', got:"; cat "$T/err" | tail -5; fails=$((fails+1))
    else
        echo "ok: $desc"
    fi
}
"$KILN" convert "$M" "$T/s.gguf" > /dev/null 2>&1 || { echo "kiln convert to GGUF failed"; exit 1; }
"$KILN" convert "$M" "$T/hf" > /dev/null 2>&1 || { echo "kiln convert to HF failed"; exit 1; }
gg() { # out-name, python statements on kv / tensors (gguf_edit imported as g)
    "$PYW" - "$T/s.gguf" "$T/$1" "$2" <<'PY' || { echo "could not write $1"; exit 1; }
import sys, gguf_edit as g
kv, tensors = g.load(sys.argv[1])
exec(sys.argv[3])
g.save(sys.argv[2], kv, tensors)
PY
}

# --- GGUF special-token ids: llama.cpp's "no token" sentinel is none; other bad ids are refused ---
gg null_ids.gguf 'g.set_kv(kv, "tokenizer.ggml.padding_token_id", g.U32, 0xFFFFFFFF); g.set_kv(kv, "tokenizer.ggml.unknown_token_id", g.I32, -1)'
expect_ok "GGUF padding / unknown id = llama.cpp's no-token sentinel" "decode" "$KILN" run "$T/null_ids.gguf" --tokens 1 -n 2
gg bad_eos.gguf 'g.set_kv(kv, "tokenizer.ggml.eos_token_id", g.U32, 70000)'
expect_error "GGUF eos id past the vocabulary" "'tokenizer.ggml.eos_token_id': token id 70000 out of range" "$KILN" run "$T/bad_eos.gguf" --tokens 1 -n 2
gg neg_bos.gguf 'g.set_kv(kv, "tokenizer.ggml.bos_token_id", g.I32, -5)'
expect_error "GGUF negative bos id" "'tokenizer.ggml.bos_token_id': token id -5 out of range" "$KILN" run "$T/neg_bos.gguf" --tokens 1 -n 2

# --- GGUF hyper-parameters: held to config.json's ranges ---------------------------------------
gg rope.gguf 'g.set_kv(kv, "llama.rope.dimension_count", g.U32, 16)'          # head size is 8
expect_error "GGUF rope dimension above the head size" "llama.rope.dimension_count = 16" "$KILN" run "$T/rope.gguf" --tokens 1 -n 2
gg rope_odd.gguf 'g.set_kv(kv, "llama.rope.dimension_count", g.U32, 5)'
expect_error "GGUF odd rope dimension" "llama.rope.dimension_count = 5" "$KILN" run "$T/rope_odd.gguf" --tokens 1 -n 2
gg nan_eps.gguf 'g.set_kv(kv, "llama.attention.layer_norm_rms_epsilon", g.F32, float("nan"))'
expect_error "GGUF NaN epsilon" "llama.attention.layer_norm_rms_epsilon = nan" "$KILN" run "$T/nan_eps.gguf" --tokens 1 -n 2
gg inf_base.gguf 'g.set_kv(kv, "llama.rope.freq_base", g.F32, float("inf"))'
expect_error "GGUF infinite rope base" "llama.rope.freq_base = inf" "$KILN" run "$T/inf_base.gguf" --tokens 1 -n 2
gg odd_head.gguf 'g.set_kv(kv, "llama.attention.head_count", g.U32, 64); g.set_kv(kv, "llama.attention.head_count_kv", g.U32, 64)'
expect_error "GGUF head size 1 (odd)" "llama.embedding_length / llama.attention.head_count = 1" "$KILN" run "$T/odd_head.gguf" --tokens 1 -n 2
gg blocks.gguf 'g.set_kv(kv, "llama.block_count", g.U32, 1 << 24)'
expect_error "GGUF block_count 2^24" "llama.block_count = 16777216 is out of range" "$KILN" run "$T/blocks.gguf" --tokens 1 -n 2
gg bos.gguf 'g.set_kv(kv, "tokenizer.ggml.bos_token_id", g.U32, 100000)'
expect_error "GGUF bos id past the vocabulary" "'tokenizer.ggml.bos_token_id': token id 100000 out of range" "$KILN" inspect "$T/bos.gguf"

# --- GGUF sizes: many keys / tensors load in linear time; duplicates still found ----------------
gg keys.gguf 'kv += [("x.key.%d" % i, g.U8, 1) for i in range(60000)]'
expect_ok "GGUF with 60,000 metadata keys loads" "llama" "$KILN" inspect "$T/keys.gguf"
gg keys_dup.gguf 'kv += [("x.key.%d" % i, g.U8, 1) for i in range(60000)] + [("x.key.59999", g.U8, 1)]'
expect_error "GGUF duplicate key after 60,000" "key 'x.key.59999' appears twice" "$KILN" inspect "$T/keys_dup.gguf"
gg tensors.gguf 'tensors += [("x.t.%d" % i, [8], 0, bytes(32)) for i in range(60000)]'
expect_ok "GGUF with 60,000 tensors loads" "llama" "$KILN" inspect "$T/tensors.gguf"
gg tensors_dup.gguf 'tensors += [("x.t.%d" % i, [8], 0, bytes(32)) for i in range(60000)] + [("x.t.7", [8], 0, bytes(32))]'
expect_error "GGUF duplicate tensor after 60,000" "tensor 'x.t.7' appears twice" "$KILN" inspect "$T/tensors_dup.gguf"

# --- the default context and KV pool: never sized by the file alone ------------------------------
gg ctx.gguf 'g.set_kv(kv, "llama.context_length", g.U32, 1 << 24)'
expect_ok "GGUF with a 16M-token context runs with the default cap" "context 131072 of the file's 16777216" \
    "$KILN" run "$T/ctx.gguf" --tokens 1 -n 2
expect_ok "--ctx raises the default cap" "context 200000 of the file's 16777216" \
    "$KILN" run "$T/ctx.gguf" --tokens 1 -n 2 --ctx 200000

# --- llama2.c -------------------------------------------------------------------------------------
"$PYW" - "$M/stories260K.bin" "$T/vocab_min.bin" <<'PY'
import sys, struct
d = bytearray(open(sys.argv[1], 'rb').read()); struct.pack_into('<i', d, 20, -2**31); open(sys.argv[2], 'wb').write(d)
PY
expect_error "llama2.c vocab_size INT32_MIN" "vocab_size = -2147483648" "$KILN" run "$T/vocab_min.bin" --tokens 1 -n 2

# --- Hugging Face directories ---------------------------------------------------------------------
mkhf() { rm -rf "$T/$1"; cp -r "$T/hf" "$T/$1"; }
mkhf bos_big; "$PYW" - "$T/bos_big/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c['bos_token_id'] = 2**40; json.dump(c, open(sys.argv[1], 'w'))
PY
expect_error "config.json bos_token_id 2^40" "'bos_token_id' = 1099511627776" "$KILN" run "$T/bos_big" --tokens 1 -n 2
mkhf eos_past; "$PYW" - "$T/eos_past/config.json" <<'PY'
import json, sys; c = json.load(open(sys.argv[1])); c['eos_token_id'] = [c['vocab_size']]; json.dump(c, open(sys.argv[1], 'w'))
PY
expect_error "config.json eos_token_id past the vocabulary" "eos_token_id = 512 is out of range" "$KILN" run "$T/eos_past" --tokens 1 -n 2
# TemplateProcessing (the BPE loader's post-processor): a Sequence of ByteLevel and a template whose
# BOS id is first valid (control), then past the vocabulary
tp() { # out-dir, bos id
    mkdir -p "$T/$1"; "$PYW" - "$SHARED/tokenizers/deepseek-v3/tokenizer.json" "$T/$1/tokenizer.json" "$2" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
bos = '<｜begin▁of▁sentence｜>'
t['post_processor'] = {'type': 'Sequence', 'processors': [t['post_processor'], {
    'type': 'TemplateProcessing', 'single': [{'SpecialToken': {'id': bos, 'type_id': 0}}, {'Sequence': {'id': 'A', 'type_id': 0}}],
    'pair': [], 'special_tokens': {bos: {'id': bos, 'ids': [int(sys.argv[3])], 'tokens': [bos]}}}]}
json.dump(t, open(sys.argv[2], 'w'))
PY
}
tp tp_ok 0
expect_ok "tokenizer.json TemplateProcessing with a valid BOS id" "tokens" "$KILN" tokenize "$T/tp_ok/tokenizer.json" "hello"
tp tp_bos 200000
expect_error "tokenizer.json TemplateProcessing id past the vocabulary" "post_processor.special_tokens['<｜begin▁of▁sentence｜>'].ids[0] = 200000" \
    "$KILN" tokenize "$T/tp_bos/tokenizer.json" "hello"
mkhf st_wrap; "$PYW" - "$T/st_wrap/model.safetensors" <<'PY'
import json, struct, sys
p = sys.argv[1]; b = open(p, 'rb').read(); n = struct.unpack('<Q', b[:8])[0]; h = json.loads(b[8:8+n])
k = next(k for k in h if k != '__metadata__'); h[k]['shape'] = [2**40, 2**40, 2**24]   # 2^104 elements wrap to 0
hb = json.dumps(h).encode(); open(p, 'wb').write(struct.pack('<Q', len(hb)) + hb + b[8+n:])
PY
expect_error "safetensors element count that wraps" "makes more than 2^42 elements" "$KILN" inspect "$T/st_wrap"
# a kernels setting from the environment with a value it does not take: refused by name at start
expect_error "KILN_FP8_PREFILL with an unknown value" "KILN_FP8_PREFILL: 'fast' is not bf16, auto or int8" \
    env KILN_FP8_PREFILL=fast "$KILN" run "$M" --tokens 1 -n 2
expect_ok "KILN_FP8_PREFILL=int8 is taken" "decode: 2 tokens" env KILN_FP8_PREFILL=int8 "$KILN" run "$M" --tokens 1 -n 2

[ $fails -eq 0 ] || { echo "$fails case(s) failed"; exit 1; }
echo "all hostile inputs handled"
