#!/usr/bin/env bash
# Bad input for the GLM / DeepSeek / Kimi architectures: each case must fail with a non-zero exit and
# one clear error line naming the field, tensor or value at fault (never a crash).
#   - config.json missing a field the architecture needs (kv_lora_rank, n_routed_experts, ffn_hidden_size)
#   - n_routed_experts disagreeing with the expert tensors (fewer and more than the checkpoint has)
#   - unknown model_type / unknown mkmodel --arch
#   - unsupported values (scoring_func softmax, rope_scaling type, original_rope false)
#   - DeepSeek sparse attention (deepseek_v32, glm_moe_dsa): index_topk <= 0, indexer_types of the
#     wrong length or with an unknown type, a shared layer 0, indexer tensors of the wrong shape,
#     an index_head_dim the Hadamard / FP8 blocks cannot take (and --kv-dtype fp8, accepted: the compact FP8 rows)
#   - an MTP layer tensor of the wrong shape; `kiln inspect` listing the unused (MTP) tensors
set -u
KILN=${KILN:-./kiln}
PY=${PY:-/usr/bin/python3}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail=0

mk() { "$KILN" mkmodel --arch "$1" --preset tiny "$T/$2" >/dev/null 2>&1 || { echo "FAIL: mkmodel $1"; exit 1; }; }
# edit DIR PYTHON-EXPRESSION-ON-c : rewrites DIR/config.json
edit() { "$PY" -c "import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); $2; json.dump(c, open(p,'w'))" "$1"; }
# expect NAME DIR PATTERN...: kiln run must fail and stderr must contain every pattern
expect() {
    local name=$1 dir=$2; shift 2
    local err rc
    err=$("$KILN" run "$dir" --tokens 1,2,3 -n 1 2>&1 >/dev/null); rc=$?
    if [ $rc -eq 0 ] || [ $rc -gt 128 ]; then echo "FAIL $name: exit $rc"; fail=1; return; fi
    for p in "$@"; do
        if ! grep -qF -- "$p" <<<"$err"; then echo "FAIL $name: error does not mention '$p': $err"; fail=1; return; fi
    done
    echo "ok   $name: $err"
}

mk deepseek_v3 ds; edit "$T/ds" 'del c["kv_lora_rank"]'
expect "missing kv_lora_rank" "$T/ds" "kv_lora_rank" "config.json"

mk glm4_moe gm; edit "$T/gm" 'del c["n_routed_experts"]'
expect "missing n_routed_experts" "$T/gm" "n_routed_experts"

mk chatglm cg; edit "$T/cg" 'del c["ffn_hidden_size"]'
expect "missing ffn_hidden_size" "$T/cg" "ffn_hidden_size"

mk glm4_moe_lite fl; edit "$T/fl" 'del c["q_lora_rank"]'
expect "missing q_lora_rank" "$T/fl" "q_lora_rank"

mk glm4_moe few; edit "$T/few" 'c["n_routed_experts"]=8'
expect "fewer experts in config" "$T/few" "n_routed_experts = 8" "experts.8.gate_proj"

mk deepseek_v3 many; edit "$T/many" 'c["n_routed_experts"]=32; c["n_group"]=4'
expect "more experts in config" "$T/many" "n_routed_experts = 32" "experts.16.gate_proj" "missing"

mk kimi_k2 unk; edit "$T/unk" 'c["model_type"]="glm5_moe"; c["architectures"]=["Glm5MoeForCausalLM"]'
expect "unknown model_type" "$T/unk" "glm5_moe" "not supported"

mk deepseek_v3 sf; edit "$T/sf" 'c["scoring_func"]="softmax"'
expect "scoring_func softmax" "$T/sf" "scoring_func" "softmax"

mk deepseek_v3 rs; edit "$T/rs" 'c["rope_scaling"]["type"]="longrope"'
expect "rope_scaling longrope" "$T/rs" "rope_scaling" "longrope"

mk chatglm orr; edit "$T/orr" 'c["original_rope"]=False'
expect "chatglm original_rope false" "$T/orr" "original_rope"

mk glm4_moe grp; edit "$T/grp" 'c["n_group"]=3'
expect "n_group not dividing experts" "$T/grp" "n_group" "n_routed_experts"

