"""GGUF files of the GLM / DeepSeek / Kimi families (issue 21): `kiln convert` writes llama.cpp's
`deepseek2` (DeepSeek-V3, Kimi K2, GLM-4.7-Flash), `glm-dsa` (GLM-5.x), `deepseek32` (DeepSeek-V3.2), `glm4moe` (GLM-4.5 / 4.6 /
4.7), `glm4` and `chatglm` files and kiln reads them back.

- Names, metadata keys and ggml shapes are read with the independent npm reader @huggingface/gguf
  (tests/reference/gguf_read.mjs) and compared with the tensor lists written below from llama.cpp's
  loaders (src/models/deepseek2.cpp, glm-dsa.cpp, deepseek32.cpp, glm4-moe.cpp, glm4.cpp, chatglm.cpp: create_tensor shapes in ggml ne order, the
  keys they get_key): the file must hold exactly the tensors llama.cpp creates.
- The converter's layouts, on the bytes with NumPy against the source safetensors: a stacked
  experts tensor is the per-expert matrices one after another; attn_k_b is kv_b_proj's key half
  transposed per head, attn_v_b its value half.
- The GGUF file runs with the logits of the Hugging Face directory it came from: identical for F32
  and BF16 weights; a Q8_0 file (--outtype q8_0) gives the logits of its own dequantized read-back
  (`kiln convert FILE.gguf DIR`), and stays close to the source.
- Bad input: an expert count that disagrees with the stacked tensors, a key of the wrong type,
  softmax gating (DeepSeek-V2), a lone attn_k_b, YaRN that llama.cpp cannot express: refused,
  naming the key or tensor."""
import json, os, shutil, struct, subprocess, sys, tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference"))
import gguf_edit  # noqa: E402
from kiln_cli import run  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
F32, F16, Q8_0, BF16 = 0, 1, 8, 30




def read_gguf(path):
    p = subprocess.run(["node", os.path.join(ROOT, "tests", "reference", "gguf_read.mjs"), path], capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"@huggingface/gguf could not read {path}: {p.stderr}")
    return json.loads(p.stdout)


def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack_from("<Q", b)[0]
    hdr = json.loads(b[8:8 + n])
    out = {}
    for k, v in hdr.items():
        if k == "__metadata__":
            continue
        s, e = v["data_offsets"]
        raw = b[8 + n + s:8 + n + e]
        dt = {"F32": np.float32, "BF16": np.uint16, "F16": np.float16}[v["dtype"]]
        out[k] = (v["dtype"], np.frombuffer(raw, dtype=dt).reshape(v["shape"]))
    return out


def expected_dense(arch, c):
    """glm4 (src/models/glm4.cpp) and chatglm (chatglm.cpp): {name: ne}, {key: value}."""
    if arch == "chatglm":
        D, L, H, hd, kv, ff, V = (c["hidden_size"], c["num_layers"], c["num_attention_heads"], c["kv_channels"], c["multi_query_group_num"],
                                  c["ffn_hidden_size"], c["padded_vocab_size"])
    else:
        D, L, H, hd, kv, ff, V = (c["hidden_size"], c["num_hidden_layers"], c["num_attention_heads"], c["head_dim"], c["num_key_value_heads"],
                                  c["intermediate_size"], c["vocab_size"])
    t = {"token_embd.weight": [D, V], "output_norm.weight": [D], "output.weight": [D, V]}
    for i in range(L):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"], t[b + "ffn_norm.weight"] = [D], [D]
        t[b + "ffn_up.weight"], t[b + "ffn_down.weight"] = [D, 2 * ff], [ff, D]
        if arch == "chatglm":
            t[b + "attn_qkv.weight"], t[b + "attn_output.weight"] = [D, (H + 2 * kv) * hd], [D, D]
            if c.get("add_qkv_bias"):
                t[b + "attn_qkv.bias"] = [(H + 2 * kv) * hd]
        else:
            t[b + "attn_q.weight"], t[b + "attn_k.weight"], t[b + "attn_v.weight"] = [D, hd * H], [D, hd * kv], [D, hd * kv]
            if c.get("attention_bias", True):
                t[b + "attn_q.bias"], t[b + "attn_k.bias"], t[b + "attn_v.bias"] = [hd * H], [hd * kv], [hd * kv]
            t[b + "attn_output.weight"] = [hd * H, D]
            t[b + "post_attention_norm.weight"], t[b + "post_ffw_norm.weight"] = [D], [D]
    rot = hd // 2 if arch == "chatglm" else int(hd * c["partial_rotary_factor"])
    k = {f"{arch}.embedding_length": D, f"{arch}.block_count": L, f"{arch}.feed_forward_length": ff, f"{arch}.attention.head_count": H,
         f"{arch}.attention.head_count_kv": kv, f"{arch}.rope.dimension_count": rot}
    return t, k


