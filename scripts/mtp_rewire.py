"""Rewires an F32 or BF16 checkpoint with one MTP layer (DeepSeek-V3 / GLM-5 tensor names) in place so that
speculative decoding with it accepts some drafts and rejects others — the random presets' MTP layers
are almost never right, which leaves the accepting path untested (tests/server/test_server_spec_mtp.sh)
and says nothing about speed (docs/SPECULATIVE.md: `kiln bench --spec mtp` on a rewired checkpoint).

  target: lm_head := the input embedding, every block's o_proj / down_proj (experts included) × alpha:
          the last layer's output is the current token's embedding plus the blocks' (scaled) updates,
          and an embedding's self-similarity is the largest logit unless the updates win — the model
          mostly repeats its last token, and sometimes moves on (how often: alpha);
  MTP layer: o_proj and every down_proj := 0, eh_proj := [0 | I], hnorm := 1, shared_head.norm /
          .head := the model's final norm / lm_head: the layer's output is hnorm(h_j), so its logits
          are the target's own at position j and it drafts the token just chosen again.
usage: mtp_rewire.py MODEL_DIR ALPHA
"""
import json
import os
import struct
import sys

import numpy as np

d, alpha = sys.argv[1], float(sys.argv[2])
cfg = json.load(open(os.path.join(d, "config.json")))
L, dim = cfg["num_hidden_layers"], cfg["hidden_size"]
f = open(os.path.join(d, "model.safetensors"), "r+b")
n = struct.unpack("<Q", f.read(8))[0]
hdr = json.loads(f.read(n))
base = 8 + n


def get(name):
    a, b = hdr[name]["data_offsets"]
    f.seek(base + a)
    raw = f.read(b - a)
    if hdr[name]["dtype"] == "BF16":  # the 16 high bits of an f32
        x = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
    else:
        assert hdr[name]["dtype"] == "F32", name
        x = np.frombuffer(raw, "<f4")
    return x.reshape(hdr[name]["shape"]).copy()


def put(name, arr):
    a, b = hdr[name]["data_offsets"]
    arr = np.ascontiguousarray(arr, np.float32)
    if hdr[name]["dtype"] == "BF16":  # round to nearest even (the values written here: 0, 1, copies of bf16 values, × alpha)
        u = arr.view(np.uint32).astype(np.uint64)
        raw = (((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF).astype("<u2").tobytes()
    else:
        assert hdr[name]["dtype"] == "F32", name
        raw = arr.astype("<f4").tobytes()
    assert len(raw) == b - a, name
    f.seek(base + a)
    f.write(raw)


mtp = "model.layers.%d." % L
for k in hdr:
    if k.startswith("model.layers.") and (k.endswith("o_proj.weight") or k.endswith("down_proj.weight")):
        put(k, np.zeros(hdr[k]["shape"], np.float32) if k.startswith(mtp) else get(k) * alpha)
put("lm_head.weight", get("model.embed_tokens.weight"))
eh = np.zeros((dim, 2 * dim), np.float32)
eh[:, dim:] = np.eye(dim, dtype=np.float32)
put(mtp + "eh_proj.weight", eh)
put(mtp + "hnorm.weight", np.ones(dim, np.float32))
put(mtp + "shared_head.norm.weight", get("model.norm.weight"))
put(mtp + "shared_head.head.weight", get("lm_head.weight"))
f.close()
