"""Speculative decoding with the model's own MTP layer (issue 25): `kiln run --spec mtp`.

- The MTP computation against an independent PyTorch reference (tests/reference/ref_mtp.py, written
  from vLLM's DeepSeekMTP: eh_proj over [enorm(embed(t_{j+1})) | hnorm(h_j)], the decoder layer
  num_hidden_layers over its own causal KV, shared_head norm and head; chained steps on the layer's
  own output): the logits of the first three draft steps after a 12-token prompt, for glm4_moe (GQA),
  deepseek_v3 (MLA, YaRN, q_proj) and glm4_moe_lite (MLA, q LoRA), within 1e-4 relative per row.
- Exactness: greedy output and every logits row identical in tokens (and within 1e-5) to --spec off,
  for k = 1..4, including glm_moe_dsa (sparse attention; its MTP layer runs its own indexer) and a
  BF16 KV cache; sampling with a seed runs. Greedy output identical to --spec off also with INT4 and
  FP8 weights (`kiln quantize`, MTP layer included) and BF16 / FP8 KV, k = 1..4.
- A model without an MTP layer is refused naming the reason."""
import os, sys, tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import ref_mtp  # noqa: E402
from kiln_cli import run  # noqa: E402

PROMPT = [3, 17, 42, 8, 99, 5, 61, 23, 77, 14, 250, 1]




def generated(p):
    line = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
    return [int(x) for x in line.split(",") if x.strip()]


def main():
    tmp = tempfile.mkdtemp(prefix="kiln_spec_mtp_")
    ids = ",".join(map(str, PROMPT))
    for arch in ("glm4_moe", "deepseek_v3", "glm4_moe_lite", "glm_moe_dsa"):
        d = os.path.join(tmp, arch)
        run("mkmodel", "--arch", arch, "--preset", "tiny", "--dtype", "f32", d)
        V = 256
        # MTP against the reference: -n 5 gives one drafting call of k = 3 right after the prompt
        if arch != "glm_moe_dsa":  # the reference's DSA indexer schedule covers the decoder layers only
            f = os.path.join(d, "draft.f32")
            p = run("run", d, "--tokens", ids, "-n", "5", "--temp", "0", "--spec", "mtp", "--spec-k", "3", "--dump-draft-logits", f)
            got = np.fromfile(f, dtype=np.float32).reshape(-1, V)[:3]
            gen = generated(p)
            drafts = [int(np.argmax(r)) for r in got[:2]]
            ref = ref_mtp.mtp_draft_logits(d, PROMPT, gen[0], drafts)
            rel = np.abs(got - ref).max(axis=1) / np.abs(ref).max(axis=1)
            assert rel.max() < 1e-4, f"{arch}: MTP draft logits differ from the reference by {rel} (relative, per step)"
            print(f"{arch}: MTP logits of 3 draft steps within {rel.max():.2g} of the reference")
        # exactness against --spec off
        for k in ("1", "2", "3", "4"):
            for kv in ("f32", "bf16"):
                fo, fm = os.path.join(d, f"off.{k}.{kv}"), os.path.join(d, f"mtp.{k}.{kv}")
                a = run("run", d, "--tokens", ids, "-n", "40", "--temp", "0", "--kv-dtype", kv, "--dump-logits", fo)
                b = run("run", d, "--tokens", ids, "-n", "40", "--temp", "0", "--kv-dtype", kv, "--spec", "mtp", "--spec-k", k, "--dump-logits", fm)
                assert generated(a) == generated(b), f"{arch} k={k} kv={kv}: --spec mtp changed the greedy output"
                la, lb = np.fromfile(fo, dtype=np.float32), np.fromfile(fm, dtype=np.float32)
                assert la.shape == lb.shape, f"{arch}: {la.shape} vs {lb.shape} logits rows"
                rel = np.abs(la - lb).max() / np.abs(la).max()
                # verification runs next + drafts as one batch (GEMM) where --spec off runs one token
                # at a time (GEMV): last-bit differences in f32; with a BF16 cache such a difference
                # can carry a cached value across a BF16 rounding boundary (one BF16 ulp, 2^-8)
                tol = 1e-5 if kv == "f32" else 1e-4
                assert rel < tol, f"{arch} k={k} kv={kv}: logits differ from --spec off by {rel}"
                assert "speculation: mtp" in b.stderr and "drafted" in b.stderr, b.stderr
        p = run("run", d, "--tokens", ids, "-n", "30", "--temp", "0.8", "--seed", "7", "--spec", "mtp", "--spec-k", "2")
        assert len(generated(p)) > 0, "sampling with --spec mtp produced nothing"
        # quantized weights (the MTP layer's too) and FP8 KV: the exactness is token identity
        for wq in ("int4", "fp8"):
            q = d + "." + wq
            run("quantize", d, q, "--weights", wq)
            for kv in ("bf16", "fp8"):
                a = run("run", q, "--tokens", ids, "-n", "40", "--temp", "0", "--kv-dtype", kv)
                for k in ("1", "2", "3", "4"):
                    b = run("run", q, "--tokens", ids, "-n", "40", "--temp", "0", "--kv-dtype", kv, "--spec", "mtp", "--spec-k", k)
                    assert generated(a) == generated(b), f"{arch} {wq} weights k={k} kv={kv}: --spec mtp changed the greedy output"
                    assert "speculation: mtp" in b.stderr and "drafted" in b.stderr, b.stderr
        print(f"{arch}: --spec mtp greedy output identical to --spec off (k = 1..4; f32 and bf16 KV, logits too; int4 and fp8 weights with bf16 and fp8 KV); sampling runs")
    d = os.path.join(tmp, "kimi")
    run("mkmodel", "--arch", "kimi_k2", "--preset", "tiny", "--dtype", "f32", d)
    p = run("run", d, "--tokens", ids, "-n", "4", "--spec", "mtp", ok=False)
    assert "MTP" in p.stderr, p.stderr
    print("refused without an MTP layer:", p.stderr.strip().splitlines()[-1][:140])


if __name__ == "__main__":
    main()
