#!/usr/bin/env bash
# `kiln eval` end to end on stories260K:
#   - perplexity against an independent reference: llama2.c's own logits along its greedy path
#     ($SHARED/models/stories260K/expected/greedy_logits_f32.bin), scored with numpy over the text
#     that path printed;
#   - determinism (the same numbers twice) and the JSON shape, over every task with a small --limit;
#   - kl: a run against its own saved baseline has KL 0 and full top-1 agreement;
#   - --matrix prints one Markdown table with deltas against the first row;
#   - bad input: a malformed data line is reported as file:line and skipped (or fails with
#     --strict), an unknown task lists the known ones, the progress bar stays off a non-terminal.
set -euo pipefail
M=$SHARED/models/stories260K
E=$M/expected
D=$SHARED/data
[ -f "$M/stories260K.bin" ] && [ -d "$D" ] || { echo "no stories260K or data under $SHARED"; exit 77; }
PYB=${PY:-/usr/bin/python3}
T=$(mktemp -d); trap 'rm -rf "$T"' EXIT
K() { "$KILN" eval "$M" --threads 1 "$@"; }

# 1. perplexity of llama2.c's greedy text = the reference from llama2.c's logits (one window)
K --task "ppl:$E/bos_greedy_n200.txt" --json > "$T/ppl.json"
"$PYB" - "$T/ppl.json" "$E" <<'PY'
import json, sys, numpy as np
r = json.load(open(sys.argv[1]))["results"]
got = next(v for k, v in r.items() if k.startswith("ppl:"))
E = sys.argv[2]
L = np.fromfile(E + "/greedy_logits_f32.bin", dtype="<f4").reshape(256, 512).astype(np.float64)
nxt = [int(l.split()[2]) for l in open(E + "/greedy_tokens.txt") if not l.startswith("#")]
n = got["n"]
assert n == 200, f"scored {n} tokens, the greedy text has 200"
m = L.max(1, keepdims=True)
lp = L - m - np.log(np.exp(L - m).sum(1, keepdims=True))
ref = float(np.exp(-np.mean([lp[i, nxt[i]] for i in range(n)])))
assert abs(got["ppl"] - ref) < 1e-5 * ref, (got["ppl"], ref)
print(f"ppl {got['ppl']:.6f} = llama2.c reference {ref:.6f}")
PY

# A data directory: the shared sets, MMLU cut to one subject so the test stays short.
mkdir -p "$T/data/mmlu/dev" "$T/data/mmlu/test"
for d in arc gsm8k more wikitext-2-raw; do ln -s "$D/$d" "$T/data/$d"; done
cp "$D/mmlu/dev/astronomy_dev.csv" "$T/data/mmlu/dev/"
cp "$D/mmlu/test/astronomy_test.csv" "$T/data/mmlu/test/"
TASKS=ppl:tinystories,kl,arc_easy,arc_challenge,piqa,winogrande,openbook_qa,mmlu,gsm8k
ARGS=(--data-dir "$T/data" --task "$TASKS" --limit 3 --max-tokens 300 --max-gen 24 --json)

# 2. determinism and shape
K "${ARGS[@]}" --save-logits "$T/base.lgp" > "$T/a.json" 2> "$T/a.err"
K "${ARGS[@]}" --baseline-logits "$T/base.lgp" > "$T/b.json" 2> "$T/b.err"
K "${ARGS[@]}" --baseline-logits "$T/base.lgp" --out "$T/c_out.json" > "$T/c.json" 2> "$T/c.err"
if grep -q $'\r' "$T/a.err"; then echo "progress bar drawn on a non-terminal stderr"; exit 1; fi
"$PYB" - "$T" <<'PY'
import json, sys
T = sys.argv[1]
a, b, c, o = (json.load(open(f"{T}/{x}.json")) for x in ("a", "b", "c", "c_out"))
assert b["results"] == c["results"], "two identical runs gave different numbers"
assert o["results"] == c["results"], "--out differs from --json"
for k in ("model", "weights", "kv_dtype", "limit", "shots", "results", "seconds"):
    assert k in c, f"top-level key {k} missing"
r = c["results"]
tasks = "ppl:tinystories kl arc_easy arc_challenge piqa winogrande openbook_qa mmlu gsm8k".split()
assert sorted(r) == sorted(tasks), sorted(r)
for t in ("arc_easy", "arc_challenge", "piqa", "winogrande", "openbook_qa"):
    for k in ("acc", "acc_stderr", "acc_norm", "acc_norm_stderr", "n", "truncated"):
        assert k in r[t], f"{t}.{k} missing"
    assert r[t]["n"] == 3 and 0 <= r[t]["acc"] <= 1 and abs(r[t]["acc"] * 3 - round(r[t]["acc"] * 3)) < 1e-12
