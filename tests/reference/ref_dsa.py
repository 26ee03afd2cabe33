"""Independent reference for DeepSeek sparse attention (DSA: deepseek_v32, glm_moe_dsa), written from
DeepSeek-V3.2's official inference code (deepseek-ai DeepSeek-V3.2-Exp inference/model.py after the
2025-11-17 indexer-RoPE fix, and kernel.py's act_quant / fp8_index) with GLM-5's settings:

  latent  c = act_quant_roundtrip(kv_norm(c))                      (FP8 E4M3, ue8m0 scale per 128)
  indexer q = wq_b(qr) [T, Hi, d], k = k_norm(wk x) [T, d] (LayerNorm, eps 1e-6)
          RoPE over the first qk_rope dims: NEOX halves (DeepSeek-V3.2: "rope in indexer is not
          interleaved") or adjacent pairs kept in place (indexer_rope_interleave: the official
          apply_rotary_emb(interleaved=True))
          q, k = rotate_activation (Hadamard / sqrt(d)), then act_quant (q_fp8, q_scale), (k_fp8, k_scale)
          weights = weights_proj(x) · Hi^-0.5 · q_scale · d^-0.5
          score[m, n] = k_scale[n] · Σ_h relu(q_fp8[m, h] · k_fp8[n]) · weights[m, h];  n > m masked
          selected = topk(min(index_topk, T)) (ties: lower position, as a stable descending sort)
  attention: the causal mask plus -inf at every position that is not selected.
GLM-5.2 indexer_types "shared" layers reuse the previous full layer's selection.

Computed in float32 (the official code runs bf16 activations; the FP8 steps are kept exactly).
The FP8 rounding is ref_common.fp8_round (a search of the E4M3 value table, round half to even)."""
import numpy as np
import torch

from ref_common import fp8_round, linear


def pow2_scale(amax):
    """ue8m0 scale of act_quant: 2^ceil(log2(max(amax, 1e-4) × fp32(1/448))), from the float bits."""
    a = (np.maximum(amax.astype(np.float32), np.float32(1e-4)) * np.float32(1.0 / 448.0)).astype(np.float32)
    bits = a.view(np.uint32)
    e = ((bits >> 23) & 0xFF).astype(np.int64) - 127 + ((bits & 0x7FFFFF) != 0)
    return np.ldexp(np.float32(1.0), e).astype(np.float32)


def act_quant_roundtrip(x):
    """x [..., n] (n a multiple of 128) → fp8(x / s) · s per 128-value block."""
    a = x.numpy().astype(np.float32)
    shp = a.shape
    b = a.reshape(-1, 128)
    s = pow2_scale(np.abs(b).max(axis=1))[:, None]
    q = fp8_round(b / s) * s
    return torch.from_numpy(q.reshape(shp).astype(np.float32))


def hadamard(n):
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def rope_first(x, cos, sin, dr, interleave):
    """Rotates the first dr values of x [T, ..., d] (cos/sin [T, dr/2] per position)."""
    x = x.clone()
    shape = [x.shape[0]] + [1] * (x.dim() - 2) + [dr // 2]
    c, s = cos.view(shape), sin.view(shape)
    if interleave:
        a, b = x[..., 0:dr:2].clone(), x[..., 1:dr:2].clone()
        x[..., 0:dr:2] = a * c - b * s
        x[..., 1:dr:2] = b * c + a * s
    else:
        a, b = x[..., : dr // 2].clone(), x[..., dr // 2: dr].clone()
        x[..., : dr // 2] = a * c - b * s
        x[..., dr // 2: dr] = b * c + a * s
    return x


PRE = {}  # layer → (latent c, indexer key) before their FP8 rounding (k None on shared layers)


def indexer_key_pre(t, a, cfg, h, cos, sin, glm):
    """The indexer key of every position [T, d] right before act_quant: k_norm(wk x), RoPE, Hadamard."""
    d, dr = cfg["index_head_dim"], cfg["qk_rope_head_dim"]
    k = torch.nn.functional.layer_norm(linear(h, t, a + "indexer.wk"), (d,), t[a + "indexer.k_norm.weight"], t[a + "indexer.k_norm.bias"], 1e-6)
    k = rope_first(k, cos, sin, dr, cfg.get("indexer_rope_interleave", glm))
    return k @ (hadamard(d) * d ** -0.5)


def indexer_mask(t, a, cfg, h, qr, cos, sin, glm, k):
    """The additive mask [T, T] (0 = attended) of one full indexer layer at prefix `a` ("model.layers.N.self_attn."),
    given the (FP8-rounded) keys k [T, d] as cached."""
    T = h.shape[0]
    Hi, d, K, dr = cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"], cfg["qk_rope_head_dim"]
    q = rope_first(linear(qr, t, a + "indexer.wq_b").view(T, Hi, d), cos, sin, dr, cfg.get("indexer_rope_interleave", glm))
    q = act_quant_roundtrip(q @ (hadamard(d) * d ** -0.5))
    w = linear(h, t, a + "indexer.weights_proj") * Hi ** -0.5 * d ** -0.5
    # q, k hold fp8 × scale: q·k = (q_fp8·k_fp8)·q_scale·k_scale exactly (power-of-two scales)
    dots = torch.relu(torch.einsum("mhd,nd->mhn", q, k))
    score = torch.einsum("mhn,mh->mn", dots, w)
    score = score + torch.full((T, T), float("-inf")).triu(1)
    order = torch.sort(score, dim=-1, descending=True, stable=True).indices
    mask = torch.full((T, T), float("-inf"))
    for m in range(T):
        mask[m, order[m, : min(K, m + 1)]] = 0.0
    return mask


def masked_attention(q, k, v, scaling, mask):
    """q [H, T, d], k/v [H, T, d(v)]; mask [T, T] additive (already causal)."""
    w = torch.matmul(q, k.transpose(1, 2)) * scaling + mask
    return torch.matmul(torch.softmax(w, dim=-1, dtype=torch.float32), v)


def full_layers(cfg):
    """indexer_types as booleans (True = full), with transformers' defaults."""
    L = cfg["num_hidden_layers"]
    types = cfg.get("indexer_types") or cfg.get("index_topk_pattern")
    if isinstance(types, str):
        return [c == "F" for c in types]
    if types:
        return [x == "full" for x in types]
    freq, off = max(cfg.get("index_topk_freq", 1), 1), cfg.get("index_skip_topk_offset", 2)
    return [max(i - off + 1, 0) % freq == 0 for i in range(L)]
