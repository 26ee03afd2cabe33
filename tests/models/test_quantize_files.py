"""kiln quantize: checkpoints it writes follow the FP8-block / compressed-tensors conventions (read
back here with an independent safetensors header parse), load back in kiln and generate; hostile
quantized checkpoints get clear errors naming the tensor and the field."""
import json, os, shutil, struct, subprocess, sys, tempfile

KILN = os.environ.get("KILN", "./kiln")
SHARED = os.environ.get("SHARED", "../shared")
M = os.path.join(SHARED, "models/stories260K")


def run(*args, ok=True):
    p = subprocess.run([KILN, *args], capture_output=True, text=True)
    if ok and p.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed: {p.stderr}")
    return p


def header(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    return json.loads(b[8:8 + n]), b[8 + n:], n


def write(path, h, data):
    hb = json.dumps(h).encode()
    open(path, "wb").write(struct.pack("<Q", len(hb)) + hb + data)


def same_with_and_without_repack(model, *args):
    """FP8/INT4 weights computed on the GEMV tile layout (default: copied at the first session) and
    on the mapped checkpoint layout (--no-repack) give the same logits, bit for bit: the layout is a
    permutation of the bytes and the kernels do the same arithmetic in the same order."""
    d = tempfile.mkdtemp()
    try:
        a = run("run", model, *args, "--dump-logits", f"{d}/a.bin")
        b = run("run", model, *args, "--dump-logits", f"{d}/b.bin", "--no-repack")
        assert a.stdout == b.stdout, (a.stdout, b.stdout)
        la, lb = open(f"{d}/a.bin", "rb").read(), open(f"{d}/b.bin", "rb").read()
        assert len(la) > 0 and la == lb, model
    finally:
        shutil.rmtree(d, ignore_errors=True)


def amx_emulated_same(t):
    """The AMX GEMM of the 16-row interleaves (Q8_0, Q4_0, INT4 g32, Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, IQ4_XS;
    kernels/q16_amx.h) end to end,
    over its C emulation of the tile instructions (KILN_AMX=emulate, any CPU with AVX-512): a
    40-token prefill (two 16-token tile steps and 8 tokens on vpdpbusd) gives the logits of AMX off
    byte for byte. Without AVX-512 the AVX2 table runs and this says so and skips."""
    if not cpu_has_avx512():
        print("skip AMX emulation end to end: no AVX-512 (the AMX GEMM belongs to the AVX-512 table)")
        return
    run("mkmodel", "--arch", "llama", "--dim", "128", "--ffn", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
        "--vocab", "320", "--seq", "128", f"{t}/amx")
    run("convert", f"{t}/amx", f"{t}/amx-q8.gguf", "--outtype", "q8_0")
    run("convert", f"{t}/amx", f"{t}/amx-q4.gguf", "--outtype", "q4_0")
    run("quantize", f"{t}/amx", f"{t}/amx-i4", "--weights", "int4", "--group", "32")
    # Q4_K / Q5_K / Q6_K / Q2_K / Q3_K / IQ4_XS (the super-block interleave): random blocks of those types on a 256-column shape
    # (scripts/gguf_random_types.py; the logits are meaningless, their bits are what is compared)
    run("mkmodel", "--arch", "llama", "--dim", "256", "--ffn", "512", "--layers", "2", "--heads", "4", "--kv-heads", "2",
        "--vocab", "320", "--seq", "128", f"{t}/amxk")
    run("convert", f"{t}/amxk", f"{t}/amxk.gguf", "--outtype", "q8_0")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "gguf_random_types.py")
    kq = ("q4_k", "q5_k", "q6_k", "q2_k", "q3_k", "iq4_xs")
    for ty in kq:
        subprocess.run([sys.executable, script, f"{t}/amxk.gguf", f"{t}/amx-{ty}.gguf", ty], check=True, capture_output=True)
    toks = ",".join(str((7 * i + 3) % 300 + 1) for i in range(40))
    for m in ("amx-q8.gguf", "amx-q4.gguf", "amx-i4") + tuple(f"amx-{ty}.gguf" for ty in kq):
        outs = []
        for mode in ("0", "emulate"):
            p = subprocess.run([KILN, "run", f"{t}/{m}", "--tokens", toks, "-n", "4", "--temp", "0", "--dump-logits", f"{t}/{m}.{mode}.bin"],
                               capture_output=True, text=True, env={**os.environ, "KILN_AMX": mode})
            assert p.returncode == 0, p.stderr
            assert ("AMX tiles emulated" in p.stderr) == (mode == "emulate"), (m, mode, p.stderr)
            outs.append((p.stdout, open(f"{t}/{m}.{mode}.bin", "rb").read()))
        assert outs[0][0] == outs[1][0] and len(outs[0][1]) > 0 and outs[0][1] == outs[1][1], m
        print(f"ok: {m}: AMX (emulated tiles) logits byte-identical to AMX off, {len(outs[0][1])} bytes")


