"""Independent reference of the MTP (multi-token prediction) layer as vLLM's DeepSeekMTP and SGLang
run it (DeepSeek-V3, GLM-4.5+, GLM-4.7-Flash): for the target's last-layer hidden state h_j (before
the final norm) and the token t_{j+1},
    x_j = eh_proj([enorm(embed(t_{j+1})) | hnorm(h_j)])   (the embedding zeroed at position 0)
    x = decoder layer N (= num_hidden_layers) over the positions j, its own causal attention
    logits_j = shared_head.head(shared_head.norm(x_j))     (predicts t_{j+2})
A chained step appends the row (x_{L-1}, draft) at position L. Uses the layer code of
ref_deepseek.py / ref_glm4_moe.py (the same decoder layer as the target's)."""
import torch

import ref_deepseek
import ref_glm4_moe
from ref_common import MoeStats, linear, rms_norm
from st_reader import load_dir


def mtp_draft_logits(d, prompt, nxt, drafts):
    """Logits of each MTP draft step after `prompt` (target positions 0..L-1) and the chosen token
    `nxt`: step 0 uses the real pairs, step i the previous step's output row and drafts[i-1]."""
    t, cfg = load_dir(d)
    fwd = ref_glm4_moe.glm4_moe_forward if cfg["model_type"] == "glm4_moe" else ref_deepseek.deepseek_forward
    N, eps = cfg["num_hidden_layers"], cfg["rms_norm_eps"]
    p = "model.layers.%d." % N
    head = p + "shared_head.head" if p + "shared_head.head.weight" in t else "lm_head"
    emb = t[p + "embed_tokens.weight"] if p + "embed_tokens.weight" in t else t["model.embed_tokens.weight"]
    stats = MoeStats()
    with torch.no_grad():
        _, h = fwd(t, cfg, prompt, stats, return_hidden=True)
        L = len(prompt)
        toks = list(prompt[1:]) + [nxt]
        rows = []
        hs = h
        out = []
        for step in range(len(drafts) + 1):
            e = emb[torch.tensor(toks)].clone()
            e[0] = 0.0  # position 0: vLLM masks the embedding
            x0 = linear(torch.cat([rms_norm(e, t[p + "enorm.weight"], eps), rms_norm(hs, t[p + "hnorm.weight"], eps)], dim=-1), t, p + "eh_proj")
            logits, hm = fwd(t, cfg, list(range(len(toks))), stats, x0=x0, layers=[N], final=(p + "shared_head.norm.weight", head), return_hidden=True)
            out.append(logits[-1])
            if step < len(drafts):  # chain: the next row is (this step's output, its draft) at position L + step
                toks = toks + [drafts[step]]
                hs = torch.cat([hs, hm[-1:]], dim=0)
    del rows, L
    return torch.stack(out).numpy()
