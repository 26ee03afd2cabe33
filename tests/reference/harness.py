"""Runs kiln on a synthetic checkpoint and compares it with the independent PyTorch reference.

check_arch(arch): `kiln mkmodel --arch ARCH --preset tiny` → `kiln run DIR --tokens <64 ids> -n 32
--temp 0 --dump-logits F` → the reference forward over prompt + generated tokens (teacher forcing:
one causal pass gives every position's logits) → every logits row within `tol` relative error
(max |kiln − ref| / max |ref| per row), and every greedy token equal to the reference argmax.
Environment: KILN (binary), TMPDIR, KILN_DEVICES (the --device values to run kiln on, space-separated;
default "cpu"; scripts/run_tests.sh adds "vulkan" when the build has a Vulkan device). Exit codes follow the test convention (0 pass, 1 fail)."""
import json
import os
import random
import subprocess
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from st_reader import load_dir  # noqa: E402
from ref_common import KvMode, MoeStats  # noqa: E402
import ref_glm  # noqa: E402
import ref_glm4_moe  # noqa: E402
import ref_deepseek  # noqa: E402

KILN = os.environ.get("KILN") or os.path.join(os.path.dirname(__file__), "..", "..", "kiln")


def reference_logits(d, ids, kv="f32", scales=None):
    """Full causal pass; kv = the cache dtype to emulate ("f32", "bf16", "fp8" with static scales)."""
    KvMode.dtype = kv
    KvMode.k_scale, KvMode.v_scale = scales if scales else (None, None)
    KvMode.amax_k, KvMode.amax_v = {}, {}
    t, cfg = load_dir(d)
    mt = cfg["model_type"]
    stats = MoeStats()
    with torch.no_grad():
        if mt == "glm4":
            out = ref_glm.glm4_forward(t, cfg, ids)
        elif mt == "chatglm":
            out = ref_glm.chatglm_forward(t, cfg, ids)
        elif mt == "glm4_moe":
            out = ref_glm4_moe.glm4_moe_forward(t, cfg, ids, stats)
        elif mt in ("deepseek_v3", "kimi_k2", "kimi_k25", "glm4_moe_lite", "deepseek_v32", "glm_moe_dsa"):
            out = ref_deepseek.deepseek_forward(t, cfg, ids, stats)
        else:
            raise ValueError("no reference for model_type " + mt)
    return out.numpy(), cfg, stats


def run_kiln(d, prompt, n_gen, extra=()):
    f = os.path.join(d, "logits.f32")
    cmd = [KILN, "run", d, "--tokens", ",".join(map(str, prompt)), "-n", str(n_gen), "--temp", "0", "--dump-logits", f] + list(extra)
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError("kiln run failed (%d): %s" % (p.returncode, p.stderr.strip()))
    if "instead of the device" in p.stderr:  # the vulkan backend fell back to the host for an op it runs natively
        raise RuntimeError("kiln run: an op left the device: %s" % p.stderr.strip())
    line = p.stdout.strip().splitlines()[0] if p.stdout.strip() else ""
    gen = [int(x) for x in line.split(",") if x.strip()]
    return gen, np.fromfile(f, dtype=np.float32)


def write_scales(d, margin=2.0):
    """Static FP8 KV scales from an F32 reference pass (amax × margin / 448 per layer and KV head),
    written as kv_scales.json for `--kv-scales`; returns (k_scale, v_scale) for the reference."""
    L = len(KvMode.amax_k)
    ks = [[max(a, 1e-6) * margin / 448.0 for a in KvMode.amax_k[l]] for l in range(L)]
    vs = [[max(a, 1e-6) * margin / 448.0 for a in KvMode.amax_v[l]] for l in range(L)] if KvMode.amax_v else ks
    path = os.path.join(d, "test_kv_scales.json")
    with open(path, "w") as f:
        json.dump({"format": "kiln-kv-scales", "version": 1, "dtype": "fp8_e4m3", "num_layers": L, "num_kv_heads": len(ks[0]),
                   "margin": margin, "tokens": 64, "source": "reference amax (tests/reference/harness.py)", "k_scale": ks, "v_scale": vs}, f)
    return path, (ks, vs)