def cpu_has_avx512():
    flags = open("/proc/cpuinfo").read()
    return all(f in flags for f in ("avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"))


def main():
    t = tempfile.mkdtemp()
    try:
        ref = run("run", M, "--temp", "0", "-n", "40").stdout
        assert ref.startswith("Once upon a time"), ref
        # ---- FP8 ----
        run("quantize", M, f"{t}/fp8", "--weights", "fp8")
        cfg = json.load(open(f"{t}/fp8/config.json"))
        qc = cfg["quantization_config"]
        assert qc["quant_method"] == "fp8" and qc["weight_block_size"] == [128, 128] and qc["fmt"] == "e4m3", qc
        h, _, _ = header(f"{t}/fp8/model.safetensors")
        for layer in range(5):
            for proj, (r, c) in {"self_attn.q_proj": (64, 64), "self_attn.k_proj": (32, 64), "mlp.down_proj": (64, 172),
                                 "mlp.gate_proj": (172, 64)}.items():
                w, s = h[f"model.layers.{layer}.{proj}.weight"], h[f"model.layers.{layer}.{proj}.weight_scale_inv"]
                assert w["dtype"] == "F8_E4M3" and w["shape"] == [r, c], (proj, w)
                assert s["dtype"] == "F32" and s["shape"] == [(r + 127) // 128, (c + 127) // 128], (proj, s)
        assert h["model.embed_tokens.weight"]["dtype"] == "F32"
        out = run("run", f"{t}/fp8", "--temp", "0", "-n", "40").stdout
        assert out.startswith("Once upon a time"), out
        same_with_and_without_repack(f"{t}/fp8", "--temp", "0", "-n", "20")
        # ---- INT4 g32 and g128 ----
        for g in (32, 128):
            d = f"{t}/int4_{g}"
            # stories260K's dims (64, 172) do not all divide 128: quantize a mkmodel checkpoint too
            run("quantize", M, d, "--weights", "int4", "--group", str(g))
            qc = json.load(open(f"{d}/config.json"))["quantization_config"]
            assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized", qc
            wq = qc["config_groups"]["group_0"]["weights"]
            assert wq == {**wq, "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": g}, wq
            h, data, _ = header(f"{d}/model.safetensors")
            n_packed = 0
            for name, v in h.items():
                if name.endswith(".weight_packed"):
                    base = name[:-len(".weight_packed")]
                    r, c8 = v["shape"]
                    assert v["dtype"] == "I32"
                    sc = h[base + ".weight_scale"]
                    assert sc["dtype"] == "BF16" and sc["shape"] == [r, c8 * 8 // g], (name, sc)
                    shp = h[base + ".weight_shape"]
                    a, b = shp["data_offsets"]
                    assert list(struct.unpack("<2q", data[a:b])) == [r, c8 * 8]
                    assert base not in qc["ignore"]
                    n_packed += 1
                elif name.endswith(".weight") and len(v["shape"]) == 2 and "embed" not in name:
                    assert name[:-len(".weight")] in qc["ignore"], name  # kept layers are listed as ignored
            assert n_packed >= (20 if g == 32 else 0), n_packed
            out = run("run", d, "--temp", "0", "-n", "40").stdout
            assert out.startswith("Once upon a time"), out
            same_with_and_without_repack(d, "--temp", "0", "-n", "20")
        run("mkmodel", "--arch", "llama", "--dim", "128", "--ffn", "256", "--layers", "2", "--heads", "4", "--kv-heads", "2",
            "--vocab", "320", "--seq", "128", f"{t}/mk")
        run("quantize", f"{t}/mk", f"{t}/mk4", "--weights", "int4", "--group", "128")
        h, _, _ = header(f"{t}/mk4/model.safetensors")
        assert h["lm_head.weight_packed"]["shape"] == [320, 16] and h["lm_head.weight_scale"]["shape"] == [320, 1]
        run("run", f"{t}/mk4", "--tokens", "1,5,9", "-n", "8", "--temp", "0")
        same_with_and_without_repack(f"{t}/mk4", "--tokens", "1,5,9", "-n", "8", "--temp", "0")
        amx_emulated_same(t)
        # ---- hostile checkpoints ----
        def hostile(desc, want, edit_header=None, edit_cfg=None, src=f"{t}/int4_32"):
            d = f"{t}/bad"
            shutil.rmtree(d, ignore_errors=True)
            shutil.copytree(src, d)
            if edit_header:
                h, data, _ = header(f"{d}/model.safetensors")
                data = edit_header(h, data)
                write(f"{d}/model.safetensors", h, data)
            if edit_cfg:
                c = json.load(open(f"{d}/config.json"))
                edit_cfg(c)
                json.dump(c, open(f"{d}/config.json", "w"))
            p = run("run", d, "--tokens", "1", "-n", "1", ok=False)
            assert p.returncode not in (0,) and p.returncode < 128, (desc, p.returncode, p.stderr)
            assert want in p.stderr, (desc, want, p.stderr)
            print("ok:", desc, "->", p.stderr.strip())
        def wrong_scale_shape(h, data):
            h["model.layers.0.self_attn.q_proj.weight_scale"]["shape"] = [32, 4]
            return data
        hostile("scale tensor of the wrong shape", "model.layers.0.self_attn.q_proj.weight_scale", wrong_scale_shape)
        def packed_vs_shape(h, data):
            a, b = h["model.layers.1.mlp.gate_proj.weight_shape"]["data_offsets"]
            return data[:a] + struct.pack("<2q", 172, 72) + data[b:]
        hostile("weight_packed disagrees with weight_shape", "model.layers.1.mlp.gate_proj.weight_shape", packed_vs_shape)
        def nan_scale(h, data):
            a, _ = h["model.layers.2.self_attn.v_proj.weight_scale"]["data_offsets"]
            return data[:a + 6] + b"\xc0\x7f" + data[a + 8:]
        hostile("non-finite scale", "model.layers.2.self_attn.v_proj.weight_scale", nan_scale)
        hostile("unsupported quant_method", "quant_method 'awq'", edit_cfg=lambda c: c["quantization_config"].update(quant_method="awq"))
        hostile("unsupported bit width", "num_bits = 8",
                edit_cfg=lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(num_bits=8))
        hostile("unsupported group size", "group_size = 48",
                edit_cfg=lambda c: c["quantization_config"]["config_groups"]["group_0"]["weights"].update(group_size=48))
        def fp8_scale_shape(h, data):
            h["model.layers.0.mlp.up_proj.weight_scale_inv"]["shape"] = [1, 1]
            return data
        hostile("FP8 scale_inv wrong shape", "model.layers.0.mlp.up_proj.weight_scale_inv", fp8_scale_shape, src=f"{t}/fp8")
    finally:
        shutil.rmtree(t, ignore_errors=True)
    print("ok")


main()
