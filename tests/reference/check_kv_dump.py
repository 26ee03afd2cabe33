"""Checks kiln runs with a quantized KV cache against the reference (driver: tests/models/test_arch_kv_quant.c).

Usage: check_kv_dump.py DIR...  Each DIR holds the checkpoint plus kv_meta.json, kv_tokens.i32 (prompt + generated), kv_logits.f32
(kiln's logits of every evaluated position) and kv_dump.f32 (the cache as stored, dequantized:
[layer][position][kv head][K row (k_dim), V row (v_dim) unless V shares K]).
  (a) every stored value must be the reference's own pre-rounding value rounded to nearest even
      (FP8 E4M3 with the static scale of kv_scales.json: fp8(x × (1/s)) × s; BF16), allowing for
      float32 noise in x of 1e-5 × the row's largest magnitude (a value that close to a rounding
      midpoint may round either way);
  (b) the reference fed exactly the stored rows must reproduce kiln's logits within 1e-3 relative
      error (max |kiln − ref| / max |ref| per row) and its greedy tokens.
DeepSeek sparse attention rows ([latent c | k_pe | indexer key], docs/DSA.md; kv "f32" or "bf16"):
the c and indexer-key parts hold the model's own FP8 rounding (act_quant: a power-of-two scale per
128 values), checked like (a) against the reference's pre-rounding values (ref_dsa.PRE), k_pe like
any cached value, and the key part of a "shared" layer must be zeros."""
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402
import ref_dsa  # noqa: E402
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
    elif kind == "f32":  # no rounding: a stored value is right within the float noise alone
        delta = NOISE * np.abs(pre).max(axis=1, keepdims=True)
        return pre.size, 0, int((np.abs(got - pre) > delta).sum())
    else:
        x, g = pre, got
        rnd = round_bf16
    delta = NOISE * np.abs(x).max(axis=1, keepdims=True)
    lo, hi = rnd((x - delta).astype(np.float32)), rnd((x + delta).astype(np.float32))
    tol = 1e-6 * np.abs(g) if kind == "fp8" else 0  # got × (1/s) need not land exactly on the grid
    exact = np.abs(g - rnd(x)) <= tol
    ok = (g >= lo - tol) & (g <= hi + tol)
    return pre.size, int((~exact & ok).sum()), int((~ok).sum())


def check_act_quant(pre, got):
    """pre, got [T, n] (n a multiple of 128): got must be act_quant's rounding of some x' within
    NOISE × max|row| of pre, under the block's power-of-two scale (or the neighbouring scale when the
    block's amax sits within that noise of a power of two). Returns (#values, #other way, #wrong)."""
    T, n = pre.shape
    x = pre.reshape(T, n // 128, 128).astype(np.float32)
    g = got.reshape(T, n // 128, 128).astype(np.float32)
    delta = NOISE * np.abs(pre).max(axis=1).reshape(T, 1, 1)
    amax = np.abs(x).max(axis=2, keepdims=True)
    exact = np.zeros(x.shape, bool)
    ok = np.zeros(x.shape, bool)
    for f in (1.0 - NOISE, 1.0, 1.0 + NOISE):
        s = ref_dsa.pow2_scale((amax * np.float32(f)).ravel()).reshape(amax.shape)
        lo, hi = fp8_round((x - delta) / s) * s, fp8_round((x + delta) / s) * s
        ok |= (g >= lo) & (g <= hi)
        if f == 1.0:
            exact = g == fp8_round(x / s) * s
    return x.size, int((~exact & ok).sum()), int((~ok).sum())


def main(d):
    with open(os.path.join(d, "kv_meta.json")) as f:
        meta = json.load(f)
    T, V, L, H = meta["tokens"], meta["vocab"], meta["n_layers"], meta["n_kv_heads"]
    kd, vd, shared = meta["k_dim"], meta["v_dim"], meta["v_shares_k"]
    kind, arch = meta["kv"], meta["arch"]
    if meta.get("device", "cpu") != "cpu":
        arch = "%s on %s" % (arch, meta["device"])
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
    with open(os.path.join(d, "config.json")) as f:
        cfg = json.load(f)
    if "index_topk" in cfg:  # DSA row: [c (r) | k_pe (dr) | indexer key (d)]
        r, dr = cfg["kv_lora_rank"], cfg["qk_rope_head_dim"]
        for l in range(L):
            c_pre, k_pre = ref_dsa.PRE[l]
            row = dump[l, :, 0, :]
            for a, fl, bd in (check_act_quant(c_pre.numpy(), row[:, :r]),
                              check_rounding(KvMode.pre[(l, "k")].numpy()[0, :, r:r + dr].astype(np.float32), row[:, r:r + dr], kind, None),
                              check_act_quant(k_pre.numpy(), row[:, r + dr:]) if k_pre is not None
                              else (row[:, r + dr:].size, 0, int(np.count_nonzero(row[:, r + dr:])))):
                n_all += a
                n_flip += fl
                n_bad += bd
        layers = []
    else:
        layers = range(L)
    for l in layers:
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
