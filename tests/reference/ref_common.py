"""Building blocks shared by the independent PyTorch references (float32, full-sequence, no cache).

Written from the official modeling code (transformers' modeling_glm4.py, modeling_glm4_moe.py,
modeling_deepseek_v3.py, THUDM's modeling_chatglm.py); nothing here is derived from kiln's C code.
"""
import math

import torch
import torch.nn.functional as F


def rms_norm(x, w, eps):
    """RMSNorm as in Glm4RMSNorm / DeepseekV3RMSNorm / chatglm RMSNorm (float32)."""
    var = x.pow(2).mean(-1, keepdim=True)
    return w * (x * torch.rsqrt(var + eps))


def linear(x, t, name, bias=False):
    y = x @ t[name + ".weight"].t()
    if bias:
        y = y + t[name + ".bias"]
    return y


def causal_attention(q, k, v, scaling):
    """Eager attention: q [H, T, d], k/v [KV, T, d(v)] with GQA repeat, causal mask, float32 softmax."""
    H, KV = q.shape[0], k.shape[0]
    if KV != H:
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
    T = q.shape[1]
    w = torch.matmul(q, k.transpose(1, 2)) * scaling
    mask = torch.full((T, T), float("-inf")).triu(1)
    w = torch.softmax(w + mask, dim=-1, dtype=torch.float32)
    return torch.matmul(w, v)  # [H, T, dv]


def swiglu_mlp(x, t, p):
    return linear(F.silu(linear(x, t, p + "gate_proj")) * linear(x, t, p + "up_proj"), t, p + "down_proj")


def default_inv_freq(base, dim):
    """1 / base^(arange(0, dim, 2) / dim) in float32, as _compute_default_rope_parameters."""
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim))


def yarn_get_mscale(scale=1, mscale=1):
    if scale <= 1:
        return 1.0
    return 0.1 * mscale * math.log(scale) + 1.0