def expected_tensors(arch, c):
    """{name: ggml ne} llama.cpp creates for this config (required and present-optional)."""
    if arch in ("glm4", "chatglm"):
        return expected_dense(arch, c)[0]
    D, V, H = c["hidden_size"], c["vocab_size"], c["num_attention_heads"]
    E, fe, ns = c["n_routed_experts"], c["moe_intermediate_size"], c["n_shared_experts"]
    lead, ff = c["first_k_dense_replace"], c["intermediate_size"]
    t = {"token_embd.weight": [D, V], "output_norm.weight": [D], "output.weight": [D, V]}
    L = c["num_hidden_layers"]
    nextn = c.get("num_nextn_predict_layers", 0) if arch in ("glm4moe", "glm-dsa", "deepseek32") else 0
    for i in range(L + nextn):
        b = f"blk.{i}."
        t[b + "attn_norm.weight"] = [D]
        if arch in ("glm-dsa", "deepseek32"):  # glm-dsa: NOT_REQUIRED, present on the "full" layers; deepseek32: every layer
            Hi, d = c["index_n_heads"], c["index_head_dim"]
            t[b + "indexer.k_norm.weight"], t[b + "indexer.k_norm.bias"] = [d], [d]
            t[b + "indexer.proj.weight"], t[b + "indexer.attn_k.weight"] = [D, Hi], [D, d]
            t[b + "indexer.attn_q_b.weight"] = [c["q_lora_rank"], Hi * d]
        if arch in ("deepseek2", "glm-dsa", "deepseek32"):
            r, dr, dn, dv, ql = c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"], c["q_lora_rank"]
            if ql:
                t[b + "attn_q_a_norm.weight"] = [ql]
                t[b + "attn_q_a.weight"] = [D, ql]
                t[b + "attn_q_b.weight"] = [ql, H * (dn + dr)]
            else:
                t[b + "attn_q.weight"] = [D, H * (dn + dr)]
            t[b + "attn_kv_a_norm.weight"] = [r]
            t[b + "attn_kv_a_mqa.weight"] = [D, r + dr]
            t[b + "attn_k_b.weight"] = [dn, r, H]
            t[b + "attn_v_b.weight"] = [r, dv, H]
            t[b + "attn_output.weight"] = [H * dv, D]
            t[b + "ffn_norm.weight"] = [D]
        else:
            hd, kv = c["head_dim"], c["num_key_value_heads"]
            t[b + "attn_q.weight"], t[b + "attn_k.weight"], t[b + "attn_v.weight"] = [D, hd * H], [D, hd * kv], [D, hd * kv]
            if c.get("attention_bias"):
                t[b + "attn_q.bias"], t[b + "attn_k.bias"], t[b + "attn_v.bias"] = [hd * H], [hd * kv], [hd * kv]
            t[b + "attn_output.weight"] = [hd * H, D]
            if c.get("use_qk_norm"):
                t[b + "attn_q_norm.weight"], t[b + "attn_k_norm.weight"] = [hd], [hd]
            t[b + "post_attention_norm.weight"] = [D]
        if i < lead:
            t[b + "ffn_gate.weight"], t[b + "ffn_down.weight"], t[b + "ffn_up.weight"] = [D, ff], [ff, D], [D, ff]
        else:
            t[b + "ffn_gate_inp.weight"] = [D, E]
            t[b + "exp_probs_b.bias"] = [E]
            t[b + "ffn_down_exps.weight"] = [fe, D, E]
            t[b + "ffn_gate_exps.weight"] = [D, fe, E]
            t[b + "ffn_up_exps.weight"] = [D, fe, E]
            if ns:
                t[b + "ffn_gate_shexp.weight"], t[b + "ffn_down_shexp.weight"] = [D, fe * ns], [fe * ns, D]
                t[b + "ffn_up_shexp.weight"] = [D, fe * ns]
        if i >= L:
            t[b + "nextn.eh_proj.weight"] = [2 * D, D]
            t[b + "nextn.enorm.weight"], t[b + "nextn.hnorm.weight"] = [D], [D]
            t[b + "nextn.shared_head_head.weight"], t[b + "nextn.shared_head_norm.weight"] = [D, V], [D]
            t[b + "nextn.embed_tokens.weight"] = [D, V]
    return t