def compare(arch, d, prompt, n_gen=32, tol=1e-3, extra=(), min_experts=0, want_group_limit=False, kv="f32"):
    scales = None
    extra = list(extra)
    if kv == "fp8":
        reference_logits(d, prompt)  # F32 pass over the prompt: amax of what is cached
        path, scales = write_scales(d)
        extra += ["--kv-dtype", "fp8", "--kv-scales", path]
    elif kv in ("bf16", "f32"):
        extra += ["--kv-dtype", kv]
    gen, flat = run_kiln(d, prompt, n_gen, extra)
    ref, cfg, stats = reference_logits(d, prompt + gen[:-1] if gen else prompt, kv, scales)
    vocab = ref.shape[1]
    kl = flat.reshape(-1, vocab)
    rows = kl.shape[0]
    eos = cfg.get("eos_token_id")
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ok = True
    if len(gen) != n_gen and not (gen and gen[-1] in eos):
        print("FAIL %s: generated %d tokens, expected %d" % (arch, len(gen), n_gen))
        ok = False
    if rows != len(prompt) + len(gen) - 1:
        print("FAIL %s: %d logits rows, expected %d" % (arch, rows, len(prompt) + len(gen) - 1))
        return False
    err = np.abs(kl - ref[:rows]).max(axis=1) / np.abs(ref[:rows]).max(axis=1)
    worst = int(err.argmax())
    print("%s [kv %s]: %d rows (%d prompt + %d decode), max relative error %.3g (row %d), tolerance %g" %
          (arch, kv, rows, len(prompt), len(gen) - 1, err.max(), worst, tol))
    if err.max() > tol:
        print("FAIL %s: relative error %.3g > %g at row %d" % (arch, err.max(), tol, worst))
        ok = False
    for j, tok in enumerate(gen):
        row = ref[len(prompt) - 1 + j]
        best = int(row.argmax())
        if best != tok and row[best] - row[tok] > 1e-4 * max(1.0, abs(row[best])):
            print("FAIL %s: greedy token %d is %d, reference argmax %d (gap %.3g)" % (arch, j, tok, best, row[best] - row[tok]))
            ok = False
    if stats.tokens:
        n_exp = len(stats.experts)
        print("%s: MoE routed %d token-layers, %d distinct (layer, expert) pairs used, group limit changed %d selections" %
              (arch, stats.tokens, n_exp, stats.changed))
        if n_exp < min_experts:
            print("FAIL %s: only %d experts used (want >= %d)" % (arch, n_exp, min_experts))
            ok = False
        if want_group_limit and stats.changed == 0:
            print("FAIL %s: the group limit never changed a selection" % arch)
            ok = False
    return ok


def check_arch(arch, preset="tiny", seed=1, dtype="f32", tol=1e-3, min_experts=0, want_group_limit=False, extra=(), kvs=("f32",)):
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as tmp:
        d = os.path.join(tmp, arch)
        p = subprocess.run([KILN, "mkmodel", "--arch", arch, "--preset", preset, "--dtype", dtype, "--seed", str(seed), d],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print("FAIL %s: mkmodel: %s" % (arch, p.stderr.strip()))
            return 1
        with open(os.path.join(d, "config.json")) as f:
            vocab = json.load(f).get("vocab_size") or 0
        vocab = vocab or json.load(open(os.path.join(d, "config.json")))["padded_vocab_size"]
        rng = random.Random(1234 + seed)
        prompt = [rng.randrange(vocab) for _ in range(64)]
        ok = True
        for dev in os.environ.get("KILN_DEVICES", "cpu").split():
            for kv in kvs:
                print("device %s:" % dev)
                ok = compare(arch, d, prompt, 32, tol, list(extra) + ["--device", dev], min_experts, want_group_limit, kv) and ok
    return 0 if ok else 1
