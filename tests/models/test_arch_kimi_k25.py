"""The Kimi K2.5 wrapper layout: config.json with model_type "kimi_k25" and the language model's
config under text_config, tensors under "language_model." (vision tensors alongside are ignored).
A tiny kimi_k2 checkpoint is rewritten into that layout; kiln must load it and match the reference
(which reads text_config and strips the prefix itself) like the plain layout."""
import json
import os
import random
import struct
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "reference"))
from harness import KILN, compare  # noqa: E402


def rewrite(src, dst):
    os.makedirs(dst)
    with open(os.path.join(src, "model.safetensors"), "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    new = {}
    for k, v in header.items():
        new[k if k == "__metadata__" else "language_model." + k] = v
    # a vision tensor the text model must ignore: 4 bytes appended to the data region
    end = max(v["data_offsets"][1] for k, v in header.items() if k != "__metadata__")
    new["vision_tower.patch_embed.proj.bias"] = {"dtype": "F32", "shape": [1], "data_offsets": [end, end + 4]}
    h = json.dumps(new).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(os.path.join(dst, "model.safetensors"), "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data[8 + n:] + struct.pack("<f", 0.5))
    with open(os.path.join(src, "config.json")) as f:
        text = json.load(f)
    cfg = {"architectures": ["KimiK25ForConditionalGeneration"], "model_type": "kimi_k25", "text_config": text,
           "vision_config": {"model_type": "moonvit", "hidden_size": 8}}
    with open(os.path.join(dst, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "k2"), os.path.join(tmp, "k25")
        subprocess.run([KILN, "mkmodel", "--arch", "kimi_k2", "--preset", "tiny", "--seed", "7", src], check=True, capture_output=True)
        rewrite(src, dst)
        rng = random.Random(99)
        prompt = [rng.randrange(256) for _ in range(64)]
        return 0 if compare("kimi_k25", dst, prompt, 32, 1e-3, min_experts=8) else 1


sys.exit(main())