def yarn_inv_freq(base, dim, rs, max_pos):
    """_compute_yarn_parameters of transformers' modeling_rope_utils: (inv_freq, attention_factor)."""
    factor = rs["factor"]
    attention_factor = rs.get("attention_factor")
    mscale = rs.get("mscale")
    mscale_all_dim = rs.get("mscale_all_dim")
    orig = rs.get("original_max_position_embeddings") or max_pos
    if attention_factor is None:
        if mscale and mscale_all_dim:
            attention_factor = float(yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim))
        else:
            attention_factor = yarn_get_mscale(factor)
    beta_fast = rs.get("beta_fast") or 32
    beta_slow = rs.get("beta_slow") or 1

    def corr_dim(num_rot):
        return (dim * math.log(orig / (num_rot * 2 * math.pi))) / (2 * math.log(base))

    low = max(math.floor(corr_dim(beta_fast)), 0)
    high = min(math.ceil(corr_dim(beta_slow)), dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    pos_freqs = base ** (torch.arange(0, dim, 2).to(dtype=torch.float) / dim)
    extrap, interp = 1.0 / pos_freqs, 1.0 / (factor * pos_freqs)
    e = 1 - ramp
    return interp * (1 - e) + extrap * e, attention_factor


def cos_sin(inv_freq, T, scaling=1.0):
    """HF rotary embedding forward: emb = cat(freqs, freqs); cos/sin × attention_scaling."""
    pos = torch.arange(T, dtype=torch.float32)
    freqs = torch.outer(pos, inv_freq.float())
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scaling, emb.sin() * scaling


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def moe_route(logits, bias, n_group, topk_group, top_k, norm_topk_prob, routed_scaling_factor):
    """Glm4MoeMoE.route_tokens_to_experts / DeepseekV3TopkRouter (sigmoid, noaux_tc). logits [T, E].
    Returns (topk_indices, topk_weights, n_changed_by_group_limit)."""
    E = logits.shape[-1]
    scores = logits.sigmoid()
    choice = scores + bias
    group_scores = choice.view(-1, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores)
    group_mask.scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, n_group, E // n_group).reshape(-1, E)
    masked = choice.masked_fill(~score_mask.bool(), 0.0)
    idx = torch.topk(masked, k=top_k, dim=-1, sorted=False)[1]
    plain = torch.topk(choice, k=top_k, dim=-1, sorted=False)[1]
    changed = sum(1 for a, b in zip(idx.tolist(), plain.tolist()) if set(a) != set(b))
    w = scores.gather(1, idx)
    if norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return idx, w * routed_scaling_factor, changed


class MoeStats:
    def __init__(self):
        self.experts = set()
        self.tokens = 0
        self.changed = 0


def moe_block(x, t, p, cfg, stats):
    """Routed experts (per-expert loop as DeepseekV3MoE.moe) + shared experts."""
    E = cfg["n_routed_experts"]
    logits = x.float() @ t[p + "gate.weight"].float().t()
    bias = t.get(p + "gate.e_score_correction_bias", torch.zeros(E))
    idx, w, changed = moe_route(logits, bias, cfg.get("n_group", 1), cfg.get("topk_group", 1), cfg["num_experts_per_tok"],
                                cfg.get("norm_topk_prob", True), cfg.get("routed_scaling_factor", 1.0))
    stats.tokens += x.shape[0]
    stats.changed += changed
    out = torch.zeros_like(x)
    for e in range(E):
        tok, slot = torch.where(idx == e)
        if tok.numel() == 0:
            continue
        stats.experts.add((p, e))
        y = swiglu_mlp(x[tok], t, p + "experts.%d." % e)
        out.index_add_(0, tok, y * w[tok, slot].unsqueeze(-1))
    if cfg.get("n_shared_experts", 1):
        out = out + swiglu_mlp(x, t, p + "shared_experts.")
    return out


def moe_layers(cfg):
    L = cfg["num_hidden_layers"]
    if cfg.get("mlp_layer_types"):
        return [k == "sparse" for k in cfg["mlp_layer_types"]]
    fk, freq = cfg["first_k_dense_replace"], cfg.get("moe_layer_freq", 1)
    return [l >= fk and l % freq == 0 for l in range(L)]


# ---- KV cache rounding -----------------------------------------------------------------------------
# The engine stores K/V (MLA: the latent row) in the KV dtype; to compare an engine run with an FP8 or
# BF16 cache, the reference rounds what would be cached exactly the same way:
#   bf16: round to nearest even;  fp8 e4m3 (static scale s per layer and KV head): fp8(x × (1/s)) × s,
#   round to nearest even, saturating at ±448, NaN → 0.
# Also records amax per (layer, KV head) so a test can derive static scales from an F32 pass.
import numpy as np  # noqa: E402

from st_reader import _FP8  # noqa: E402

_FP8_POS = _FP8[:127].astype(np.float32)  # codes 0x00..0x7E: 0 and the finite positive values, ascending


def fp8_round(x):
    a = np.nan_to_num(np.abs(x), nan=0.0).astype(np.float32)
    a = np.minimum(a, np.float32(448.0))
    hi = np.clip(np.searchsorted(_FP8_POS, a, side="left"), 1, 126)
    lo = hi - 1
    vlo, vhi = _FP8_POS[lo], _FP8_POS[hi]
    dlo, dhi = a - vlo, vhi - a
    pick_hi = (dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0))
    r = np.where(pick_hi, vhi, vlo)
    r = np.where(a == vhi, vhi, r)
    return (np.sign(np.nan_to_num(x)) * r).astype(np.float32)


class KvMode:
    dtype = "f32"          # "f32", "bf16" or "fp8"
    k_scale = None         # fp8: [n_layers][n_kv_heads]
    v_scale = None
    amax_k = {}            # layer → [n_kv_heads] running amax
    amax_v = {}
    pre = {}               # (layer, 'k'/'v') → the last values offered to the cache, before rounding
    inject = None          # (layer, 'k'/'v') → [n_kv_heads, T, d] values to use instead (an engine's cache)


def kv_round(x, layer, which):
    """x: [n_kv_heads, T, d] values about to be cached for layer `layer` (which = 'k' or 'v'), in the
    engine's storage order. Returns what the cache would hand back."""
    am = (KvMode.amax_k if which == "k" else KvMode.amax_v)
    cur = x.abs().amax(dim=(1, 2)).tolist()
    prev = am.get(layer, [0.0] * len(cur))
    am[layer] = [max(a, b) for a, b in zip(prev, cur)]
    KvMode.pre[(layer, which)] = x.clone()
    if KvMode.inject is not None:
        return KvMode.inject[(layer, which)][:, :x.shape[1], :].clone()
    if KvMode.dtype == "f32":
        return x
    if KvMode.dtype == "bf16":
        return x.to(torch.bfloat16).to(torch.float32)
    sc = (KvMode.k_scale if which == "k" else KvMode.v_scale)[layer]
    out = torch.empty_like(x)
    for h in range(x.shape[0]):
        s = np.float32(sc[h])
        inv = np.float32(1.0) / s
        q = fp8_round(x[h].numpy().astype(np.float32) * inv)
        out[h] = torch.from_numpy(q * s)
    return out