mk deepseek_v32 tk0; edit "$T/tk0" 'c["index_topk"]=0'
expect "index_topk 0" "$T/tk0" "index_topk" "= 0"
mk deepseek_v32 tkn; edit "$T/tkn" 'c["index_topk"]=-5'
expect "index_topk negative" "$T/tkn" "index_topk" "-5"
mk glm_moe_dsa itl; edit "$T/itl" 'c["indexer_types"]=["full","shared"]'
expect "indexer_types wrong length" "$T/itl" "indexer_types" "3 entries"
mk glm_moe_dsa itu; edit "$T/itu" 'c["indexer_types"]=["full","sparse","full"]'
expect "indexer_types unknown type" "$T/itu" "indexer_types[1]" "sparse"
mk glm_moe_dsa its; edit "$T/its" 'c["indexer_types"]=["shared","full","full"]'
expect "indexer_types shared layer 0" "$T/its" "indexer_types" "layer 0"
mk glm_moe_dsa itp; edit "$T/itp" 'c["index_topk_pattern"]="FSX"'
expect "index_topk_pattern bad letter" "$T/itp" "index_topk_pattern" "'X'"
mk deepseek_v32 ish; edit "$T/ish" 'c["index_n_heads"]=8'
expect "indexer tensor shape" "$T/ish" "self_attn.indexer.wq_b" "1024"
mk deepseek_v32 ihd; edit "$T/ihd" 'c["index_head_dim"]=96'
expect "index_head_dim not a power of two" "$T/ihd" "index_head_dim" "96"
# --kv-dtype fp8 on a DSA model is not refused: it gives the compact FP8 rows with a bf16 rope part
# (SGLang's / vLLM's layout; docs/DSA.md), the same rows as bf16, so the same tokens, and says so
mk glm_moe_dsa kv8
out8=$("$KILN" run "$T/kv8" --tokens 1,2,3 -n 4 --temp 0 --kv-dtype fp8 2>"$T/kv8.err"); rc8=$?
outb=$("$KILN" run "$T/kv8" --tokens 1,2,3 -n 4 --temp 0 --kv-dtype bf16 2>/dev/null); rcb=$?
if [ $rc8 -ne 0 ] || [ $rcb -ne 0 ] || [ "$out8" != "$outb" ] || ! grep -qF -- "--kv-dtype fp8 gives this layout, rope part in bf16" "$T/kv8.err"; then
    echo "FAIL DSA --kv-dtype fp8: exit $rc8 / $rcb, '$out8' vs '$outb': $(cat "$T/kv8.err")"; fail=1
else echo "ok   DSA --kv-dtype fp8 = the compact rows, rope bf16: $out8"; fi

# an MTP layer's tensor of the wrong shape (the safetensors header rewritten: eh_proj [64, 128] → [128, 64])
mk deepseek_v32 mtp
"$PY" - "$T/mtp/model.safetensors" <<'EOF'
import json, struct, sys
p = sys.argv[1]
raw = open(p, "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
h = json.loads(raw[8:8 + n])
h["model.layers.3.eh_proj.weight"]["shape"] = [128, 64]
hb = json.dumps(h).encode()
hb += b" " * ((8 - len(hb) % 8) % 8)
open(p, "wb").write(struct.pack("<Q", len(hb)) + hb + raw[8 + n:])
EOF
expect "MTP tensor shape" "$T/mtp" "model.layers.3.eh_proj.weight" "[128, 64]"
# kiln inspect names what the forward pass does not read, and why
mk glm_moe_dsa ins
out=$("$KILN" inspect "$T/ins" 2>&1)
if grep -q "model.layers.3.eh_proj.weight .*MTP layer 3 (num_nextn_predict_layers = 1): shapes checked" <<<"$out" &&
   ! grep -q "model.layers.0.self_attn.q_a_proj.weight .*MTP" <<<"$out"; then echo "ok   inspect lists the MTP layer as unused";
else echo "FAIL inspect unused tensors: $(grep -A3 'not used' <<<"$out")"; fail=1; fi

err=$("$KILN" mkmodel --arch glm5 --preset tiny "$T/x" 2>&1); rc=$?
if [ $rc -eq 0 ] || ! grep -q "glm5" <<<"$err"; then echo "FAIL mkmodel unknown arch: $err"; fail=1; else echo "ok   mkmodel unknown arch: $err"; fi
err=$("$KILN" mkmodel --arch kimi_k2 --preset huge "$T/x" 2>&1); rc=$?
if [ $rc -eq 0 ] || ! grep -q "huge" <<<"$err"; then echo "FAIL mkmodel unknown preset: $err"; fail=1; else echo "ok   mkmodel unknown preset: $err"; fi
err=$("$KILN" mkmodel --arch glm4 --preset tiny,mtp=1 "$T/x" 2>&1); rc=$?
if [ $rc -eq 0 ] || ! grep -q "mtp=1" <<<"$err"; then echo "FAIL mkmodel mtp on glm4: $err"; fail=1; else echo "ok   mkmodel mtp on glm4: $err"; fi
"$KILN" mkmodel --arch deepseek_v3 --preset tiny,mtp=2 "$T/mtp2" >/dev/null 2>&1 && grep -q '"num_nextn_predict_layers": *2' "$T/mtp2/config.json" ||
    { echo "FAIL mkmodel deepseek_v3 mtp=2: no 2 MTP layers in the config"; fail=1; }

exit $fail
