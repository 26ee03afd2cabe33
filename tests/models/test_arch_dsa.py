"""DeepSeek sparse attention checkpoints (deepseek_v32, glm_moe_dsa with every layer's own indexer and
with GLM-5.2's shared-indexer layers): what the logits comparison needs besides itself.

The comparison of kiln's logits with the independent PyTorch reference (tests/reference/ref_dsa.py,
written from DeepSeek-V3.2's official inference code) runs in tests/models/test_arch_kv_quant.c:
the model rounds its latent and indexer keys through FP8, so a reference that rounds its own values
is ill-conditioned (a value within float noise of a rounding midpoint goes the other way, one FP8
step, and moves later logits by up to ~1e-3); there the reference checks every cached FP8 value
against its own rounding (within noise) and is then fed kiln's cache, and must match within 1e-3.
This test checks that the comparison means something: with index_topk 16 and a 64-token prompt plus
32 greedy steps the selection is a strict subset, so the same reference with dense attention
(index_topk above the context) must be far from kiln's logits; and `kiln inspect --kv` reports the
row's three parts."""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import harness  # noqa: E402
import st_reader  # noqa: E402


def dense_gap(d, prompt, n_gen):
    """max relative error of kiln's logits against the reference with dense attention."""
    gen, flat = harness.run_kiln(d, prompt, n_gen, ["--kv-dtype", "f32"])
    real_load = st_reader.load_dir

    def dense_load(path):
        t, cfg = real_load(path)
        cfg = dict(cfg)
        cfg["index_topk"] = 1 << 30
        return t, cfg
    harness.load_dir = dense_load
    try:
        ref, _, _ = harness.reference_logits(d, prompt + gen[:-1])
    finally:
        harness.load_dir = real_load
    kl = flat.reshape(-1, ref.shape[1])
    return float((np.abs(kl - ref[: kl.shape[0]]).max(axis=1) / np.abs(ref[: kl.shape[0]]).max(axis=1)).max())


def main():
    torch.set_num_threads(2)
    ok = True
    for arch, preset in (("deepseek_v32", "tiny"), ("glm_moe_dsa", "tiny"), ("glm_moe_dsa", "tiny-shared")):
        with tempfile.TemporaryDirectory() as tmp:
            d = os.path.join(tmp, arch)
            p = subprocess.run([harness.KILN, "mkmodel", "--arch", arch, "--preset", preset, "--dtype", "f32", "--seed", "1", d],
                               capture_output=True, text=True)
            if p.returncode != 0:
                print("FAIL %s: mkmodel: %s" % (arch, p.stderr.strip()))
                return 1
            cfg = json.load(open(os.path.join(d, "config.json")))
            # the pool's row: [latent | rope part | indexer key] (kiln inspect --kv --json)
            p = subprocess.run([harness.KILN, "inspect", d, "--kv", "--json"], capture_output=True, text=True)
            kv = json.loads(p.stdout)
            want = (cfg["kv_lora_rank"], cfg["qk_rope_head_dim"], cfg["index_head_dim"])
            got = (kv["dsa_latent"], kv["dsa_rope"], kv["dsa_index_key"])
            if got != want or kv["k_dim"] != sum(want) or kv["v_dim"] != cfg["kv_lora_rank"]:
                print("FAIL %s/%s: kiln inspect --kv row %s (k_dim %d, v_dim %d), expected %s" % (arch, preset, got, kv["k_dim"], kv["v_dim"], want))
                ok = False
            # the compact rows' bytes (SGLang's / vLLM's layout, docs/DSA.md), computed here from the
            # config: latent and key as 1-byte codes + a 4-byte scale per 128, rope in the page dtype
            # (an F32 checkpoint: f32), the key only in layers with their own indexer
            types = cfg.get("indexer_types") or []
            pattern = cfg.get("index_topk_pattern")
            if not types and isinstance(pattern, str):
                types = ["full" if ch == "F" else "shared" for ch in pattern]
            keyed = sum(1 for t in types if t == "full") if types else cfg["num_hidden_layers"]
            r, dr, di = want
            base = r + r // 128 * 4 + dr * 4
            want_bytes = cfg["num_hidden_layers"] * base + keyed * (di + di // 128 * 4)
            if kv["bytes_per_token"] != want_bytes or kv["dsa_row_bytes"] != base + di + di // 128 * 4 or kv["dsa_key_layers"] != keyed:
                print("FAIL %s/%s: kiln inspect --kv: %d bytes per token (row %d, key in %d layers), expected %d (row %d, %d layers)" %
                      (arch, preset, kv["bytes_per_token"], kv["dsa_row_bytes"], kv["dsa_key_layers"], want_bytes, base + di + di // 128 * 4, keyed))
                ok = False
            else:
                print("%s/%s: %d KV bytes per token (%d keyed layers of %d)" % (arch, preset, want_bytes, keyed, cfg["num_hidden_layers"]))
            rng = random.Random(1235)
            prompt = [rng.randrange(cfg["vocab_size"]) for _ in range(64)]
            gap = dense_gap(d, prompt, 32)
            print("%s/%s: dense attention differs from kiln's sparse logits by %.3g relative (must be > 1e-2)" % (arch, preset, gap))
            if gap <= 1e-2:
                print("FAIL %s/%s: the top-%d selection made no difference: the test would not see a wrong selection" %
                      (arch, preset, cfg["index_topk"]))
                ok = False
    return 0 if ok else 1


sys.exit(main())
