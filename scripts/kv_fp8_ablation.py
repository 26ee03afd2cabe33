#!/usr/bin/python3
"""FP8 (E4M3) K-cache ablation on stories260K in numpy (docs/QUALITY.md, "FP8 KV cache").

A float64 re-implementation of the llama2.c forward pass (the same one tests/models/test_kv_fp8.py
checks kiln against) whose K and V rows go through a chosen storage rule before attention. For
each rule it prints, against the same model with a BF16 cache:
  * teacher-forced mean / max KL(P_bf16 || P_rule) and top-1 agreement over a text in windows of
    512 tokens (BOS + 511 text tokens each), as `kiln bench --kv-context 512 --quality FILE` does;
  * the first step at which the 200-token greedy run from BOS differs from BF16's, and BF16's
    top-two logit gap at that step.
Scales: "builtin" = the first 256 tokens of kiln's built-in calibration text (kv_model.c),
"calibrate" = the whole text, as `kiln calibrate --data FILE` does (windows of the model's context).
Rule: scale = amax × 2 / 448 per (layer, KV head) of what is quantized (after smoothing/rotation).

Rules (all keep exactly one byte per value, no per-token scale bytes):
  nosmooth   K: fp8(k / s)                             (kiln calibrate --no-smooth)
  smooth     K: fp8((k − μ) / s), μ = mean of post-RoPE K per channel   (kiln's default)
  rotK       smooth, then a normalized Walsh–Hadamard rotation over head_dim: fp8(H(k − μ) / s);
             the query is rotated by the same H (q·k = Hq·Hk)
  rotKV      rotK, and V stored as fp8(Hv / s), attention output un-rotated by Hᵀ
  qaware     smooth, and each K row rounded (floor or ceil per element on the E4M3 grid, all
             2^head_dim choices) to minimize eᵀ E[q qᵀ] e, E[q qᵀ] from the calibration queries
  prerope    μ taken over K *before* RoPE and subtracted after rotating it to the row's position:
             fp8((k − R(pos) μ) / s); attention must add q·R(pos) μ back per position (not
             softmax-invariant, unlike smooth) — an extra head_dim-long dot product per score.
  prerope_qaware  prerope, and the residual rounded as in qaware
V is always fp8(v / s) except in rotKV.

usage: KILN=build/x/kiln SHARED=../shared [DATA=FILE] [MAX_TOKENS=N] [SCALES=builtin,calibrate] \
           /usr/bin/python3 scripts/kv_fp8_ablation.py [RULE ...]
(about 40 s on one core for all rules on the TinyStories sample.)
"""
import itertools
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "reference"))
from llama2c_np import load_llama2c  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
KILN = os.environ.get("KILN") or os.path.join(HERE, "..", "kiln")
SHARED = os.environ.get("SHARED") or os.path.join(HERE, "..", "..", "shared")
MODEL = os.path.join(SHARED, "models", "stories260K")
DATA = os.environ.get("DATA") or os.path.join(SHARED, "data", "more", "tinystories_sample.txt")
RULES = ["nosmooth", "smooth", "rotK", "rotKV", "qaware", "prerope", "prerope_qaware"]


def load(path):
    return load_llama2c(path)


# E4M3 "fn": non-negative codes 0x00..0x7E, value grid ascending
G = np.array([(c & 7) / 8 * 2.0 ** -6 if (c >> 3) == 0 else (1 + (c & 7) / 8) * 2.0 ** ((c >> 3) - 7) for c in range(0x7F)])
GS = np.concatenate([-G[::-1], G[1:]])  # signed grid


def fp8(x):
    """E4M3 round to nearest, ties to the even code, saturating at 448."""
    a = np.minimum(np.abs(x.astype(np.float64)), 448.0)
    i = np.clip(np.searchsorted(G, a), 1, len(G) - 1)
    lo, hi = G[i - 1], G[i]
    up = (hi - a < a - lo) | ((hi - a == a - lo) & ((i - 1) % 2 == 1))
    r = np.where(a <= 0, 0.0, np.where(up, hi, lo))
    return (np.sign(x) * r).astype(np.float32)