def expected_keys(arch, c):
    if arch in ("glm4", "chatglm"):
        return expected_dense(arch, c)[1]
    a = arch
    k = {f"{a}.embedding_length": c["hidden_size"], f"{a}.feed_forward_length": c["intermediate_size"],
         f"{a}.attention.head_count": c["num_attention_heads"], f"{a}.expert_count": c["n_routed_experts"],
         f"{a}.expert_used_count": c["num_experts_per_tok"], f"{a}.expert_shared_count": c["n_shared_experts"],
         f"{a}.expert_feed_forward_length": c["moe_intermediate_size"], f"{a}.leading_dense_block_count": c["first_k_dense_replace"],
         f"{a}.expert_gating_func": 2, f"{a}.expert_weights_norm": True, f"{a}.context_length": c["max_position_embeddings"]}
    if arch in ("deepseek2", "glm-dsa", "deepseek32"):
        r, dr, dn, dv = c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"], c["v_head_dim"]
        nextn = c["num_nextn_predict_layers"] if arch in ("glm-dsa", "deepseek32") else 0
        k.update({f"{a}.block_count": c["num_hidden_layers"] + nextn, f"{a}.attention.head_count_kv": 1, f"{a}.attention.kv_lora_rank": r,
                  f"{a}.attention.key_length": r + dr, f"{a}.attention.value_length": r, f"{a}.attention.key_length_mla": dn + dr,
                  f"{a}.attention.value_length_mla": dv, f"{a}.rope.dimension_count": dr})
        if c["q_lora_rank"]:
            k[f"{a}.attention.q_lora_rank"] = c["q_lora_rank"]
        if c.get("n_group", 1) > 1 and c["topk_group"] < c["n_group"]:
            k[f"{a}.expert_group_count"], k[f"{a}.expert_group_used_count"] = c["n_group"], c["topk_group"]
        if arch in ("glm-dsa", "deepseek32"):
            k.update({f"{a}.attention.indexer.head_count": c["index_n_heads"], f"{a}.attention.indexer.key_length": c["index_head_dim"],
                      f"{a}.attention.indexer.top_k": c["index_topk"], f"{a}.nextn_predict_layers": nextn})
        if arch == "glm-dsa":  # deepseek32 has no types key (llama.cpp reads none: an indexer on every layer)
            pat = c.get("indexer_types")
            k[f"{a}.attention.indexer.types"] = [1 if x == "full" else 0 for x in pat] if pat else [1] * c["num_hidden_layers"]
        rs = c.get("rope_scaling")
        if rs:
            k[f"{a}.rope.scaling.type"] = "yarn"
            k[f"{a}.rope.scaling.original_context_length"] = rs["original_max_position_embeddings"]
    else:
        hd = c["head_dim"]
        k.update({f"{a}.block_count": c["num_hidden_layers"] + c["num_nextn_predict_layers"], f"{a}.nextn_predict_layers": c["num_nextn_predict_layers"],
                  f"{a}.attention.head_count_kv": c["num_key_value_heads"], f"{a}.attention.key_length": hd,
                  f"{a}.rope.dimension_count": int(hd * c["partial_rotary_factor"])})
    return k


def logits(model, out, backend="cpu"):
    # 40 tokens: past the DSA presets' index_topk of 16, so sparse attention selects a strict subset
    ids = ",".join(str((7 * i + 3) % 250) for i in range(40))
    run("run", model, "--tokens", ids, "-n", "1", "--temp", "0", "--dump-logits", out, "--backend", backend)
    return np.fromfile(out, dtype=np.float32)


