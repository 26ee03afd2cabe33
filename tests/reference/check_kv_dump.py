"""Checks kiln runs with a quantized KV cache against the reference (driver: tests/models/test_arch_kv_quant.c).

Usage: check_kv_dump.py DIR...  Each DIR holds the checkpoint plus kv_meta.json, kv_tokens.i32 (prompt + generated), kv_logits.f32
(kiln's logits of every evaluated position) and kv_dump.f32 (the cache as stored, dequantized:
[layer][position][kv head][K row (k_dim), V row (v_dim) unless V shares K]).
  (a) every stored value must be the reference's own pre-rounding value rounded to nearest even
      (FP8 E4M3 with the static scale of kv_scales.json: fp8(x × (1/s)) × s; BF16), allowing for
      float32 noise in x of 1e-5 × the row's largest magnitude (a value that close to a rounding
      midpoint may round either way);
  (b) the reference fed exactly the stored rows must reproduce kiln's logits within 1e-3 relative
      error (max |kiln − ref| / max |ref| per row) and its greedy tokens."""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
from ref_common import KvMode, fp8_round  # noqa: E402

TOL = 1e-3
NOISE = 1e-5  # float32 noise allowance, relative to the largest magnitude of the cached row


def round_bf16(x):
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return (((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)).view(np.float32)


def check_rounding(pre, got, kind, scale):
    """pre, got: float32 [T, d] of one (layer, KV head). A stored value is right when it equals the
    round-to-nearest-even of some x' within NOISE × max|row| of the reference's value x (rounding
    is monotonic, so: RNE(x − δ) <= got <= RNE(x + δ)). Returns (#values, #not exactly RNE(x), #wrong)."""
    if kind == "fp8":
        inv = np.float32(1.0) / np.float32(scale)
        x = pre * inv
        g = got * inv
        rnd = fp8_round
    else:
        x, g = pre, got
        rnd = round_bf16
    delta = NOISE * np.abs(x).max(axis=1, keepdims=True)
    lo, hi = rnd((x - delta).astype(np.float32)), rnd((x + delta).astype(np.float32))
    tol = 1e-6 * np.abs(g) if kind == "fp8" else 0  # got × (1/s) need not land exactly on the grid
    exact = np.abs(g - rnd(x)) <= tol
    ok = (g >= lo - tol) & (g <= hi + tol)
    return pre.size, int((~exact & ok).sum()), int((~ok).sum())


def main(d):
    with open(os.path.join(d, "kv_meta.json")) as f:
        meta = json.load(f)
    T, V, L, H = meta["tokens"], meta["vocab"], meta["n_layers"], meta["n_kv_heads"]
    kd, vd, shared = meta["k_dim"], meta["v_dim"], meta["v_shares_k"]
    kind, arch = meta["kv"], meta["arch"]
    toks = np.fromfile(os.path.join(d, "kv_tokens.i32"), dtype=np.int32).tolist()
    kl = np.fromfile(os.path.join(d, "kv_logits.f32"), dtype=np.float32).reshape(T, V)
    row = kd + (0 if shared else vd)
    dump = np.fromfile(os.path.join(d, "kv_dump.f32"), dtype=np.float32).reshape(L, T, H, row)
    scales = (None, None)
    if kind == "fp8":
        with open(os.path.join(d, meta["scales"])) as f:
            js = json.load(f)
        scales = (js["k_scale"], js["v_scale"])
    ids = toks[:T]
    ref_own, _, _ = harness.reference_logits(d, ids, kind, scales)  # for information: rounding its own K/V
    # the reference fed kiln's stored rows; its pre-rounding values of layer l then see the same
    # earlier layers as kiln did, so (a) compares like with like
    inj = {}
    for l in range(L):
        inj[(l, "k")] = torch.from_numpy(np.ascontiguousarray(dump[l, :, :, :kd].transpose(1, 0, 2)))
        if not shared:
            inj[(l, "v")] = torch.from_numpy(np.ascontiguousarray(dump[l, :, :, kd:kd + vd].transpose(1, 0, 2)))
    KvMode.inject = inj
    try:
        ref, _, _ = harness.reference_logits(d, ids, "f32")
    finally:
        KvMode.inject = None
    n_all = n_flip = n_bad = 0
    for l in range(L):
        for which, lo_, hi_ in (("k", 0, kd), ("v", kd, kd + vd)):
            if which == "v" and shared:
                continue
            pre = KvMode.pre[(l, which)].numpy()  # [H, T, d]
            for h in range(H):
                got = dump[l, :, h, lo_:hi_]
                sc = scales[0 if which == "k" else 1][l][h] if kind == "fp8" else None
                a, fl, bd = check_rounding(pre[h].astype(np.float32), got, kind, sc)
                n_all += a
                n_flip += fl
                n_bad += bd
    print("%s [kv %s]: %d cached values, %d rounded the other way within float noise, %d wrong" %
          (arch, kind, n_all, n_flip, n_bad))
    ok = n_bad == 0
    err = np.abs(kl - ref).max(axis=1) / np.abs(ref).max(axis=1)
    err_own = np.abs(kl - ref_own).max(axis=1) / np.abs(ref_own).max(axis=1)
    print("%s [kv %s]: reference fed kiln's cache: max relative error %.3g (row %d); reference rounding its own K/V: %.3g" %
          (arch, kind, err.max(), int(err.argmax()), err_own.max()))
    if err.max() > TOL:
        print("FAIL %s [kv %s]: relative error %.3g > %g" % (arch, kind, err.max(), TOL))
        ok = False
    n_prompt = T - meta["generated"] + 1
    for j in range(meta["generated"]):
        r = ref[n_prompt - 1 + j]
        tok = toks[n_prompt + j]
        if int(r.argmax()) != tok and r.max() - r[tok] > 1e-4 * max(1.0, abs(r.max())):
            print("FAIL %s [kv %s]: greedy token %d is %d, reference argmax %d" % (arch, kind, j, tok, int(r.argmax())))
            ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    torch.set_num_threads(2)
    sys.exit(1 if sum(main(d) for d in sys.argv[1:]) else 0)