def bf16(x):
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    return ((((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16).astype(np.uint32)).view(np.float32)


def hadamard(n):
    h = np.array([[1.0]])
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(n)


class Model:
    def __init__(self, m):
        self.m = m
        self.L, self.H, self.KV, self.hs, self.dim = m["L"], m["H"], m["KV"], m["hs"], m["dim"]
        i = np.arange(0, self.dim, 2)
        self.freq = 1.0 / 10000.0 ** ((i % self.hs) / self.hs)

    def rope(self, x, pos):  # llama2.c: pairs (2i, 2i+1); x [n, d], pos [n]
        a = pos[:, None] * self.freq[None, :x.shape[1] // 2]
        c, s = np.cos(a), np.sin(a)
        y = x.copy()
        y[:, 0::2] = x[:, 0::2] * c - x[:, 1::2] * s
        y[:, 1::2] = x[:, 0::2] * s + x[:, 1::2] * c
        return y

    @staticmethod
    def rms(x, w):
        return w * (x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-5))

    def forward(self, toks, rule, pos0=0, cache=None, hook=None):
        """Logits [n, vocab] of toks at positions pos0.. ; rule.k / rule.v(layer, rows [n, KV, hs], pos)
        return the dequantized rows attention sees. cache: per-layer lists of stored rows (greedy)."""
        m, L, H, KV, hs = self.m, self.L, self.H, self.KV, self.hs
        n = len(toks)
        pos = np.arange(pos0, pos0 + n)
        x = m["emb"][toks].copy()
        for l in range(L):
            xb = self.rms(x, m["ra"][l])
            kraw = xb @ m["wk"][l].T
            q, k, v = self.rope(xb @ m["wq"][l].T, pos), self.rope(kraw, pos), xb @ m["wv"][l].T
            k = k.reshape(n, KV, hs).astype(np.float32)
            v = v.reshape(n, KV, hs).astype(np.float32)
            if hook:
                hook(l, q, kraw, k, v, pos)
            Kd, Vd = rule.k(l, k, pos), rule.v(l, v)
            if cache is not None:
                cache[l][0].append(Kd)
                cache[l][1].append(Vd)
                Kd, Vd = np.concatenate(cache[l][0]), np.concatenate(cache[l][1])
            mask = np.arange(Kd.shape[0])[None, :] > pos[:, None]
            att = np.zeros((n, self.dim))
            for h in range(H):
                g = h // (H // KV)
                sc = (q[:, h * hs:(h + 1) * hs] @ Kd[:, g].T) / np.sqrt(hs)
                sc[mask] = -np.inf
                p = np.exp(sc - sc.max(1, keepdims=True))
                att[:, h * hs:(h + 1) * hs] = (p / p.sum(1, keepdims=True)) @ Vd[:, g]
            x = x + att @ m["wo"][l].T
            xb = self.rms(x, m["rf"][l])
            h1, h3 = xb @ m["w1"][l].T, xb @ m["w3"][l].T
            x = x + (h1 / (1 + np.exp(-h1)) * h3) @ m["w2"][l].T
        return self.rms(x, m["rfin"]) @ m["wcls"].T

    def greedy(self, rule, n=200):
        cache = [([], []) for _ in range(self.L)]
        tok, out, lgs = 1, [], []
        for p in range(n):
            lg = self.forward([tok], rule, p, cache)[0]
            lgs.append(lg)
            tok = int(np.argmax(lg))
            out.append(tok)
        return out, np.array(lgs)


class Stats:
    """Calibration statistics over F32-cache forward passes (windows of the context)."""

    def __init__(self, md, toks, window=512):
        L, KV, hs = md.L, md.KV, md.hs
        self.k, self.kraw, self.v, self.pos = [[] for _ in range(L)], [[] for _ in range(L)], [[] for _ in range(L)], []
        self.C = np.zeros((L, KV, hs, hs))

        def hook(l, q, kraw, k, v, pos):
            self.k[l].append(k)
            self.kraw[l].append(kraw)
            self.v[l].append(v)
            if l == 0:
                self.pos.append(pos)
            for h in range(md.H):
                qh = q[:, h * hs:(h + 1) * hs]
                self.C[l, h // (md.H // KV)] += qh.T @ qh

        for i in range(0, len(toks), window):
            md.forward(toks[i:i + window], Exact(), hook=hook)
        self.k = [np.concatenate(a) for a in self.k]
        self.kraw = [np.concatenate(a) for a in self.kraw]
        self.v = [np.concatenate(a) for a in self.v]
        self.pos = np.concatenate(self.pos)
        self.C /= len(self.pos)


class Exact:
    def k(self, l, k, pos):
        return k

    def v(self, l, v):
        return v


class BF16(Exact):
    def k(self, l, k, pos):
        return bf16(k)

    def v(self, l, v):
        return bf16(v)


class FP8(Exact):
    def __init__(self, md, st, name, margin=2.0):
        self.md, self.name = md, name
        L, KV, hs = md.L, md.KV, md.hs
        self.R = hadamard(hs) if name in ("rotK", "rotKV") else np.eye(hs)
        self.RV = hadamard(hs) if name == "rotKV" else np.eye(hs)
        self.mu = np.zeros((L, KV, hs), np.float32)
        self.mu_raw = np.zeros((L, KV * hs))
        self.ks, self.vs = np.zeros((L, KV), np.float32), np.zeros((L, KV), np.float32)
        self.C = st.C
        for l in range(L):
            if name.startswith("prerope"):
                self.mu_raw[l] = st.kraw[l].mean(0)
                kc = st.k[l] - self.pos_mean(l, st.pos)
            else:
                if name != "nosmooth":
                    self.mu[l] = st.k[l].mean(0)
                kc = (st.k[l] - self.mu[l]) @ self.R.T
            self.ks[l] = np.abs(kc).max((0, 2)) * margin / 448
            self.vs[l] = np.abs(st.v[l] @ self.RV.T).max((0, 2)) * margin / 448
        self.combos = np.array(list(itertools.product([0, 1], repeat=hs)), bool) if name.endswith("qaware") else None

    def pos_mean(self, l, pos):
        n = len(pos)
        return self.md.rope(np.repeat(self.mu_raw[l][None], n, 0), pos).reshape(n, self.md.KV, self.md.hs).astype(np.float32)

    def k(self, l, k, pos):
        s = self.ks[l][None, :, None]
        if self.name.startswith("prerope"):
            # stored: fp8((k − R(pos)μ)/s); attention adds q·R(pos)μ back (exact)
            off = self.pos_mean(l, pos)
            x = (k - off) * (np.float32(1) / s)
        else:
            off = self.mu[l][None]
            x = ((k - off) @ self.R.T).astype(np.float32) * (np.float32(1) / s)
        if self.name.endswith("qaware"):
            q = np.zeros_like(x, dtype=np.float64)
            for g in range(self.md.KV):
                xg = np.clip(x[:, g].astype(np.float64), -448, 448)
                i = np.clip(np.searchsorted(GS, xg), 1, len(GS) - 1)
                cand = np.where(self.combos[None], GS[i][:, None, :], GS[i - 1][:, None, :])
                e = cand - xg[:, None, :]
                cost = np.einsum("nci,ij,ncj->nc", e, self.C[l, g] * float(self.ks[l][g]) ** 2, e)
                q[:, g] = cand[np.arange(len(xg)), cost.argmin(1)]
            d = q * s
        else:
            d = fp8(x) * s
        return d @ self.R + off

    def v(self, l, v):
        s = self.vs[l][None, :, None]
        return (fp8(((v @ self.RV.T).astype(np.float32)) * (np.float32(1) / s)) * s) @ self.RV


def tokenize(path, max_tokens=0):
    """path's tokens as `kiln bench --quality` takes them: bytes as they are (CRLF kept), no special
    tokens parsed, BOS first, at most max_tokens (0 = all) from the first max_tokens × 16 + 4096 bytes."""
    with open(path, "rb") as f:
        text = f.read(max_tokens * 16 + 4096 if max_tokens else -1)
    r = subprocess.run([KILN, "tokenize", MODEL, "--json", "--no-special", "-"], input=text, capture_output=True, check=True)
    ids = json.loads(r.stdout)["ids"]
    return ids[:max_tokens] if max_tokens else ids


def builtin_text():
    import re
    src = open(os.path.join(HERE, "..", "src", "kv", "kv_model.c")).read()
    body = re.search(r"builtin_text\[\] =\n(.*?);\n", src, re.S).group(1)
    return "".join(re.findall(r'"((?:[^"\\]|\\.)*)"', body)).encode().decode("unicode_escape")


def lsm(x):
    x = x - x.max(1, keepdims=True)
    return x - np.log(np.exp(x).sum(1, keepdims=True))


def main():
    rules = sys.argv[1:] or RULES
    md = Model(load(os.path.join(MODEL, "stories260K.bin")))
    data = tokenize(DATA, int(os.environ.get("MAX_TOKENS", "0")))
    r = subprocess.run([KILN, "tokenize", MODEL, "--json", "--no-special", "-"], input=builtin_text().encode(), capture_output=True, check=True)
    builtin = json.loads(r.stdout)["ids"][:256]
    scales = os.environ.get("SCALES", "builtin,calibrate").split(",")
    start = 1 if data[0] == 1 else 0
    wins = [[1] + data[p:p + 511] for p in range(start, len(data) - 1, 511)]
    ref = [md.forward(w, BF16()) for w in wins]
    gref, glref = md.greedy(BF16())
    print("%d positions of %s; reference: BF16 KV" % (sum(map(len, wins)), os.path.basename(DATA)))
    print("%-10s %-15s %9s %8s %8s  %s" % ("scales", "K rule", "mean KL", "max KL", "top-1", "200-token greedy vs BF16"))
    for sname, stoks in (("builtin", builtin), ("calibrate", data)):
        if sname not in scales:
            continue
        st = Stats(md, stoks)
        for name in rules:
            rule = FP8(md, st, name)
            kl, ag = [], []
            for w, rl in zip(wins, ref):
                a, b = lsm(rl), lsm(md.forward(w, rule))
                kl.append((np.exp(a) * (a - b)).sum(1))
                ag.append(a.argmax(1) == b.argmax(1))
            kl, ag = np.concatenate(kl), np.concatenate(ag)
            g, _ = md.greedy(rule)
            d = next((i for i in range(len(g)) if g[i] != gref[i]), len(g))
            gs = "identical" if d == len(g) else "first differs at step %d (BF16 top-2 gap %.3f)" % (d, np.diff(np.sort(glref[d])[-2:])[0])
            print("%-10s %-15s %9.4f %8.3f %7.2f%%  %s" % (sname, name, kl.mean(), kl.max(), 100 * ag.mean(), gs), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
