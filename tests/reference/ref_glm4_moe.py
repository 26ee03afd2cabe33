"""Independent reference for GLM-4.5 / 4.6 / 4.7 (transformers' modeling_glm4_moe.py,
Glm4MoeForCausalLM): GQA with q/k/v biases, optional per-head q/k RMSNorm before RoPE, partial
rotary in the rotate_half layout, dense MLP for the first first_k_dense_replace layers, then
sigmoid-routed MoE with e_score_correction_bias, group-limited top-k and shared experts.
MTP layers (index >= num_hidden_layers) are ignored, as Glm4MoeModel does."""
import torch

from ref_common import (causal_attention, cos_sin, default_inv_freq, kv_round, linear, moe_block, moe_layers, rms_norm, rotate_half,
                        swiglu_mlp)


def glm4_moe_forward(t, cfg, ids, stats, x0=None, layers=None, final=("model.norm.weight", "lm_head"), return_hidden=False):
    """x0 / layers / final: run the given layers from the input rows x0 (instead of the embeddings)
    and finish with the given norm and head, as an MTP layer does (ref_mtp.py); return_hidden also
    returns the last layer's output rows before the final norm."""
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim") or D // H
    eps = cfg["rms_norm_eps"]
    bias = cfg.get("attention_bias", False)
    T = len(ids)
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
    cos, sin = cos_sin(default_inv_freq(theta, int(hd * partial)), T)
    rd = cos.shape[-1]

    def rope_(x):
        x_rot, x_pass = x[..., :rd], x[..., rd:]
        return torch.cat([x_rot * cos + rotate_half(x_rot) * sin, x_pass], dim=-1)

    sparse = moe_layers(cfg)
    x = t["model.embed_tokens.weight"][torch.tensor(ids)] if x0 is None else x0
    for l in (range(cfg["num_hidden_layers"]) if layers is None else layers):
        p = "model.layers.%d." % l
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        q = linear(h, t, p + "self_attn.q_proj", bias).view(T, H, hd)
        k = linear(h, t, p + "self_attn.k_proj", bias).view(T, KV, hd)
        v = linear(h, t, p + "self_attn.v_proj", bias).view(T, KV, hd)
        if cfg.get("use_qk_norm", False):
            q = rms_norm(q, t[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, t[p + "self_attn.k_norm.weight"], eps)
        q, k, v = rope_(q.transpose(0, 1)), rope_(k.transpose(0, 1)), v.transpose(0, 1)
        k, v = kv_round(k, l, "k"), kv_round(v, l, "v")
        a = causal_attention(q, k, v, hd ** -0.5).transpose(0, 1).reshape(T, H * hd)
        x = x + linear(a, t, p + "self_attn.o_proj")
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        x = x + (moe_block(h, t, p + "mlp.", cfg, stats) if (sparse[l] if l < len(sparse) else p + "mlp.gate.weight" in t) else swiglu_mlp(h, t, p + "mlp."))
    hidden = x
    x = rms_norm(x, t[final[0]], eps)
    out = linear(x, t, final[1])
    return (out, hidden) if return_hidden else out
