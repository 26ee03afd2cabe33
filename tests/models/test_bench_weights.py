"""kiln bench --weights: one JSON object per configuration with the issue's fields; the weight bytes
read per decode token match the checkpoint conventions computed here independently from the model
shape (BF16: 2 B/weight; FP8: 1 B/weight + f32 scale per 128x128 block; INT4 g32: 0.5 B/weight +
bf16 scale per 32), for every linear layer and the output head; achieved GB/s is bytes x tokens/s; the linear-layers-only replay is reported."""
import json, math, os, shutil, subprocess, sys, tempfile

KILN = os.environ.get("KILN", "./kiln")


def run(*args):
    p = subprocess.run([KILN, *args], capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"kiln {' '.join(args)} failed: {p.stderr}")
    return p


def gemv_bytes(weights, r, c):
    """Bytes of one r x c weight in the checkpoint conventions (data + scales)."""
    if weights == "fp8":
        return r * c + 4 * math.ceil(r / 128) * math.ceil(c / 128)
    group = 128 if weights == "int4-g128" else 32
    return r * c // 2 + 2 * r * (c // group)


def bench_gemv():
    """kiln bench --gemv: per (shape, weights) one JSON object; a pass reads >= --mb MiB of whole
    copies of the weight (the fewest that reach it); the shape's first format is the ratio base;
    bad --shape / --weights values are refused with the option and the value named."""
    shapes, weights, mb = [(260, 384), (64, 256)], ["fp8", "int4", "int4-g128"], 1
    out = run("bench", "--gemv", "--shape", ",".join(f"{r}x{c}" for r, c in shapes), "--weights", ",".join(weights),
              "--rounds", "3", "--mb", str(mb), "--threads", "1", "--json").stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert [(r["shape"], r["weights"]) for r in rows] == [(f"{a}x{b}", w) for a, b in shapes for w in weights], out
    for row in rows:
        a, b = (int(v) for v in row["shape"].split("x"))
        per = gemv_bytes(row["weights"], a, b)
        assert row["copies"] == math.ceil((mb << 20) / per), (row, per)
        assert row["bytes_per_pass"] == row["copies"] * per, (row, per)
        for k in ("median_gbps", "p25_gbps", "p75_gbps", "best_gbps", "measured_gbps", "vs_first_median"):
            assert row[k] > 0, (k, row)
        assert row["p25_gbps"] <= row["median_gbps"] <= row["p75_gbps"] <= row["best_gbps"], row
        if row["weights"] == weights[0]:
            assert row["vs_first_median"] == 1.0, row
    # the GGUF block types kiln reads but does not quantize to: random blocks, bytes per block as ggml's
    gguf = {"q4_k": (256, 144), "q6_k": (256, 210), "q2_k": (256, 84), "iq4_xs": (256, 136), "q5_0": (32, 22), "iq4_nl": (32, 18)}
    out = run("bench", "--gemv", "--shape", "48x512", "--weights", ",".join(gguf), "--rounds", "2", "--mb", str(mb), "--threads", "1",
              "--json").stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert [r["weights"] for r in rows] == list(gguf), out
    for row in rows:
        elems, bb = gguf[row["weights"]]
        per = 48 * 512 // elems * bb
        assert row["copies"] == math.ceil((mb << 20) / per) and row["bytes_per_pass"] == row["copies"] * per, (row, per)
        assert 0 < row["p25_gbps"] <= row["median_gbps"] <= row["p75_gbps"] <= row["best_gbps"], row
    # --tokens: a row per token count (the weights read once per pass whatever the count: the same bytes)
    out = run("bench", "--gemv", "--shape", "64x256", "--weights", "int4,bf16", "--tokens", "1,3", "--rounds", "2", "--mb", str(mb),
              "--threads", "1", "--json").stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert [(r["weights"], r["tokens"]) for r in rows] == [("int4", 1), ("int4", 3), ("bf16", 1), ("bf16", 3)], out
    for a, b in ((rows[0], rows[1]), (rows[2], rows[3])):
        assert a["bytes_per_pass"] == b["bytes_per_pass"] and a["copies"] == b["copies"], (a, b)
    assert rows[0]["vs_first_median"] == 1.0, rows[0]
    for args, names in ((["--shape", "12y4"], ["--shape", "12y4"]), (["--tokens", "0"], ["--tokens", "0"]), (["--tokens", "2,x"], ["--tokens", "x"]), (["--weights", "int5"], ["--weights", "int5", "GGUF block type"]),
                        (["--shape", "8x100", "--weights", "q4_k"], ["--shape", "8x100", "q4_k block of 256"]),
                        (["--shape", "8x100", "--weights", "int4"], ["--shape", "8x100", "group 32"]),
                        (["--shape", ",".join(["64x256"] * 40)], ["--shape", "255 characters"])):
        p = subprocess.run([KILN, "bench", "--gemv", "--rounds", "1", "--mb", "1", *args], capture_output=True, text=True)
        assert p.returncode != 0 and all(n in p.stderr for n in names), (args, p.returncode, p.stderr)


