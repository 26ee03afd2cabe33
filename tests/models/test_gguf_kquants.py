"""GGUF block quants as llama.cpp writes them: the K-quants Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS
(super-blocks of 256) and Q4_1, Q5_0, Q5_1, IQ4_NL (blocks of 32).

- Per type, a llama GGUF whose every 2-D tensor (embeddings and head included; the head and the
  embeddings have an odd row count, 301) is random blocks of that type loads in kiln, and kiln's
  dequantization (read back through `kiln convert` to an F32 safetensors directory) equals, bit
  for bit, an independent NumPy dequantizer written here from the block definitions of
  ggml-common.h (block_q2_K ... block_iq4_xs, the kvalues_iq4nl levels) and the arithmetic of
  ggml's dequantize_row_* (float32, each product and difference rounded on its own).
- A mixed file (every type above at least once, as llama-quantize's mixes hold several) runs and
  gives the logits of its F32 read-back; so does a Q4_K_M-like mix.
- Bad input is refused naming the tensor: rows that are not a multiple of the block (256 / 32); a
  ggml type id that ggml does not have (with the id); a ggml type kiln does not read (IQ2_XXS,
  TQ1_0: with the type's name); Q8_K (ggml's activation-side type) as a weight."""
import json, os, shutil, struct, sys, tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
import gguf_edit  # noqa: E402
from kiln_cli import run  # noqa: E402

F32 = np.float32
# ggml type ids (ggml.h)
Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K, IQ2_XXS, IQ4_NL, IQ4_XS, TQ1_0 = 3, 6, 7, 10, 11, 12, 13, 14, 15, 16, 20, 23, 34
NAMES = {Q4_1: "Q4_1", Q5_0: "Q5_0", Q5_1: "Q5_1", Q2_K: "Q2_K", Q3_K: "Q3_K", Q4_K: "Q4_K", Q5_K: "Q5_K", Q6_K: "Q6_K",
         IQ4_NL: "IQ4_NL", IQ4_XS: "IQ4_XS"}
# (weights per block, bytes per block) from ggml-common.h's structs
BLOCK = {Q2_K: (256, 84), Q3_K: (256, 110), Q4_K: (256, 144), Q5_K: (256, 176), Q6_K: (256, 210), IQ4_XS: (256, 136),
         Q4_1: (32, 20), Q5_0: (32, 22), Q5_1: (32, 24), IQ4_NL: (32, 18), Q8_K: (256, 292)}
# byte offsets of each block's f16 scale fields (d, and dmin / m where the type has one)
F16_AT = {Q2_K: (80, 82), Q3_K: (108,), Q4_K: (0, 2), Q5_K: (0, 2), Q6_K: (208,), IQ4_XS: (0,), Q4_1: (0, 2), Q5_0: (0,),
          Q5_1: (0, 2), IQ4_NL: (0,)}
TYPES = [Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS, Q4_1, Q5_0, Q5_1, IQ4_NL]
# ggml-common.h's kvalues_iq4nl: the 16 levels of IQ4_NL / IQ4_XS
IQ4_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], dtype=F32)
VOCAB, DIM, HEADS, KV_HEADS = 301, 256, 4, 2


def random_blocks(rng, t, n_blocks):
    """n_blocks random blocks of type t: random quant / scale bytes; the f16 scales small and finite
    (d positive; a Q4_1 / Q5_1 min either sign)."""
    raw = rng.integers(0, 256, size=(n_blocks, BLOCK[t][1]), dtype=np.uint8)
    for i, o in enumerate(F16_AT[t]):
        v = rng.uniform(1e-4, 2e-3, size=n_blocks)
        if i == 1 and t in (Q4_1, Q5_1):
            v = v * rng.choice([-1.0, 1.0], size=n_blocks)
        raw[:, o:o + 2] = v.astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    return raw


def f16(raw, o):
    """The f16 at byte o of every block, as float32 [n]."""
    return raw[:, o:o + 2].copy().view(np.float16).astype(F32)[:, 0]


def scale_min(j, s):
    """ggml get_scale_min_k4 for sub-block j of the 12 packed bytes s (arrays over blocks)."""
    s = s.astype(np.int32)
    if j < 4:
        return s[:, j] & 63, s[:, j + 4] & 63
    return (s[:, j + 4] & 0xF) | ((s[:, j - 4] >> 6) << 4), (s[:, j + 4] >> 4) | ((s[:, j] >> 6) << 4)


