"""GGUF K-quants (Q4_K, Q5_K, Q6_K) as llama.cpp writes them: a llama GGUF whose weights are random
K-quant super-blocks loads in kiln; kiln's dequantization (read back through `kiln convert` to an
F32 safetensors directory) equals, bit for bit, an independent NumPy dequantizer written here from
the block definitions of ggml-common.h (block_q4_K / block_q5_K / block_q6_K) and the arithmetic of
ggml's dequantize_row_*_K (float32, each product and difference rounded on its own); the model
runs and gives the logits of that F32 directory; a K-quant tensor whose rows are not a multiple of
256 is refused naming the tensor."""
import json, os, struct, subprocess, sys, tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gguf_edit  # noqa: E402

KILN = os.environ.get("KILN", "./kiln")
Q4_K, Q5_K, Q6_K = 12, 13, 14
BLOCK_BYTES = {Q4_K: 144, Q5_K: 176, Q6_K: 210}


def run(*args, ok=True):
    p = subprocess.run([KILN, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed: {p.stderr}")
    if not ok and p.returncode == 0:
        sys.exit(f"kiln {' '.join(args)} succeeded but should have failed")
    return p


def random_blocks(rng, t, n_blocks):
    """n_blocks random super-blocks of type t: random quant / scale bytes, small finite f16 scales."""
    raw = rng.integers(0, 256, size=(n_blocks, BLOCK_BYTES[t]), dtype=np.uint8)
    d = rng.uniform(1e-4, 2e-3, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    if t == Q6_K:
        raw[:, 208:210] = d
    else:
        raw[:, 0:2] = d
        raw[:, 2:4] = rng.uniform(1e-4, 2e-3, size=n_blocks).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def scale_min(j, s):
    """ggml get_scale_min_k4 for sub-block j of the 12 packed bytes s (arrays over blocks)."""
    s = s.astype(np.int32)
    if j < 4:
        return s[:, j] & 63, s[:, j + 4] & 63
    return (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4), (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)


def dequant(t, raw):
    """raw [n, bytes] → float32 [n, 256]."""
    n = raw.shape[0]
    y = np.zeros((n, 256), dtype=np.float32)
    if t == Q6_K:
        ql, qh, sc = raw[:, :128].astype(np.int32), raw[:, 128:192].astype(np.int32), raw[:, 192:208].view(np.int8).astype(np.float32)
        d = raw[:, 208:210].copy().view(np.float16).astype(np.float32)[:, 0]
        for half in range(2):
            L, H, S = ql[:, 64 * half:64 * half + 64], qh[:, 32 * half:32 * half + 32], sc[:, 8 * half:8 * half + 8]
            for l in range(32):
                is_ = l // 16
                qs = [(L[:, l] & 0xF) | (((H[:, l] >> 0) & 3) << 4), (L[:, l + 32] & 0xF) | (((H[:, l] >> 2) & 3) << 4),
                      (L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4), (L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)]
                for k in range(4):
                    y[:, 128 * half + l + 32 * k] = (d * S[:, is_ + 2 * k]).astype(np.float32) * (qs[k] - 32).astype(np.float32)
        return y
    d = raw[:, 0:2].copy().view(np.float16).astype(np.float32)[:, 0]
    dmin = raw[:, 2:4].copy().view(np.float16).astype(np.float32)[:, 0]
    sc6 = raw[:, 4:16]
    five = t == Q5_K
    qh = raw[:, 16:48].astype(np.int32)
    ql = raw[:, 48:176].astype(np.int32) if five else raw[:, 16:144].astype(np.int32)
    for g in range(4):
        j = 64 * g
        s1, m1 = scale_min(2 * g, sc6)
        s2, m2 = scale_min(2 * g + 1, sc6)
        d1, mm1 = (d * s1).astype(np.float32), (dmin * m1).astype(np.float32)
        d2, mm2 = (d * s2).astype(np.float32), (dmin * m2).astype(np.float32)
        q = ql[:, 32 * g:32 * g + 32]
        lo, hi = q & 0xF, q >> 4
        if five:
            lo = lo + np.where(qh & (1 << (2 * g)), 16, 0)
            hi = hi + np.where(qh & (2 << (2 * g)), 16, 0)
        y[:, j:j + 32] = (d1[:, None] * lo.astype(np.float32)).astype(np.float32) - mm1[:, None]
        y[:, j + 32:j + 64] = (d2[:, None] * hi.astype(np.float32)).astype(np.float32) - mm2[:, None]
    return y


def safetensors(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    out = {}
    for name, v in h.items():
        if name == "__metadata__":
            continue
        s, e = v["data_offsets"]
        assert v["dtype"] == "F32", (name, v["dtype"])
        out[name] = np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(v["shape"])
    return out


def main():
    tmp = tempfile.mkdtemp(prefix="kiln_kquant_")
    src = os.path.join(tmp, "src")
    run("mkmodel", "--arch", "llama", "--preset", "tiny", "--dim", "256", "--ffn", "512", "--heads", "4", "--kv-heads", "2",
        "--vocab", "300", "--dtype", "f32", src)
    base = os.path.join(tmp, "f32.gguf")
    run("convert", src, base)
    kv, tensors = gguf_edit.load(base)
    rng = np.random.default_rng(7)
    # a mix as llama-quantize writes one: Q6_K head and down projections, Q5_K values, Q4_K the rest
    want = {}
    new_tensors = []
    for name, ne, gt, data in tensors:
        if len(ne) == 2 and name != "token_embd.weight":
            t = Q6_K if (name == "output.weight" or "ffn_down" in name) else Q5_K if "attn_v" in name else Q4_K
            cols, rows = ne
            raw = random_blocks(rng, t, rows * cols // 256)
            want[name] = dequant(t, raw).reshape(rows, cols)
            new_tensors.append((name, ne, t, raw.tobytes()))
        else:
            new_tensors.append((name, ne, gt, data))
    kq = os.path.join(tmp, "kq.gguf")
    gguf_edit.save(kq, kv, new_tensors)
    out = os.path.join(tmp, "hf")
    run("convert", kq, out)
    got = safetensors(os.path.join(out, "model.safetensors"))
    hf_name = {"output.weight": "lm_head.weight"}
    for L in range(2):
        for g, h in (("attn_v", "self_attn.v_proj"), ("attn_output", "self_attn.o_proj"), ("ffn_gate", "mlp.gate_proj"),
                     ("ffn_up", "mlp.up_proj"), ("ffn_down", "mlp.down_proj")):
            hf_name[f"blk.{L}.{g}.weight"] = f"model.layers.{L}.{h}.weight"
    checked = 0
    for g, h in hf_name.items():
        a, b = got[h], want[g]
        if a.shape != b.shape or a.view(np.uint32).tolist() != b.view(np.uint32).tolist():
            diff = np.argwhere(a.view(np.uint32) != b.view(np.uint32))[:3] if a.shape == b.shape else a.shape
            sys.exit(f"{g}: kiln's dequantization differs from the NumPy reference at {diff}")
        checked += 1
    assert checked == 11, checked
    # the K-quant file runs, with the logits of its F32 dequantization: exactly so (up to f32 rounding)
    # on the scalar reference kernels, which multiply the f32 dequantized weights
    la, lb, lc = os.path.join(tmp, "a.f32"), os.path.join(tmp, "b.f32"), os.path.join(tmp, "c.f32")
    run("run", kq, "--tokens", "1,5,9,13", "-n", "1", "--temp", "0", "--isa", "scalar", "--dump-logits", la)
    run("run", out, "--tokens", "1,5,9,13", "-n", "1", "--temp", "0", "--dump-logits", lb)
    A, B = np.fromfile(la, dtype=np.float32), np.fromfile(lb, dtype=np.float32)
    assert A.shape == B.shape and A.size > 0
    rel = float(np.max(np.abs(A - B)) / (np.max(np.abs(B)) + 1e-30))
    assert rel < 1e-4, f"K-quant GGUF logits differ from its F32 dequantization by {rel:.3g} (relative)"
    # ... and within the activations' int8 rounding on the SIMD kernels (the default ISA), which
    # quantize each linear layer's input per super-block of 256 (x̂ = q·amax/127): a rounding error
    # uniform on ±amax/254 has variance amax²/(12·127²) ≤ 256·mean(x²)/(12·127²) = 1.3e-3·mean(x²)
    # (amax² ≤ Σ x² over the 256), so each layer's output NMSE grows by at most ~1.3e-3; the logits
    # pass 2 layers × 4 quantized inputs (attention in, o_proj in, gate/up in, down in) + the head's:
    # 9 × 1.3e-3 ≈ 1.2e-2 (errors of independent roundings add in NMSE to first order).
    run("run", kq, "--tokens", "1,5,9,13", "-n", "1", "--temp", "0", "--dump-logits", lc)
    C = np.fromfile(lc, dtype=np.float32)
    assert C.shape == B.shape
    nmse = float(np.sum((C.astype(np.float64) - B) ** 2) / np.sum(B.astype(np.float64) ** 2))
    assert nmse < 1.2e-2, f"K-quant GGUF logits on the int8 kernels: NMSE {nmse:.3g} against the F32 dequantization"
    # bad input: a K-quant tensor whose rows are not a multiple of 256
    bad = [(n, ne, Q4_K if n == "blk.0.attn_v.weight" else gt, d) for n, ne, gt, d in new_tensors]
    bad = [(n, [64, 4] if n == "blk.0.attn_v.weight" else ne, gt, d[:4 * 144] if n == "blk.0.attn_v.weight" else d) for n, ne, gt, d in bad]
    bp = os.path.join(tmp, "bad.gguf")
    gguf_edit.save(bp, kv, bad)
    p = run("run", bp, "--tokens", "1", "-n", "1", ok=False)
    assert "blk.0.attn_v.weight" in p.stderr or "self_attn.v_proj" in p.stderr, p.stderr
    print(f"K-quants: {checked} tensors bit-exact against NumPy, logits within {rel:.2g} (reference kernels), NMSE {nmse:.2g} "
          f"(int8 kernels, bound 1.2e-2), bad row length refused")


if __name__ == "__main__":
    main()