def bench_attention():
    """kiln bench --attention: one JSON object per KV dtype, in the order asked, with positive times
    ordered as quartiles and the cost the on / off ratio of rounds; every ISA the CPU has runs; bad
    values are refused naming the option and the value."""
    isas = ["scalar"] + [i for i, flag in (("avx2", "avx2"), ("avx512", "avx512f")) if flag in open("/proc/cpuinfo").read().split()]
    for isa in isas:
        out = run("bench", "--attention", "--kv-dtype", "fp8,bf16,f32", "--ctx", "100", "--layers", "2", "--kv-heads", "2", "--head-dim", "64",
                  "--rows", "3", "--rounds", "3", "--isa", isa, "--json").stdout
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        assert [r["kv"] for r in rows] == ["fp8", "bf16", "f32"], (isa, out)
        for r in rows:
            assert r["ctx"] == 100, r
            assert 0 < r["off_p25"] <= r["off_ns"] <= r["off_p75"] and 0 < r["on_p25"] <= r["on_ns"] <= r["on_p75"], (isa, r)
            assert r["cost_p25"] <= r["cost"] <= r["cost_p75"] and r["cost"] > -1, (isa, r)
            assert r["threads"] == 1, r
    # the heads spread over two threads (each its own accumulators and page sums)
    out = run("bench", "--attention", "--kv-dtype", "bf16", "--ctx", "100", "--layers", "2", "--kv-heads", "3", "--head-dim", "64",
              "--rounds", "2", "--threads", "2", "--json").stdout
    rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
    assert len(rows) == 1 and rows[0]["threads"] == 2 and 0 < rows[0]["off_ns"] and 0 < rows[0]["on_ns"], out
    for args, names in ((["--kv-dtype", "int8"], ["--kv-dtype", "int8"]), (["--head-dim", "12"], ["--head-dim 12", "multiple of 8"]), (["--rows", "9"], ["--rows", "9"]),
                        (["--ctx", "0"], ["--ctx", "0"])):
        p = subprocess.run([KILN, "bench", "--attention", "--rounds", "1", *args], capture_output=True, text=True)
        assert p.returncode != 0 and all(n in p.stderr for n in names), (args, p.returncode, p.stderr)


def main():
    t = tempfile.mkdtemp()
    try:
        dim, ffn, layers, heads, kvh, vocab = 128, 256, 2, 4, 2, 320
        run("mkmodel", "--arch", "llama", "--dim", str(dim), "--ffn", str(ffn), "--layers", str(layers), "--heads", str(heads),
            "--kv-heads", str(kvh), "--vocab", str(vocab), "--seq", "64", "--dtype", "bf16", f"{t}/m")
        out = run("bench", f"{t}/m", "--weights", "bf16,fp8,int4", "--prompt", "4", "--gen", "4", "--repeat", "2", "--threads", "1", "--json").stdout
        rows = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
        assert [r["weights"] for r in rows] == ["bf16", "fp8", "int4"], out
        hd = dim // heads
        mats = [(dim, dim), (kvh * hd, dim), (kvh * hd, dim), (dim, dim), (ffn, dim), (ffn, dim), (dim, ffn)] * layers + [(vocab, dim)]
        want = {
            "bf16": sum(2 * r * c for r, c in mats),
            "fp8": sum(r * c + 4 * math.ceil(r / 128) * math.ceil(c / 128) for r, c in mats),
            "int4": sum(r * c // 2 + 2 * r * (c // 32) for r, c in mats),
        }
        for r in rows:
            for k in ("prompt_tps", "decode_tps", "weight_bytes_per_token", "achieved_gbps", "measured_gbps", "linear_only_tps"):
                assert k in r and r[k] > 0, (k, r)
            assert r["weight_bytes_per_token"] == want[r["weights"]], (r["weights"], r["weight_bytes_per_token"], want[r["weights"]])
            assert abs(r["achieved_gbps"] - r["weight_bytes_per_token"] * r["decode_tps"] / 1e9) <= 1e-3 * r["achieved_gbps"] + 1e-3, r
            # the ratio of best windows to the first configuration's, and the median of per-round ratios
            assert abs(r["vs_first"] - r["decode_tps"] / rows[0]["decode_tps"]) <= 1e-3 * r["vs_first"], r
            assert r["vs_first_paired_median"] > 0, r
        assert rows[0]["vs_first"] == 1.0 and rows[0]["vs_first_paired_median"] == 1.0, rows[0]
        bench_gemv()
        bench_attention()
        print("ok")
    finally:
        shutil.rmtree(t, ignore_errors=True)


main()