def to_f32(dtype, a):
    return (a.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else a.astype(np.float32)


def check_layouts(gg_path, hf_dir, arch, c):
    """Stacked experts and split kv_b, byte for byte against the source safetensors."""
    st = safetensors(os.path.join(hf_dir, "model.safetensors"))
    kv, tensors = gguf_edit.load(gg_path)
    by = {n: (ne, gt, data) for n, ne, gt, data in tensors}
    pre = "language_model." if "language_model.model.embed_tokens.weight" in st else ""
    lay = c["first_k_dense_replace"]  # the first MoE layer
    E = c["n_routed_experts"]
    for p in ("gate", "up", "down"):
        ne, gt, data = by[f"blk.{lay}.ffn_{p}_exps.weight"]
        dt, first = st[f"{pre}model.layers.{lay}.mlp.experts.0.{p}_proj.weight"]
        want = np.concatenate([st[f"{pre}model.layers.{lay}.mlp.experts.{e}.{p}_proj.weight"][1].reshape(-1) for e in range(E)])
        got = np.frombuffer(data[:want.nbytes], dtype=want.dtype)
        assert np.array_equal(got, want), f"blk.{lay}.ffn_{p}_exps.weight is not the {E} experts stacked"
    if arch in ("deepseek2", "glm-dsa", "deepseek32"):
        H, r, dn, dv = c["num_attention_heads"], c["kv_lora_rank"], c["qk_nope_head_dim"], c["v_head_dim"]
        dt, kvb = st[f"{pre}model.layers.0.self_attn.kv_b_proj.weight"]
        kvb = kvb.reshape(H, dn + dv, r)
        ne_k, _, kd = by["blk.0.attn_k_b.weight"]
        ne_v, _, vd = by["blk.0.attn_v_b.weight"]
        k_b = np.frombuffer(kd[:kvb.itemsize * H * r * dn], dtype=kvb.dtype).reshape(H, r, dn)
        v_b = np.frombuffer(vd[:kvb.itemsize * H * dv * r], dtype=kvb.dtype).reshape(H, dv, r)
        assert np.array_equal(k_b, kvb[:, :dn, :].transpose(0, 2, 1)), "attn_k_b is not kv_b's key half transposed per head"
        assert np.array_equal(v_b, kvb[:, dn:, :]), "attn_v_b is not kv_b's value half"


def converter_keeps_f32(name, ndim):
    """llama.cpp's converter (conversion/base.py) writes these F32 whatever the file type: 1-D
    tensors, *_norm.weight, the MoE routers, the DSA indexer's head weights, non-.weight names."""
    if ndim <= 1 or name.endswith("_norm.weight") or not name.endswith(".weight"):
        return True
    return name.endswith((".ffn_gate_inp.weight", ".ffn_gate_inp_shexp.weight", ".indexer.proj.weight"))


def check_float_types(info):
    """A BF16 checkpoint written with the default outtype: F32 where the converter keeps F32 (ggml's
    CPU element-wise ops refuse a BF16 norm: `binary_op: unsupported types`), BF16 elsewhere."""
    for t in info["tensors"]:
        want = F32 if converter_keeps_f32(t["name"], len(t["ne"])) else BF16
        assert t["type"] == want, f"{t['name']} has ggml type {t['type']}, llama.cpp's converter writes {want}"


def check_file(gg, hf_dir, arch, c):
    info = read_gguf(gg)
    md = info["metadata"]
    assert md["general.architecture"] == arch, md["general.architecture"]
    for k, v in expected_keys(arch, c).items():
        assert k in md, f"{gg}: metadata key {k} missing"
        assert md[k] == v, f"{gg}: {k} = {md[k]}, expected {v}"
    want = expected_tensors(arch, c)
    got = {t["name"]: t["ne"] for t in info["tensors"]}
    optional = {n for n in want if ".nextn.embed_tokens" in n or ".nextn.shared_head" in n or ".indexer." in n}
    extra = sorted(set(got) - set(want))
    missing = sorted(set(want) - set(got) - optional)
    assert not extra and not missing, f"{gg}: tensors llama.cpp would not create {extra}; missing {missing}"
    for n, ne in got.items():
        assert ne == want[n], f"{gg}: {n} has ggml shape {ne}, llama.cpp creates {want[n]}"
    return info


def main():
    tmp = tempfile.mkdtemp(prefix="kiln_gguf_arch_")
    cases = [("kimi_k2", "f32", "deepseek2"), ("glm4_moe_lite", "f32", "deepseek2"), ("glm4_moe", "f32", "glm4moe"),
             ("deepseek_v3", "f32", "deepseek2"), ("kimi_k2", "bf16", "deepseek2"), ("glm_moe_dsa", "f32", "glm-dsa"),
             ("glm_moe_dsa:tiny-shared", "f32", "glm-dsa"), ("deepseek_v32", "f32", "deepseek32"), ("glm4", "bf16", "glm4"),
             ("chatglm", "f32", "chatglm")]
    for name, dtype, arch in cases:
        name, _, preset = name.partition(":")
        preset = preset or "tiny"
        d = os.path.join(tmp, f"{name}-{preset}-{dtype}")
        shape = []
        if name == "chatglm":
            # llama.cpp's chatglm needs heads × kv_channels = hidden: the tiny preset (4 × 32 != 64) is refused by name
            run("mkmodel", "--arch", name, "--preset", preset, "--dtype", dtype, d + "-wide")
            p = run("convert", d + "-wide", d + "-wide.gguf", ok=False)
            assert "kv_channels" in p.stderr and "hidden_size" in p.stderr, p.stderr
            shape = ["--head-dim", "16"]
        run("mkmodel", "--arch", name, "--preset", preset, "--dtype", dtype, *shape, d)
        cfg_path = os.path.join(d, "config.json")
        c = json.load(open(cfg_path))
        if name == "deepseek_v3":
            # the tiny preset's YaRN has mscale 1.0 != mscale_all_dim 0.8, which deepseek2 cannot hold:
            # refused by name, then written from the released config's mscale = mscale_all_dim = 1
            p = run("convert", d, os.path.join(tmp, "ds-refused.gguf"), ok=False)
            assert "mscale" in p.stderr and "mscale_all_dim" in p.stderr, p.stderr
            c["rope_scaling"]["mscale_all_dim"] = c["rope_scaling"]["mscale"]
            json.dump(c, open(cfg_path, "w"))
        gg = os.path.join(tmp, f"{name}-{preset}-{dtype}.gguf")
        run("convert", d, gg)
        info = check_file(gg, d, arch, c)
        if dtype == "bf16":
            check_float_types(info)
        if arch not in ("glm4", "chatglm"):
            check_layouts(gg, d, arch, c)
        # A BF16 checkpoint's router and norms are F32 in the GGUF (check_float_types): the same values,
        # but the cpu backend multiplies BF16 weights by activations rounded to BF16 (vdpbf16ps) and
        # F32 ones exactly, so the files are compared on the ref backend, whose kernels read both
        # without rounding the activations.
        be = "ref" if dtype == "bf16" else "cpu"
        a, b = logits(d, gg + ".hf.bin", be), logits(gg, gg + ".gg.bin", be)
        assert a.shape == b.shape and np.array_equal(a, b), f"{name} {dtype}: GGUF logits differ from the HF directory's by {np.abs(a - b).max()}"
        print(f"{name} {preset} ({dtype}) -> {arch}: names, keys, shapes as llama.cpp creates them; layouts exact; logits identical")

    # deepseek32: llama.cpp ropes the indexer NEOX only (the official code since the 2025-11-17 fix)
    d = os.path.join(tmp, "deepseek_v32-tiny-f32")
    c = json.load(open(os.path.join(d, "config.json")))
    c["indexer_rope_interleave"] = True
    bad_dir = d + "-interleaved"
    shutil.copytree(d, bad_dir)
    json.dump(c, open(os.path.join(bad_dir, "config.json"), "w"))
    p = run("convert", bad_dir, bad_dir + ".gguf", ok=False)
    assert "deepseek32" in p.stderr and "NEOX" in p.stderr, p.stderr
    print("refused (deepseek32 with an interleaved indexer RoPE):", p.stderr.strip()[:160])

    # the other q/k/v layout llama.cpp's loaders accept (create_tensor_qkv): glm4 with a fused
    # attn_qkv (split back into row views) and chatglm with separate attn_q / attn_k / attn_v (joined)
    for arch, dtype, fuse in (("glm4", "bf16", True), ("chatglm", "f32", False)):
        c = json.load(open(os.path.join(tmp, f"{arch}-tiny-{dtype}", "config.json")))
        gg = os.path.join(tmp, f"{arch}-tiny-{dtype}.gguf")
        kv, tensors = gguf_edit.load(gg)
        H, kvh = c["num_attention_heads"], c.get("num_key_value_heads", c.get("multi_query_group_num"))
        hd = c.get("head_dim", c.get("kv_channels"))
        out, by = [], {n: (ne, gt, data) for n, ne, gt, data in tensors}
        for n, ne, gt, data in tensors:
            layer, _, rest = n.partition(".")[2].partition(".")
            if fuse and rest in ("attn_q.weight", "attn_q.bias"):
                suf = rest.split(".")[1]
                parts = [by[f"blk.{layer}.attn_{x}.{suf}"] for x in "qkv"]
                ne2 = list(ne[:-1]) + [sum(p[0][-1] for p in parts)]
                out.append((f"blk.{layer}.attn_qkv.{suf}", ne2, gt, b"".join(p[2] for p in parts)))
            elif fuse and rest in ("attn_k.weight", "attn_v.weight", "attn_k.bias", "attn_v.bias"):
                continue
            elif not fuse and rest in ("attn_qkv.weight", "attn_qkv.bias"):
                rows = [H * hd, kvh * hd, kvh * hd]
                per = len(data) // sum(rows)  # bytes per row (weights) or per element (biases)
                off = 0
                for x, r in zip("qkv", rows):
                    out.append((f"blk.{layer}.attn_{x}.{rest.split('.')[1]}", list(ne[:-1]) + [r], gt, data[off:off + per * r]))
                    off += per * r
            else:
                out.append((n, ne, gt, data))
        alt = gg + ".alt.gguf"
        gguf_edit.save(alt, kv, out)
        a, b = logits(gg, gg + ".x.bin"), logits(alt, alt + ".bin")
        assert np.array_equal(a, b), f"{arch}: the {'fused' if fuse else 'separate'} q/k/v layout gives other logits ({np.abs(a - b).max()})"
        print(f"{arch}: {'fused attn_qkv' if fuse else 'separate attn_q/k/v'} reads to the same logits")

    # Q8_0: the GGUF runs with the logits of its own dequantized read-back, near the source. On the
    # ref backend (scalar kernels, f32 activations) exactly; the cpu backend's Q8_0 kernels quantize
    # activations to int8 per block of 32 (llama.cpp's q8_0 dot products), which on this tiny random
    # MoE can move a router decision: their agreement with the ref kernels is tests/kernels' job.
    src = os.path.join(tmp, "kimi_k2-tiny-f32")
    q8 = os.path.join(tmp, "kimi-q8_0.gguf")
    run("convert", src, q8, "--outtype", "q8_0")
    info = check_file(q8, src, "deepseek2", json.load(open(os.path.join(src, "config.json"))))
    types = {t["name"]: t["type"] for t in info["tensors"]}
    assert types["blk.1.ffn_gate_exps.weight"] == Q8_0 and types["blk.0.attn_v_b.weight"] == Q8_0, types
    assert types["blk.1.ffn_gate_inp.weight"] == F32 and types["blk.0.attn_norm.weight"] == F32, "router and norms stay F32 as llama.cpp writes them"
    back = os.path.join(tmp, "kimi-q8_0-back")
    run("convert", q8, back)
    a, b, s = logits(q8, q8 + ".bin", "ref"), logits(back, back + ".bin", "ref"), logits(src, src + ".bin", "ref")
    rel = np.abs(a - b).max() / np.abs(b).max()
    assert rel == 0.0, f"Q8_0 GGUF logits differ from its dequantized read-back by {rel:.3g}"
    # Q8_0 weight noise (~0.4% per weight, 8-bit) through 3 layers: an NMSE of the logits well under
    # 1%; per-position maxima are not used, since a router decision flipped by the noise moves one
    # position's logits a lot in a random tiny MoE
    qerr = float(np.sum((a - s) ** 2) / np.sum(s ** 2))
    assert qerr < 0.01, f"Q8_0 GGUF logits differ from the F32 source with NMSE {qerr:.3g}, more than Q8_0 noise"
    logits(q8, q8 + ".cpu.bin")  # and it runs on the cpu backend's Q8_0 kernels
    print(f"kimi_k2 q8_0: logits = its read-back's (ref backend); NMSE {qerr:.2g} against F32")

    # MLA heads are sized apart from the hidden size: GLM-4.7-Flash has hidden 2,048 over 20 heads,
    # which llama.cpp's converter writes and its deepseek2 loader reads; so must kiln
    d = os.path.join(tmp, "glm4_moe_lite-3heads")
    run("mkmodel", "--arch", "glm4_moe_lite", "--preset", "tiny", "--heads", "3", "--kv-heads", "3", "--dtype", "f32", d)
    c = json.load(open(os.path.join(d, "config.json")))
    assert c["hidden_size"] % c["num_attention_heads"], c
    gg = d + ".gguf"
    run("convert", d, gg)
    a, b = logits(d, gg + ".hf.bin"), logits(gg, gg + ".gg.bin")
    assert np.array_equal(a, b), f"glm4_moe_lite with {c['num_attention_heads']} heads: GGUF logits differ by {np.abs(a - b).max()}"
    print(f"glm4_moe_lite, hidden {c['hidden_size']} over {c['num_attention_heads']} heads -> deepseek2: logits identical")
    # a GQA family takes its head length from embedding_length / head_count only when key_length is absent
    kv, tensors = gguf_edit.load(os.path.join(tmp, "glm4-tiny-bf16.gguf"))
    kv = [x for x in kv if x[0] != "glm4.attention.key_length"]
    gguf_edit.set_kv(kv, "glm4.attention.head_count", gguf_edit.U32, 3)
    p = os.path.join(tmp, "bad-glm4-head-length.gguf")
    gguf_edit.save(p, kv, tensors)
    r = run("run", p, "--tokens", "1", "-n", "1", ok=False)
    assert "glm4.attention.key_length" in r.stderr and "glm4.embedding_length" in r.stderr, r.stderr
    print(f"refused (glm4-head-length): {r.stderr.strip().splitlines()[-1][:160]}")

    # bad input
    base = os.path.join(tmp, "kimi_k2-tiny-f32.gguf")
    kv, tensors = gguf_edit.load(base)

    def bad(edit, expect, label):
        k2, t2 = [list(x) for x in kv], list(tensors)
        k2 = [tuple(x) for x in k2]
        k2, t2 = edit(k2, t2)
        p = os.path.join(tmp, f"bad-{label}.gguf")
        gguf_edit.save(p, k2, t2)
        r = run("run", p, "--tokens", "1", "-n", "1", ok=False)
        for e in expect:
            assert e in r.stderr, f"{label}: error does not name {e!r}: {r.stderr}"
        print(f"refused ({label}): {r.stderr.strip().splitlines()[-1][:160]}")

    bad(lambda k, t: (gguf_edit.set_kv(k, "deepseek2.expert_count", gguf_edit.U32, 16), t), ["blk.1.ffn", "_exps.weight", "deepseek2.expert_count"],
        "expert-count")
    bad(lambda k, t: (gguf_edit.set_kv(k, "deepseek2.embedding_length", gguf_edit.STR, "64"), t), ["deepseek2.embedding_length", "string"],
        "wrong-type")
    bad(lambda k, t: (gguf_edit.set_kv(k, "deepseek2.expert_gating_func", gguf_edit.U32, 1), t), ["deepseek2.expert_gating_func", "softmax"],
        "softmax")
    bad(lambda k, t: ([x for x in k if x[0] != "deepseek2.expert_gating_func"], t), ["deepseek2.expert_gating_func", "default"], "no-gating")
    bad(lambda k, t: (k, [x for x in t if x[0] != "blk.2.attn_v_b.weight"]), ["blk.2.attn_k_b.weight", "blk.2.attn_v_b.weight"], "lone-k_b")
    bad(lambda k, t: (gguf_edit.set_kv(k, "deepseek2.attention.value_length_mla", gguf_edit.U32, 48), t), ["blk.0.attn_v_b.weight", "value_length_mla"],
        "v_b-shape")
    bad(lambda k, t: (gguf_edit.set_kv(k, "deepseek2.rope.scaling.type", gguf_edit.STR, "longrope"), t), ["deepseek2.rope.scaling.type", "longrope"],
        "rope-type")
    bad(lambda k, t: (gguf_edit.set_kv(k, "deepseek2.nextn_predict_layers", gguf_edit.U32, 3), t), ["deepseek2.nextn_predict_layers"], "nextn")
    # glm-dsa: a per-layer indexer type list of the wrong length, and a value that is neither 1 nor 0
    kv, tensors = gguf_edit.load(os.path.join(tmp, "glm_moe_dsa-tiny-shared-f32.gguf"))
    bad(lambda k, t: (gguf_edit.set_kv(k, "glm-dsa.attention.indexer.types", gguf_edit.ARR, (gguf_edit.I32, [1, 0, 1])), t),
        ["glm-dsa.attention.indexer.types", "3 entries", "4 decoder layers"], "dsa-types-length")
    bad(lambda k, t: (gguf_edit.set_kv(k, "glm-dsa.attention.indexer.types", gguf_edit.ARR, (gguf_edit.I32, [1, 0, 2, 1])), t),
        ["glm-dsa.attention.indexer.types[2]", "= 2"], "dsa-types-value")


if __name__ == "__main__":
    main()
