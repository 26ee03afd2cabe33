"""A llama2.c v0 checkpoint (header of 7 int32, then float32 weights) read with numpy into float64
arrays, independently of kiln's loader: the FP8-KV reference (tests/models/test_kv_fp8.py) and the
key-transform ablation (scripts/kv_fp8_ablation.py) both start from it."""
import struct

import numpy as np


def load_llama2c(path):
    b = open(path, "rb").read()
    dim, hid, L, H, KV, V, S = struct.unpack("7i", b[:28])
    shared = V > 0  # a negative vocab size means a separate classifier follows
    V = abs(V)
    w = np.frombuffer(b[28:], dtype=np.float32)
    o = 0

    def take(*sh):
        nonlocal o
        n = int(np.prod(sh))
        a = w[o:o + n].reshape(sh)
        o += n
        return a.astype(np.float64)

    hs = dim // H
    m = dict(dim=dim, L=L, H=H, KV=KV, V=V, S=S, hs=hs)
    m["emb"] = take(V, dim)
    m["ra"] = take(L, dim)
    m["wq"] = take(L, dim, dim)
    m["wk"] = take(L, KV * hs, dim)
    m["wv"] = take(L, KV * hs, dim)
    m["wo"] = take(L, dim, dim)
    m["rf"] = take(L, dim)
    m["w1"] = take(L, hid, dim)
    m["w2"] = take(L, dim, hid)
    m["w3"] = take(L, hid, dim)
    m["rfin"] = take(dim)
    take(S, hs // 2)  # the legacy freq_cis_real / freq_cis_imag tables (RoPE is recomputed)
    take(S, hs // 2)
    m["wcls"] = m["emb"] if shared else take(V, dim)
    return m
