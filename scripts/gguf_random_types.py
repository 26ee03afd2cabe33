#!/usr/bin/env python3
"""gguf_random_types.py — a speed-test GGUF: every 2-D weight of IN.gguf (a file kiln convert wrote)
replaced by random blocks of a GGUF block type, metadata and other tensors unchanged.

kiln writes GGUF only as F32 / F16 / BF16 / Q8_0 / Q4_0, and llama.cpp's quantizers are not in this
repository; the decode and prefill speed of a kernel does not depend on the values it reads, so
random blocks (quant bytes uniform, f16 scales small and finite) measure the other types on a real
model shape. The logits of such a file are meaningless: never use it for quality figures.

  python3 scripts/gguf_random_types.py IN.gguf OUT.gguf MIX
MIX: a type name (q2_k, q3_k, q4_k, q5_k, q6_k, iq4_xs, q4_1, q5_0, q5_1, iq4_nl: every 2-D weight),
or q4_k_m / q2_k_mix, llama-quantize's mixes in outline: Q4_K_M = Q6_K for output.weight and the
ffn_down / attn_v of half the layers, Q4_K elsewhere; q2_k_mix = Q6_K output, Q4_K attn_v, Q3_K
ffn_down, Q2_K elsewhere (as llama-quantize's Q2_K). Token embeddings keep their type (a row lookup).
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
import gguf_edit  # noqa: E402

# ggml type ids, block (elements, bytes) and the byte offsets of each block's f16 scales
TYPES = {"q4_1": 3, "q5_0": 6, "q5_1": 7, "q2_k": 10, "q3_k": 11, "q4_k": 12, "q5_k": 13, "q6_k": 14, "iq4_nl": 20, "iq4_xs": 23}
BLOCK = {3: (32, 20), 6: (32, 22), 7: (32, 24), 10: (256, 84), 11: (256, 110), 12: (256, 144), 13: (256, 176), 14: (256, 210),
         20: (32, 18), 23: (256, 136)}
F16_AT = {3: (0, 2), 6: (0,), 7: (0, 2), 10: (80, 82), 11: (108,), 12: (0, 2), 13: (0, 2), 14: (208,), 20: (0,), 23: (0,)}


def pick(mix, name, n_layers):
    if name == "token_embd.weight":
        return None
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    if mix == "q4_k_m":
        if name == "output.weight":
            return TYPES["q6_k"]
        if ("ffn_down" in name or "attn_v" in name) and (layer < n_layers // 8 or layer >= 7 * n_layers // 8 or layer % 2 == 0):
            return TYPES["q6_k"]
        return TYPES["q4_k"]
    if mix == "q2_k_mix":
        if name == "output.weight":
            return TYPES["q6_k"]
        if "attn_v" in name:
            return TYPES["q4_k"]
        if "ffn_down" in name:
            return TYPES["q3_k"]
        return TYPES["q2_k"]
    return TYPES[mix]


def main():
    if len(sys.argv) != 4 or not (sys.argv[3] in TYPES or sys.argv[3] in ("q4_k_m", "q2_k_mix")):
        sys.exit(__doc__)
    src, dst, mix = sys.argv[1:]
    kv, tensors = gguf_edit.load(src)
    n_layers = 1 + max(int(n.split(".")[1]) for n, _, _, _ in tensors if n.startswith("blk."))
    rng = np.random.default_rng(1)
    out = []
    for name, ne, gt, data in tensors:
        t = pick(mix, name, n_layers) if len(ne) == 2 else None
        if t is None or ne[0] % BLOCK[t][0]:
            out.append((name, ne, gt, data))
            continue
        n_blocks = ne[0] * ne[1] // BLOCK[t][0]
        raw = rng.integers(0, 256, size=(n_blocks, BLOCK[t][1]), dtype=np.uint8)
        for o in F16_AT[t]:
            raw[:, o:o + 2] = np.full(n_blocks, 1e-3, dtype=np.float16).view(np.uint8).reshape(n_blocks, 2)
        out.append((name, ne, t, raw.tobytes()))
    gguf_edit.save(dst, kv, out)


if __name__ == "__main__":
    main()
