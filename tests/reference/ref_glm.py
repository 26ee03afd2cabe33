"""Independent references for the dense GLM-4 architectures, written from the official code:
  glm4     transformers' modeling_glm4.py (Glm4ForCausalLM)
  chatglm  THUDM glm-4-9b modeling_chatglm.py (ChatGLMModel, original_rope)
forward(ids) returns float32 logits [T, vocab] of a full causal pass (no cache)."""
import torch
import torch.nn.functional as F

from ref_common import causal_attention, cos_sin, default_inv_freq, kv_round, linear, rms_norm


def _glm4_rotate_half(x):
    """modeling_glm4.rotate_half: interleaved pairs."""
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def _glm4_apply_rope(x, cos, sin):
    """modeling_glm4.apply_rotary_pos_emb for one tensor [H, T, hd]."""
    cos = cos[..., : cos.shape[-1] // 2].repeat_interleave(2, dim=-1)
    sin = sin[..., : sin.shape[-1] // 2].repeat_interleave(2, dim=-1)
    rd = cos.shape[-1]
    x_rot, x_pass = x[..., :rd], x[..., rd:]
    return torch.cat([x_rot * cos + _glm4_rotate_half(x_rot) * sin, x_pass], dim=-1)


def glm4_forward(t, cfg, ids):
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim") or D // H
    eps = cfg["rms_norm_eps"]
    bias = cfg.get("attention_bias", True)
    T = len(ids)
    rope = cfg.get("rope_parameters") or {}
    theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
    partial = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
    cos, sin = cos_sin(default_inv_freq(theta, int(hd * partial)), T)
    x = t["model.embed_tokens.weight"][torch.tensor(ids)]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        res = x
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        q = linear(h, t, p + "self_attn.q_proj", bias).view(T, H, hd).transpose(0, 1)
        k = linear(h, t, p + "self_attn.k_proj", bias).view(T, KV, hd).transpose(0, 1)
        v = linear(h, t, p + "self_attn.v_proj", bias).view(T, KV, hd).transpose(0, 1)
        q, k = _glm4_apply_rope(q, cos, sin), _glm4_apply_rope(k, cos, sin)
        k, v = kv_round(k, l, "k"), kv_round(v, l, "v")
        a = causal_attention(q, k, v, hd ** -0.5).transpose(0, 1).reshape(T, H * hd)
        h = linear(a, t, p + "self_attn.o_proj")
        h = rms_norm(h, t[p + "post_self_attn_layernorm.weight"], eps)
        x = res + h
        res = x
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        gate, up = linear(h, t, p + "mlp.gate_up_proj").chunk(2, dim=-1)
        h = linear(up * F.silu(gate), t, p + "mlp.down_proj")
        h = rms_norm(h, t[p + "post_mlp_layernorm.weight"], eps)
        x = res + h
    x = rms_norm(x, t["model.norm.weight"], eps)
    return linear(x, t, "lm_head")


def _chatglm_rope(x, cache):
    """modeling_chatglm.apply_rotary_pos_emb; x [T, np, hn], cache [T, rot/2, 2]."""
    T, npp = x.shape[0], x.shape[1]
    rot_dim = cache.shape[-2] * 2
    x, x_pass = x[..., :rot_dim], x[..., rot_dim:]
    xs = x.reshape(T, npp, rot_dim // 2, 2)
    c = cache.view(T, 1, rot_dim // 2, 2)
    out = torch.stack([xs[..., 0] * c[..., 0] - xs[..., 1] * c[..., 1], xs[..., 1] * c[..., 0] + xs[..., 0] * c[..., 1]], -1)
    return torch.cat((out.flatten(2), x_pass), dim=-1)


def chatglm_forward(t, cfg, ids):
    D, H = cfg["hidden_size"], cfg["num_attention_heads"]
    hn = cfg.get("kv_channels") or D // H
    G = cfg["multi_query_group_num"] if cfg.get("multi_query_attention") else H
    eps = cfg["layernorm_epsilon"]
    L = cfg.get("num_layers", cfg.get("num_hidden_layers"))
    T = len(ids)
    # RotaryEmbedding(kv_channels // 2, rope_ratio).forward_impl: theta over n_elem = dim
    n_elem = hn // 2
    base = 10000 * cfg.get("rope_ratio", 1)
    theta = 1.0 / (base ** (torch.arange(0, n_elem, 2, dtype=torch.float) / n_elem))
    idx_theta = torch.outer(torch.arange(T, dtype=torch.float), theta).float()
    cache = torch.stack([torch.cos(idx_theta), torch.sin(idx_theta)], dim=-1)
    x = t["transformer.embedding.word_embeddings.weight"][torch.tensor(ids)]
    for l in range(L):
        p = "transformer.encoder.layers.%d." % l
        h = rms_norm(x, t[p + "input_layernorm.weight"], eps)
        qkv = linear(h, t, p + "self_attention.query_key_value", cfg.get("add_qkv_bias", False))
        q, k, v = qkv.split([H * hn, G * hn, G * hn], dim=-1)
        q, k, v = q.view(T, H, hn), k.view(T, G, hn), v.view(T, G, hn)
        q, k = _chatglm_rope(q, cache), _chatglm_rope(k, cache)
        k, v = kv_round(k.transpose(0, 1), l, "k"), kv_round(v.transpose(0, 1), l, "v")
        a = causal_attention(q.transpose(0, 1), k, v, hn ** -0.5)
        a = linear(a.transpose(0, 1).reshape(T, H * hn), t, p + "self_attention.dense")
        x = x + a
        h = rms_norm(x, t[p + "post_attention_layernorm.weight"], eps)
        i = linear(h, t, p + "mlp.dense_h_to_4h")
        g, u = torch.chunk(i, 2, dim=-1)
        x = x + linear(F.silu(g) * u, t, p + "mlp.dense_4h_to_h")
    x = rms_norm(x, t["transformer.encoder.final_layernorm.weight"], eps)
    return linear(x, t, "transformer.output_layer")
