#!/usr/bin/env bash
# `kiln tokenize` and byte-level BPE models end to end:
#   - ids of llama.cpp's qwen2 test vector (the ids Hugging Face gives) from Qwen3's tokenizer.json,
#     its directory and its tokenizer_config.json; special tokens parsed or not (--no-special);
#   - an HF model directory with Qwen3's tokenizer files (synthetic llama weights, vocab 151936)
#     loads, `kiln run -p` generates, and the same greedy text comes out after converting it to
#     GGUF and back (the tokenizer travels through both formats);
#   - bad input: truncated tokenizer.json, unknown pre-tokenizer type, a regex PCRE2 rejects,
#     invalid UTF-8 text: one error line naming the file / field / offset, never a crash.
set -u
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
Q=$SHARED/tokenizers/qwen3
[ -f "$Q/tokenizer.json" ] || { echo "no $Q/tokenizer.json"; exit 77; }
fails=0
fail() { echo "FAIL: $*"; fails=$((fails+1)); }

# llama.cpp's ggml-vocab-qwen2.gguf.out, case 20
WANT='[78762, 14144, 1456, 13073, 63471, 33594, 3038, 133178, 79012]'
for p in "$Q/tokenizer.json" "$Q" "$Q/tokenizer_config.json"; do
    got=$("$KILN" tokenize "$p" --json "нещо на Български" | sed -n 's/^{"ids": \(\[[^]]*\]\).*/\1/p')
    [ "$got" = "$WANT" ] && echo "ok: tokenize $p" || fail "tokenize $p: ids $got, want $WANT"
done
got=$("$KILN" tokenize "$Q" "<|im_start|>user" | head -1)
[ "$got" = "$(printf '151644\t<|im_start|>')" ] && echo "ok: special token parsed" || fail "special token: '$got'"
n=$("$KILN" tokenize "$Q" --no-special "<|im_start|>" | tail -1)
[ "$n" != "1 tokens" ] && echo "ok: --no-special encodes text ($n)" || fail "--no-special still gives one token"
# "--" ends the options: a TEXT that starts with "--" (the same ids as through standard input)
a=$("$KILN" tokenize "$Q" --json -- "--abc" | sed -n 's/^{"ids": \(\[[^]]*\]\).*/\1/p')
b=$(printf '%s' "--abc" | "$KILN" tokenize "$Q" --json - | sed -n 's/^{"ids": \(\[[^]]*\]\).*/\1/p')
[ -n "$a" ] && [ "$a" = "$b" ] && echo "ok: -- ends the options ($a)" || fail "-- then '--abc': '$a' vs stdin '$b'"
if "$KILN" tokenize "$Q" "--abc" > /dev/null 2> "$T/err"; then fail "'--abc' before -- was taken as text"
elif grep -q "unknown option '--abc'" "$T/err"; then echo "ok: '--abc' before -- is an unknown option"
else fail "'--abc' before --: $(cat "$T/err")"; fi

# a model directory with a byte-level tokenizer
"$KILN" mkmodel --arch llama --dim 64 --ffn 128 --layers 1 --heads 2 --vocab 151936 --seq 256 "$T/m" > /dev/null || fail "mkmodel"
cp "$Q/tokenizer.json" "$Q/tokenizer_config.json" "$T/m/"
chmod u+w "$T/m"/*
out1=$("$KILN" run "$T/m" -p "Hello" -n 5 --temp 0 2>"$T/err") || { fail "kiln run HF dir: $(cat "$T/err")"; }
[ -n "$out1" ] && echo "ok: kiln run on the HF directory: '$out1'" || fail "kiln run printed nothing"
[ "$("$KILN" tokenize "$T/m" "Hello" | head -1)" = "$(printf '9707\tHello')" ] && echo "ok: tokenize a model dir" || fail "tokenize model dir"
"$KILN" convert "$T/m" "$T/m.gguf" > /dev/null 2>&1 || fail "convert to gguf"
out2=$("$KILN" run "$T/m.gguf" -p "Hello" -n 5 --temp 0 2>/dev/null) || fail "kiln run gguf"
[ "$out1" = "$out2" ] && echo "ok: same text from the GGUF" || fail "gguf: '$out2' vs '$out1'"
got=$("$KILN" tokenize "$T/m.gguf" --json "нещо на Български" | sed -n 's/^{"ids": \(\[[^]]*\]\).*/\1/p')
[ "$got" = "$WANT" ] && echo "ok: GGUF tokenizer ids" || fail "GGUF tokenizer ids $got"
rm -f "$T/m/model.safetensors"
"$KILN" convert "$T/m.gguf" "$T/m2" > /dev/null 2>&1 || fail "convert back to hf"
out3=$("$KILN" run "$T/m2" -p "Hello" -n 5 --temp 0 2>/dev/null) || fail "kiln run converted-back dir"
[ "$out1" = "$out3" ] && echo "ok: same text after GGUF -> HF" || fail "gguf->hf: '$out3' vs '$out1'"

# bad input
expect_error() { # description, expected-substring, command...
    local desc=$1 want=$2; shift 2
    "$@" > "$T/out" 2> "$T/err"
    local rc=$?
    if [ $rc -eq 0 ] || [ $rc -ge 128 ] || [ "$(grep -c 'error:' "$T/err")" -ne 1 ] || ! grep -qF -- "$want" "$T/err"; then
        fail "$desc: rc=$rc, want one error line containing '$want', got: $(cat "$T/err")"
    else
        echo "ok: $desc: $(cat "$T/err")"
    fi
}
head -c 5000 "$Q/tokenizer.json" > "$T/trunc.json"
expect_error "truncated tokenizer.json" "$T/trunc.json: invalid JSON" "$KILN" tokenize "$T/trunc.json" "x"
MODEL='"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]}'
echo "{$MODEL, \"pre_tokenizer\": {\"type\": \"Frobnicate\"}}" > "$T/pre.json"
expect_error "unknown pre-tokenizer type" "pre_tokenizer.type: pre-tokenizer type 'Frobnicate' is not supported" "$KILN" tokenize "$T/pre.json" "x"
echo "{$MODEL, \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"[a-\"}, \"behavior\": \"Isolated\"}}" > "$T/rx.json"
expect_error "regex PCRE2 rejects" "pre_tokenizer.pattern.Regex: PCRE2 rejects the regex at offset" "$KILN" tokenize "$T/rx.json" "x"
expect_error "invalid UTF-8 text" "invalid UTF-8 at byte offset 4 (byte 0x28)" "$KILN" tokenize "$Q" "$(printf 'abc\xc3(')"
expect_error "missing tokenizer" "/nonexistent/tok.json" "$KILN" tokenize /nonexistent/tok.json "x"
echo '[{"role": "user", "content": "Hi"}]' > "$T/msgs.json"
expect_error "chat template of a directory without one" "no chat template" "$KILN" chat-template "$T" --messages "$T/msgs.json"
# the chat template travelled HF -> GGUF -> HF with the tokenizer
a=$("$KILN" chat-template "$Q" --messages "$T/msgs.json") && b=$("$KILN" chat-template "$T/m2" --messages "$T/msgs.json") &&
    [ "$a" = "$b" ] && echo "ok: chat template kept through GGUF" || fail "chat template after GGUF round trip: '$b' vs '$a'"

[ $fails -eq 0 ] && echo "all ok" || { echo "$fails failure(s)"; exit 1; }