def deq_q2_q3(t, raw):
    """Q2_K / Q3_K. Both keep 2-bit quants in 64 bytes as two halves of 128 weights; in half h,
    weight 32·k + l (k = 0..3, l = 0..31) is bits 2k..2k+1 of byte 32·h + l. Scales per 16 weights.
    Q2_K: block_q2_K {scales[16] (low nibble scale, high nibble min), qs[64], d, dmin}:
      w = (d·sc)·q − dmin·m.
    Q3_K: block_q3_K {hmask[32], qs[64], scales[12], d}: the high bit of weight e is bit e // 32 of
      hmask[e % 32], clear meaning q − 4; 16 six-bit scales, stored + 32: low 4 bits in the low
      nibbles of bytes 0..7 (scales 0..7) then their high nibbles (8..15), top 2 bits in bytes
      8..11 (scale g: byte 8 + g % 4, bits 2·(g // 4)); w = (d·(sc − 32))·q."""
    e = np.arange(256)
    qbyte, shift, g = 32 * (e // 128) + e % 32, 2 * ((e % 128) // 32), e // 16
    if t == Q2_K:
        q = (raw[:, 16 + qbyte].astype(np.int32) >> shift) & 3
        sc = raw[:, g].astype(np.int32)
        d, dmin = f16(raw, 80), f16(raw, 82)
        dl = d[:, None] * (sc & 0xF).astype(F32)
        ml = dmin[:, None] * (sc >> 4).astype(F32)
        return dl * q.astype(F32) - ml
    q = (raw[:, 32 + qbyte].astype(np.int32) >> shift) & 3
    high = (raw[:, e % 32].astype(np.int32) >> (e // 32)) & 1
    q = q - 4 * (1 - high)
    s = raw[:, 96:108].astype(np.int32)
    sc = np.zeros((raw.shape[0], 16), dtype=np.int32)
    for gg in range(16):
        low4 = s[:, gg] & 0xF if gg < 8 else s[:, gg - 8] >> 4
        top2 = (s[:, 8 + gg % 4] >> (2 * (gg // 4))) & 3
        sc[:, gg] = (low4 | (top2 << 4)) - 32
    dl = f16(raw, 108)[:, None] * sc.astype(F32)
    return dl[:, g] * q.astype(F32)


def deq_iq4_xs(raw):
    """block_iq4_xs {d, scales_h (u16), scales_l[4], qs[128]}: 8 sub-blocks of 32, sub-block j's
    6-bit scale = nibble j of scales_l (low nibble first) | bits 2j..2j+1 of scales_h << 4, stored
    + 32; its 16 bytes qs[16j..]: weight i < 16 the low nibble of byte i, weight 16 + i the high one;
    w = (d·(sc − 32))·kvalues_iq4nl[q]."""
    n = raw.shape[0]
    d = f16(raw, 0)
    sh = raw[:, 2].astype(np.int32) | (raw[:, 3].astype(np.int32) << 8)
    y = np.zeros((n, 256), dtype=F32)
    for j in range(8):
        ls = ((raw[:, 4 + j // 2].astype(np.int32) >> (4 * (j % 2))) & 0xF) | (((sh >> (2 * j)) & 3) << 4)
        dl = d * (ls - 32).astype(F32)
        qs = raw[:, 8 + 16 * j:8 + 16 * j + 16]
        y[:, 32 * j:32 * j + 16] = dl[:, None] * IQ4_LEVELS[qs & 0xF]
        y[:, 32 * j + 16:32 * j + 32] = dl[:, None] * IQ4_LEVELS[qs >> 4]
    return y


def deq_32(t, raw):
    """The blocks of 32. Quant nibbles: weight i < 16 is the low nibble of qs[i], weight 16 + i the
    high nibble; Q5_0 / Q5_1's fifth bit of weight i is bit i of qh read as a little-endian u32.
      block_q4_1 {d, m, qs[16]}: w = q·d + m
      block_q5_0 {d, qh[4], qs[16]}: w = (q − 16)·d
      block_q5_1 {d, m, qh[4], qs[16]}: w = q·d + m
      block_iq4_nl {d, qs[16]}: w = d·kvalues_iq4nl[q]"""
    qs_at = {Q4_1: 4, Q5_0: 6, Q5_1: 8, IQ4_NL: 2}[t]
    qs = raw[:, qs_at:qs_at + 16].astype(np.int64)
    q = np.concatenate([qs & 0xF, qs >> 4], axis=1)
    d = f16(raw, 0)[:, None]
    if t == IQ4_NL:
        return d * IQ4_LEVELS[q]
    if t in (Q5_0, Q5_1):
        o = 2 if t == Q5_0 else 4
        qh = raw[:, o:o + 4].copy().view("<u4").astype(np.int64)
        q = q | (((qh >> np.arange(32)) & 1) << 4)
    if t == Q5_0:
        return (q - 16).astype(F32) * d
    return q.astype(F32) * d + f16(raw, 2)[:, None]


def deq_q456(t, raw):
    """Q4_K / Q5_K / Q6_K (block_q4_K / _q5_K / _q6_K)."""
    n = raw.shape[0]
    y = np.zeros((n, 256), dtype=F32)
    if t == Q6_K:
        ql, qh, sc = raw[:, :128].astype(np.int32), raw[:, 128:192].astype(np.int32), raw[:, 192:208].view(np.int8).astype(F32)
        d = f16(raw, 208)
        for half in range(2):
            L, H, S = ql[:, 64 * half:64 * half + 64], qh[:, 32 * half:32 * half + 32], sc[:, 8 * half:8 * half + 8]
            for l in range(32):
                is_ = l // 16
                qs = [(L[:, l] & 0xF) | (((H[:, l] >> 0) & 3) << 4), (L[:, l + 32] & 0xF) | (((H[:, l] >> 2) & 3) << 4),
                      (L[:, l] >> 4) | (((H[:, l] >> 4) & 3) << 4), (L[:, l + 32] >> 4) | (((H[:, l] >> 6) & 3) << 4)]
                for k in range(4):
                    y[:, 128 * half + l + 32 * k] = (d * S[:, is_ + 2 * k]).astype(F32) * (qs[k] - 32).astype(F32)
        return y
    d, dmin = f16(raw, 0), f16(raw, 2)
    sc6 = raw[:, 4:16]
    five = t == Q5_K
    qh = raw[:, 16:48].astype(np.int32)
    ql = raw[:, 48:176].astype(np.int32) if five else raw[:, 16:144].astype(np.int32)
    for g in range(4):
        j = 64 * g
        s1, m1 = scale_min(2 * g, sc6)
        s2, m2 = scale_min(2 * g + 1, sc6)
        d1, mm1 = (d * s1).astype(F32), (dmin * m1).astype(F32)
        d2, mm2 = (d * s2).astype(F32), (dmin * m2).astype(F32)
        q = ql[:, 32 * g:32 * g + 32]
        lo, hi = q & 0xF, q >> 4
        if five:
            lo = lo + np.where(qh & (1 << (2 * g)), 16, 0)
            hi = hi + np.where(qh & (2 << (2 * g)), 16, 0)
        y[:, j:j + 32] = (d1[:, None] * lo.astype(F32)).astype(F32) - mm1[:, None]
        y[:, j + 32:j + 64] = (d2[:, None] * hi.astype(F32)).astype(F32) - mm2[:, None]
    return y


def dequant(t, raw):
    """raw [n_blocks, bytes] → float32 [n_blocks, block weights]."""
    if t in (Q2_K, Q3_K):
        y = deq_q2_q3(t, raw)
    elif t == IQ4_XS:
        y = deq_iq4_xs(raw)
    elif t in (Q4_1, Q5_0, Q5_1, IQ4_NL):
        y = deq_32(t, raw)
    else:
        y = deq_q456(t, raw)
    assert y.dtype == F32 and y.shape == (raw.shape[0], BLOCK[t][0]), (t, y.dtype, y.shape)
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


def hf_names(n_layers):
    """GGUF name → (HF name, heads whose rows llama.cpp permuted (Q / K), or 0)."""
    m = {"token_embd.weight": ("model.embed_tokens.weight", 0), "output.weight": ("lm_head.weight", 0)}
    for L in range(n_layers):
        for g, h, heads in (("attn_q", "self_attn.q_proj", HEADS), ("attn_k", "self_attn.k_proj", KV_HEADS), ("attn_v", "self_attn.v_proj", 0),
                            ("attn_output", "self_attn.o_proj", 0), ("ffn_gate", "mlp.gate_proj", 0), ("ffn_up", "mlp.up_proj", 0),
                            ("ffn_down", "mlp.down_proj", 0)):
            m[f"blk.{L}.{g}.weight"] = (f"model.layers.{L}.{h}.weight", heads)
    return m


def llama_cpp_permute(w, heads):
    """llama.cpp's converter stores Q / K rows per head as (pair, half) → (half, pair)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)


def requantize(tensors, rng, pick):
    """Every 2-D tensor replaced by random blocks of type pick(name) (None: kept); returns the new
    tensor list and the NumPy dequantization of each replaced tensor ([rows, cols])."""
    want, out = {}, []
    for name, ne, gt, data in tensors:
        t = pick(name) if len(ne) == 2 else None
        if t is None:
            out.append((name, ne, gt, data))
            continue
        cols, rows = ne
        raw = random_blocks(rng, t, rows * cols // BLOCK[t][0])
        want[name] = dequant(t, raw).reshape(rows, cols)
        out.append((name, ne, t, raw.tobytes()))
    return out, want


def check_bits(tmp, label, kv, tensors, want):
    """Writes the file, reads it back through kiln convert, compares every replaced tensor."""
    path = os.path.join(tmp, f"{label}.gguf")
    gguf_edit.save(path, kv, tensors)
    out = os.path.join(tmp, f"{label}_hf")
    run("convert", path, out)
    got = safetensors(os.path.join(out, "model.safetensors"))
    names = hf_names(2)
    for g, b in want.items():
        h, heads = names[g]
        a = got[h]
        if heads:
            a = llama_cpp_permute(a, heads)
        if a.shape != b.shape or a.view(np.uint32).tolist() != b.view(np.uint32).tolist():
            diff = np.argwhere(a.view(np.uint32) != b.view(np.uint32))[:3] if a.shape == b.shape else a.shape
            sys.exit(f"{label}: {g}: kiln's dequantization differs from the NumPy reference at {diff}"
                     + (f" (kiln {a[tuple(diff[0])]!r}, numpy {b[tuple(diff[0])]!r})" if a.shape == b.shape else ""))
    return path, out


def check_logits(tmp, label, gguf, hf):
    la, lb = os.path.join(tmp, f"{label}_a.f32"), os.path.join(tmp, f"{label}_b.f32")
    # the scalar reference kernels multiply the f32 dequantized weights: the GGUF's logits are its F32
    # read-back's up to f32 rounding (the SIMD kernels' int8 activations: checked apart, main())
    run("run", gguf, "--tokens", "1,5,9,13,200,300", "-n", "1", "--temp", "0", "--isa", "scalar", "--dump-logits", la)
    run("run", hf, "--tokens", "1,5,9,13,200,300", "-n", "1", "--temp", "0", "--dump-logits", lb)
    A, B = np.fromfile(la, dtype=np.float32), np.fromfile(lb, dtype=np.float32)
    assert A.shape == B.shape and A.size > 0 and np.all(np.isfinite(A)), label
    rel = float(np.max(np.abs(A - B)) / (np.max(np.abs(B)) + 1e-30))
    assert rel < 1e-4, f"{label}: GGUF logits differ from its F32 dequantization by {rel:.3g} (relative)"
    return rel


def refused(tmp, label, kv, tensors, *want):
    p = os.path.join(tmp, f"{label}.gguf")
    gguf_edit.save(p, kv, tensors)
    r = run("run", p, "--tokens", "1", "-n", "1", ok=False)
    for w in want:  # a tuple: any of its strings
        assert any(x in r.stderr for x in (w if isinstance(w, tuple) else (w,))), f"{label}: '{w}' not in: {r.stderr}"
    return r.stderr.strip().splitlines()[-1] if r.stderr.strip() else ""


def main():
    tmp = tempfile.mkdtemp(prefix="kiln_kquant_")
    src = os.path.join(tmp, "src")
    run("mkmodel", "--arch", "llama", "--preset", "tiny", "--dim", str(DIM), "--ffn", "512", "--heads", str(HEADS), "--kv-heads",
        str(KV_HEADS), "--vocab", str(VOCAB), "--dtype", "f32", src)
    base = os.path.join(tmp, "f32.gguf")
    run("convert", src, base)
    kv, tensors = gguf_edit.load(base)
    n2d = sum(1 for _, ne, _, _ in tensors if len(ne) == 2)
    assert n2d == 16 and any(ne == [DIM, VOCAB] for _, ne, _, _ in tensors), [(n, ne) for n, ne, _, _ in tensors]
    rng = np.random.default_rng(7)

    # 1. each type alone, in every 2-D tensor (the 301-row embeddings and head included), bit for bit
    for t in TYPES:
        new, want = requantize(tensors, rng, lambda name, t=t: t)
        assert len(want) == n2d
        check_bits(tmp, NAMES[t], kv, new, want)
    print(f"{len(TYPES)} types: {n2d} tensors each (rows 301 / 512 / 256 / 128) bit-exact against NumPy")

    # 2. a file of every type at once runs with the logits of its F32 read-back
    order = [n for n, ne, _, _ in tensors if len(ne) == 2]
    mixed, want = requantize(tensors, rng, lambda name: TYPES[order.index(name) % len(TYPES)])
    assert {t for _, ne, t, _ in mixed if len(ne) == 2} == set(TYPES)
    gguf, hf = check_bits(tmp, "mixed", kv, mixed, want)
    rel_mixed = check_logits(tmp, "mixed", gguf, hf)
    ins = run("inspect", gguf).stdout
    for t in TYPES:
        assert NAMES[t].lower() in ins, f"kiln inspect does not show {NAMES[t]}: {ins}"

    # ... and so does a Q4_K_M-like mix: Q6_K head and down projections, Q5_K values, Q4_K the rest
    def q4km(name):
        return Q6_K if (name == "output.weight" or "ffn_down" in name) else Q5_K if "attn_v" in name else Q4_K
    qm, want = requantize(tensors, rng, q4km)
    gguf, hf = check_bits(tmp, "q4km", kv, qm, want)
    rel_q4km = check_logits(tmp, "q4km", gguf, hf)
    # ... and within the activations' int8 rounding on the SIMD kernels (the default ISA), which
    # quantize each linear layer's input per super-block of 256 (x̂ = q·amax/127): a rounding error
    # uniform on ±amax/254 has variance amax²/(12·127²) ≤ 256·mean(x²)/(12·127²) = 1.3e-3·mean(x²)
    # (amax² ≤ Σ x² over the 256), so each layer's output NMSE grows by at most ~1.3e-3; the logits
    # pass 2 layers × 4 quantized inputs (attention in, o_proj in, gate/up in, down in) + the head's:
    # 9 × 1.3e-3 ≈ 1.2e-2 (errors of independent roundings add in NMSE to first order).
    lc, lb = os.path.join(tmp, "q4km_c.f32"), os.path.join(tmp, "q4km_b.f32")
    run("run", gguf, "--tokens", "1,5,9,13,200,300", "-n", "1", "--temp", "0", "--dump-logits", lc)
    C, B = np.fromfile(lc, dtype=np.float32), np.fromfile(lb, dtype=np.float32)
    assert C.shape == B.shape
    nmse = float(np.sum((C.astype(np.float64) - B) ** 2) / np.sum(B.astype(np.float64) ** 2))
    assert nmse < 1.2e-2, f"K-quant GGUF logits on the int8 kernels: NMSE {nmse:.3g} against the F32 dequantization"

    # 3. bad input, each naming the tensor
    V = "blk.0.attn_v.weight"
    msgs = []
    for t in (Q2_K, Q3_K, Q4_K, IQ4_XS, IQ4_NL, Q5_1):  # rows not a multiple of the block (256, or 32)
        cols = 64 if BLOCK[t][0] == 256 else 48
        bad = [(n, [cols, 4] if n == V else ne, t if n == V else gt, bytes(4 * BLOCK[t][1]) if n == V else d) for n, ne, gt, d in mixed]
        msgs.append(refused(tmp, f"rows_{NAMES[t]}", kv, bad, V, str(BLOCK[t][0])))
    for tid in (4, 31, 42, 1000):  # ids ggml does not have (4, 31: removed; 42, 1000: never were)
        bad = [(n, ne, tid if n == V else gt, d) for n, ne, gt, d in mixed]
        msgs.append(refused(tmp, f"id_{tid}", kv, bad, V, f"ggml type {tid}", "not a type ggml has"))
    for tid, name in ((IQ2_XXS, "IQ2_XXS"), (TQ1_0, "TQ1_0")):  # types ggml has and kiln does not read
        bad = [(n, ne, tid if n == V else gt, d) for n, ne, gt, d in mixed]
        msgs.append(refused(tmp, f"type_{name}", kv, bad, V, name, "kiln does not read"))
    bad = [(n, ne, Q8_K if n == V else gt, bytes(DIM * 128 // 256 * 292) if n == V else d) for n, ne, gt, d in mixed]
    # (found while binding, where the loader has given the tensor its Hugging Face name)
    msgs.append(refused(tmp, "q8_k", kv, bad, (V, "model.layers.0.self_attn.v_proj.weight"), "Q8_K", "activation"))
    print("\n".join("  refused: " + m for m in msgs))
    print(f"mixed file of {len(TYPES)} types: logits within {rel_mixed:.2g} (reference kernels); Q4_K_M-like: {rel_q4km:.2g}, "
          f"NMSE {nmse:.2g} on the int8 kernels (bound 1.2e-2); {len(msgs)} bad inputs refused")
    shutil.rmtree(tmp, ignore_errors=True)  # kept when a check fails, for a look at the files


if __name__ == "__main__":
    main()
