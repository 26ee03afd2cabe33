"""Independent reference for the MLA + MoE family, written from transformers'
modeling_deepseek_v3.py (DeepseekV3ForCausalLM; also what Kimi K2's remote code and
GLM-4.7-Flash's Glm4MoeLite use): the expanded (non-absorbed) attention
  q = q_b_proj(q_a_layernorm(q_a_proj x)) or q_proj x, split [nope | rope]
  [c | k_rot] = kv_a_proj_with_mqa x;  [k_nope | v] = kv_b_proj(kv_a_layernorm(c)) per head
  rope (rope_interleave: interleave then rotate_half) with YaRN cos/sin scaling
  scaling = qk_head_dim^-0.5 × yarn_get_mscale(factor, mscale_all_dim)²
and DeepseekV3MoE routing. q_a_layernorm / kv_a_layernorm use the RMSNorm default eps 1e-6.
A kimi_k25 config is read through text_config with tensors under "language_model.".
deepseek_v32 / glm_moe_dsa add DeepSeek sparse attention: ref_dsa.py (the official inference code's
indexer and FP8 steps); GLM-5's q_a / kv_a norms use rms_norm_eps as vLLM and SGLang do."""
import torch

import ref_dsa
from ref_common import (causal_attention, cos_sin, default_inv_freq, kv_round, linear, moe_block, moe_layers, rms_norm, rotate_half,
                        swiglu_mlp, yarn_get_mscale, yarn_inv_freq)


def _interleave(x):
    """apply_rotary_pos_emb_interleave's reordering: view(..., d/2, 2).transpose → [evens, odds]."""
    *lead, d = x.shape
    return x.view(*lead, d // 2, 2).transpose(-1, -2).reshape(*lead, d)


def _deinterleave(x):
    """Inverse of _interleave: [evens, odds] → adjacent pairs (the order an engine rotating adjacent
    pairs in place stores k_pe in)."""
    *lead, d = x.shape
    return x.view(*lead, 2, d // 2).transpose(-1, -2).reshape(*lead, d)


def deepseek_forward(t, cfg, ids, stats, x0=None, layers=None, final=("model.norm.weight", "lm_head"), return_hidden=False):
    """x0 / layers / final: run the given layers from the input rows x0 (instead of the embeddings)
    and finish with the given norm and head, as an MTP layer does (ref_mtp.py); return_hidden also
    returns the last layer's output rows before the final norm."""
    if cfg.get("model_type") == "kimi_k25":
        cfg = cfg["text_config"]
        t = {k[len("language_model."):]: v for k, v in t.items() if k.startswith("language_model.")}
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    eps = cfg["rms_norm_eps"]
    ql, r = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    dn, dr, dv = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    T = len(ids)
    rp = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rp.get("rope_theta", 10000.0))
    rs = cfg.get("rope_scaling") or (rp if rp.get("rope_type", "default") != "default" else None)
    scaling = (dn + dr) ** -0.5
    if rs is not None and (rs.get("type") or rs.get("rope_type")) == "yarn":
        inv_freq, att_factor = yarn_inv_freq(theta, dr, rs, cfg.get("max_position_embeddings", 4096))
        if rs.get("mscale_all_dim", 0):
            m = yarn_get_mscale(rs["factor"], rs["mscale_all_dim"])
            scaling = scaling * m * m
    else:
        inv_freq, att_factor = default_inv_freq(theta, dr), 1.0
    cos, sin = cos_sin(inv_freq, T, att_factor)
    interleave = cfg.get("rope_interleave", True)

    def rope_(x):
        if interleave:
            x = _interleave(x)
        return x * cos + rotate_half(x) * sin

    sparse = moe_layers(cfg)
    dsa = "index_topk" in cfg
    glm_dsa = cfg.get("model_type") == "glm_moe_dsa"
    lora_eps = eps if glm_dsa else 1e-6
    full = ref_dsa.full_layers(cfg) if dsa else None
    mask = None
    x = t["model.embed_tokens.weight"][torch.tensor(ids)] if x0 is None else x0
    for l in (range(cfg["num_hidden_layers"]) if layers is None else layers):
        p = "model.layers.%d." % l
        a = "model.layers.%d.self_attn." % l
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        if ql is None:
            q = linear(h, t, a + "q_proj")
        else:
            qr = rms_norm(linear(h, t, a + "q_a_proj"), t[a + "q_a_layernorm.weight"], lora_eps)
            q = linear(qr, t, a + "q_b_proj")
        q = q.view(T, H, dn + dr).transpose(0, 1)
        q_pass, q_rot = torch.split(q, [dn, dr], dim=-1)
        ckv = linear(h, t, a + "kv_a_proj_with_mqa")
        k_pass, k_rot = torch.split(ckv, [r, dr], dim=-1)
        c = rms_norm(k_pass, t[a + "kv_a_layernorm.weight"], lora_eps)
        kidx = None
        if dsa:
            c_pre = c
            c = ref_dsa.act_quant_roundtrip(c)  # the official code's FP8 latent
            k_pre = kidx = None
            if full[l]:  # a "shared" layer keeps the previous full layer's selection and caches no key
                k_pre = ref_dsa.indexer_key_pre(t, a, cfg, h, cos[:, : dr // 2], sin[:, : dr // 2], glm_dsa)
                kidx = ref_dsa.act_quant_roundtrip(k_pre)
            ref_dsa.PRE[l] = (c_pre, k_pre)  # what the checker of a kiln KV dump compares the stored FP8 values with
            kidx_row = kidx if kidx is not None else torch.zeros(T, cfg["index_head_dim"])
        q_rot, k_rot = rope_(q_rot), rope_(k_rot.view(1, T, dr))
        # what an engine caches: the latent row [c, k_rot] (one KV head); round it like the cache does
        store = _deinterleave if interleave else (lambda z: z)
        load = _interleave if interleave else (lambda z: z)
        # the cached row: [c, k_rot] (and the indexer key under DSA, as kiln's pool stores it)
        parts = (c.view(1, T, r), store(k_rot)) + ((kidx_row.view(1, T, -1),) if dsa else ())
        lat = kv_round(torch.cat(parts, dim=-1), l, "k")
        c, k_rot = lat[0, :, :r], load(lat[:, :, r:r + dr])
        if dsa and full[l]:
            mask = ref_dsa.indexer_mask(t, a, cfg, h, qr, cos[:, : dr // 2], sin[:, : dr // 2], glm_dsa, lat[0, :, r + dr:])
        kv = linear(c, t, a + "kv_b_proj").view(T, H, dn + dv).transpose(0, 1)
        k_pass, v = torch.split(kv, [dn, dv], dim=-1)
        k_rot = k_rot.expand(H, T, dr)
        qs, ks = torch.cat((q_pass, q_rot), dim=-1), torch.cat((k_pass, k_rot), dim=-1)
        o = (ref_dsa.masked_attention(qs, ks, v, scaling, mask) if dsa else causal_attention(qs, ks, v, scaling))
        o = o.transpose(0, 1).reshape(T, H * dv)
        x = x + linear(o, t, a + "o_proj")
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        x = x + (moe_block(h, t, p + "mlp.", cfg, stats) if (sparse[l] if l < len(sparse) else p + "mlp.gate.weight" in t) else swiglu_mlp(h, t, p + "mlp."))
    hidden = x
    x = rms_norm(x, t[final[0]], eps)
    out = linear(x, t, final[1])
    return (out, hidden) if return_hidden else out
