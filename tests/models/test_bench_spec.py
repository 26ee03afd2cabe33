"""kiln bench --spec (issue 25, docs/SPECULATIVE.md): speculative decoding against plain decoding on one
sequence. On stories260K, per (drafter, k) one JSON object; every run's greedy tokens equal --spec off's
(the bench fails otherwise, so a clean exit is the identity check); the oracle drafter (the known
greedy continuation) has every draft accepted and more than one token per forward; the always-wrong
drafter none; prompt lookup reports consistent counts. The same identity holds with the weights
re-quantized to BF16, FP8 and INT4 (the few-token kernels: each verified position's logits are its
1-token logits). Bad values are refused naming the option and value."""
import json, os, subprocess, sys, tempfile

KILN = os.environ.get("KILN", "./kiln")
M = os.path.join(os.environ.get("SHARED", "../shared"), "models", "stories260K")


def bench(*args):
    p = subprocess.run([KILN, "bench", M, "--json", "--threads", "1", *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kiln bench {' '.join(args)} failed: {p.stderr}")
    return [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]


def check(rows, ks, drafters):
    assert [(r["drafter"], r["k"]) for r in rows] == [("off", 0)] + [(d, k) for d in drafters for k in ks], rows
    gen = rows[0]["generated"]
    assert gen > 8, rows[0]
    for r in rows:
        assert r["generated"] == gen and r["best_tps"] > 0, r
        assert 0 <= r["accepted"] <= r["drafted"], r
        # the first token comes from the prompt's logits, then each forward emits its kept drafts and one more
        assert r["generated"] == 1 + r["accepted"] + r["verifies"], r
        if r["drafter"] == "oracle":
            assert r["drafted"] > 0 and r["accepted"] == r["drafted"] and r["tokens_per_forward"] > 1.5, r
            # each step drafts min(k, tokens left - 1) and keeps them all: ⌈(generated − 1) / (k + 1)⌉ forwards
            assert r["verifies"] == -(-(gen - 1) // (r["k"] + 1)), r
        if r["drafter"] == "wrong":
            assert r["drafted"] > 0 and r["accepted"] == 0 and r["tokens_per_forward"] == 1.0, r
        if r["drafter"] == "off":
            assert r["drafted"] == 0 and r["vs_off_paired_median"] == 1.0, r


def main():
    if not os.path.isfile(os.path.join(M, "stories260K.bin")):
        print("no stories260K under SHARED"); sys.exit(77)
    check(bench("--spec", "off,ngram,oracle,wrong", "--spec-k", "1,3", "--prompt", "64", "--gen", "40", "--repeat", "2"), [1, 3],
          ["ngram", "oracle", "wrong"])
    rows = bench("--spec", "ngram,oracle", "--spec-k", "2", "-p", "Once upon a time, Lily saw a cat. Once upon a time, Lily saw a dog. Once upon a time,",
                 "--gen", "48", "--repeat", "1")
    check(rows, [2], ["ngram", "oracle"])
    assert rows[1]["drafted"] > 0, rows[1]  # the repeated sentence gives prompt lookup matches
    for w in ("bf16", "fp8", "int4"):
        check(bench("--weights", w, "--spec", "oracle,wrong", "--spec-k", "1,4", "--prompt", "48", "--gen", "32", "--repeat", "1"), [1, 4],
              ["oracle", "wrong"])
    # MTP drafting (a synthetic glm4_moe with a random MTP layer: it drafts, its drafts are not
    # accepted): every round drafts — the rewind to the prompt between runs must leave the layer able
    # to draft (it once marked itself broken after the first round: the JSON holds the last round's)
    with tempfile.TemporaryDirectory() as t:
        p = subprocess.run([KILN, "mkmodel", "--arch", "glm4_moe", "--preset", "tiny", "--dtype", "f32", f"{t}/g"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        p = subprocess.run([KILN, "bench", f"{t}/g", "--json", "--threads", "1", "--spec", "mtp,oracle", "--spec-k", "1,3", "--prompt", "32",
                            "--gen", "24", "--repeat", "3"], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
        rows = [json.loads(l) for l in p.stdout.splitlines() if l.startswith("{")]
        check(rows, [1, 3], ["mtp", "oracle"])
        for r in rows[1:3]:
            assert r["drafted"] >= r["verifies"] - 1 > 0, r  # a draft at every step but the last
    for args, names in ((["--spec", "bogus"], ["--spec", "bogus"]), (["--spec", "off", "--spec-k", "0"], ["--spec-k", "0"]),
                        (["--spec", "off", "--spec-k", "1,x"], ["--spec-k", "x"]), (["--spec", "mtp"], ["no MTP layer"]),
                        (["--spec", "off", "--gen", "100000"], ["--gen", "100000"])):
        p = subprocess.run([KILN, "bench", M, *args], capture_output=True, text=True)
        assert p.returncode != 0 and all(n in p.stderr for n in names), (args, p.returncode, p.stderr)
    print("ok")


if __name__ == "__main__":
    main()