assert r["mmlu"]["n"] == 3 and "acc_micro" in r["mmlu"] and "astronomy" in r["mmlu"]["subjects"]
assert r["mmlu"]["subjects"]["astronomy"]["n"] == 3
g = r["gsm8k"]
assert g["n"] == 3 and "exact_match_strict" in g and "exact_match_flexible" in g
assert r["ppl:tinystories"]["n"] == 299 and r["ppl:tinystories"]["ppl"] > 1
k = r["kl"]
assert k["kl_mean"] == 0 and k["kl_p99"] == 0 and k["top1_agree"] == 1, k
assert k["ppl"] == k["ppl_baseline"] == a["results"]["kl"]["ppl"]
for t in tasks:
    if t != "kl":
        assert a["results"][t] == c["results"][t], t
print("deterministic; JSON shape ok")
PY

# 3. matrix: one table, the second row with deltas against the first
"$KILN" eval "$M" --threads 1 --data-dir "$T/data" --matrix --configs f32/f32,bf16/bf16,f32/bf16 \
    --task ppl:tinystories,kl --max-tokens 300 > "$T/m.md" 2> "$T/m.err" || { cat "$T/m.err"; exit 1; }
cat "$T/m.md"
[ "$(grep -c '^|' "$T/m.md")" -eq 5 ] || { echo "matrix: want a header, a rule and 3 rows"; exit 1; }
grep -q '^| weights | KV | ppl:tinystories ppl | kl kl_mean |' "$T/m.md"
grep -q '^| bf16 | bf16 | [0-9.]* ([+-][0-9.]*) | [0-9.e+-]* | ' "$T/m.md"

# 4. bad input
cp -r "$D/arc" "$T/arc_src"
rm "$T/data/arc"; mkdir "$T/data/arc"
{ head -n 2 "$T/arc_src/arc_easy.jsonl"; echo '{"query": "Question: broken", "choices": ["a"'; sed -n 3,4p "$T/arc_src/arc_easy.jsonl"; } > "$T/data/arc/arc_easy.jsonl"
K --data-dir "$T/data" --task arc_easy --json > "$T/bad.json" 2> "$T/bad.err"
grep -q "$T/data/arc/arc_easy.jsonl:3: invalid JSON" "$T/bad.err" || { echo "malformed line not reported as file:line"; cat "$T/bad.err"; exit 1; }
"$PYB" -c "import json,sys; r=json.load(open(sys.argv[1]))['results']['arc_easy']; assert r['n']==4, r" "$T/bad.json"
set +e
K --data-dir "$T/data" --task arc_easy --strict > /dev/null 2> "$T/strict.err"; rc=$?
K --task arc_medium > /dev/null 2> "$T/unk.err"; rc2=$?
set -e
[ $rc -ne 0 ] && [ $rc -lt 128 ] && [ "$(grep -c 'error:' "$T/strict.err")" -eq 1 ] && grep -q "arc_easy.jsonl:3:" "$T/strict.err" \
    || { echo "--strict: rc=$rc"; cat "$T/strict.err"; exit 1; }
[ $rc2 -eq 2 ] && grep -q "unknown task 'arc_medium'" "$T/unk.err" && grep -q "arc_easy" "$T/unk.err" && grep -q "gsm8k" "$T/unk.err" \
    || { echo "unknown task: rc=$rc2"; cat "$T/unk.err"; exit 1; }
echo "bad input ok"

# 5. --weights: int4 keeps stories260K's down_proj (172 input columns, not a multiple of the group
#    of 32) as stored and says so; a synthetic MoE model (no tokenizer) is compared on kl:random
#    with its experts requantized, and the same configuration twice gives KL 0.
K --data-dir "$T/data" --task ppl:tinystories --max-tokens 200 --weights int4 > /dev/null 2> "$T/int4.err"
grep -q "int4: 5 linear weights kept in the stored format" "$T/int4.err" || { cat "$T/int4.err"; exit 1; }
"$KILN" mkmodel --arch glm4_moe --preset tiny "$T/moe" 2> /dev/null
"$KILN" eval "$T/moe" --threads 1 --matrix --configs f32/f32,int4/fp8,f32/f32 --task kl:random --max-tokens 300 --json > "$T/moe.json" 2> "$T/moe.err" \
    || { cat "$T/moe.err"; exit 1; }
"$PYB" - "$T/moe.json" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))["matrix"]
assert [(r["weights"], r["kv_dtype"]) for r in rows] == [("f32", "f32"), ("int4", "fp8"), ("f32", "f32")]
q, same = rows[1]["results"]["kl:random"], rows[2]["results"]["kl:random"]
assert q["n"] == 299 and q["kl_mean"] > 0 and q["top1_agree"] < 1, q
assert same["kl_mean"] == 0 and same["top1_agree"] == 1, same
print("moe: int4/fp8 kl_mean %.3g, top-1 %.3f" % (q["kl_mean"], q["top1_agree"]))
PY
set +e
"$KILN" eval "$T/moe" --task arc_easy --limit 1 --data-dir "$T/data" > /dev/null 2> "$T/notok.err"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "no tokenizer" "$T/notok.err" || { echo "tokenizer-less model: rc=$rc"; cat "$T/notok.err"; exit 1; }
echo "weights ok"
