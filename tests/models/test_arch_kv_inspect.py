"""`kiln inspect --kv --json` reports the KV bytes per token of each architecture.

Kimi K2 shape: 61 layers × one latent row of kv_lora_rank 512 + qk_rope_head_dim 64 = 576 values
→ 70,272 bytes per token in BF16, 35,136 in FP8 (V shares the latent row). The same arithmetic is
checked on every tiny preset: MLA = layers × (kv_lora_rank + qk_rope_head_dim) × bytes,
GQA = layers × 2 × kv_heads × head_dim × bytes, with the shapes read from the written config.json.
Skipped (exit 77) while `inspect --kv` is not implemented."""
import json
import os
import subprocess
import sys
import tempfile

KILN = os.environ.get("KILN") or os.path.join(os.path.dirname(__file__), "..", "..", "kiln")


def token_bytes(obj):
    """First integer under a key that names bytes per token, searched depth-first."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            kl = k.lower()
            if isinstance(v, int) and ("bytes_per_token" in kl or kl in ("token_bytes", "kv_bytes_per_token")):
                return v
        for v in obj.values():
            r = token_bytes(v)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = token_bytes(v)
            if r is not None:
                return r
    return None


def inspect(d, dtype):
    p = subprocess.run([KILN, "inspect", d, "--kv", "--json", "--kv-dtype", dtype], capture_output=True, text=True)
    if p.returncode != 0:
        if "not implemented" in p.stderr:
            print("SKIP: kiln inspect --kv is not implemented yet")
            sys.exit(77)
        raise RuntimeError("inspect --kv failed: " + p.stderr.strip())
    v = token_bytes(json.loads(p.stdout))
    if v is None:
        raise RuntimeError("no bytes-per-token field in: " + p.stdout[:400])
    return v


def expected(cfg, elem):
    L = cfg.get("num_hidden_layers") or cfg.get("num_layers")
    if "kv_lora_rank" in cfg:
        return L * (cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"]) * elem
    if cfg.get("model_type") == "chatglm":
        return L * 2 * cfg["multi_query_group_num"] * cfg["kv_channels"] * elem
    return L * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * elem


def main():
    fails = 0
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, "k2")
        subprocess.run([KILN, "mkmodel", "--arch", "kimi_k2", "--preset", "tiny", "--layers", "61", d], check=True, capture_output=True)
        for dtype, want in (("bf16", 70272), ("fp8", 35136)):
            got = inspect(d, dtype)
            print("kimi_k2 61 layers %s: %d bytes/token (want %d)" % (dtype, got, want))
            fails += got != want
        for arch in ("chatglm", "glm4", "glm4_moe", "deepseek_v3", "kimi_k2", "glm4_moe_lite"):
            d = os.path.join(tmp, arch)
            subprocess.run([KILN, "mkmodel", "--arch", arch, "--preset", "tiny", d], check=True, capture_output=True)
            with open(os.path.join(d, "config.json")) as f:
                cfg = json.load(f)
            for dtype, elem in (("bf16", 2), ("fp8", 1), ("f32", 4)):
                got, want = inspect(d, dtype), expected(cfg, elem)
                print("%s %s: %d bytes/token (want %d)" % (arch, dtype, got, want))
                fails += got != want
    print("FAIL" if fails else "ok")
    return 1 if fails else 0


sys.exit(main())
