#!/usr/bin/python3
"""test_quant_numpy.py — kiln's FP8-block and INT4 pack-quantized encodings against an independent
NumPy implementation written from the format definitions (not from kiln's C code):

  FP8 E4M3FN (OCP): 1 sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities; 0x7F/0xFF are
  NaN, so the largest finite magnitude is 1.75 * 2^8 = 448. Codes with exponent field 0 are
  subnormal: m/8 * 2^-6.
  Block quantisation (DeepSeek-V3 "fp8" checkpoints, weight_block_size [128, 128]):
      scale_inv = max(amax(block) / 448, eps_f32)   (float32; partial blocks at the edges)
      code      = E4M3(w / scale_inv)  — float32 division, round to nearest (ties to even),
                                          saturating to +-448
      dequant   = E4M3 value * scale_inv (float32)
  INT4 (compressed-tensors pack-quantized, symmetric, group strategy, num_bits 4):
      scale = bf16_rne(max(amax(group) / 7.5, eps_f32))   (7.5 = (q_max - q_min) / 2 for [-8, 7])
      q     = clip(round_half_even(w / scale), -8, 7)      (float32 division)
      weight_packed int32 [rows, cols/8]: word j = sum_i (q[8j+i] + 8) << 4i
      weight_scale  bf16  [rows, cols/G]; dequant = q * scale (float32)

The C side (tests/kernels/test_quant_dump --dump DIR, built in $BUILD, default build) writes its
inputs and outputs as raw little-endian files; this script quantises the same inputs and compares
the packed tensors and scales BYTE FOR BYTE, then unpacks and dequantises them itself and compares
the result bit for bit with kiln's dequantisation.  Exit 0 pass, 1 fail, 77 skip (no binary).
"""
import os
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EPS = np.float32(np.finfo(np.float32).eps)


# ---- FP8 E4M3FN, from the definition ---------------------------------------------------------------
def e4m3_values():
    """Magnitudes of the 127 finite non-negative codes 0x00..0x7E, as float64 (all exact)."""
    v = np.zeros(127)
    for code in range(127):
        e, m = code >> 3, code & 7
        v[code] = (m / 8.0) * 2.0 ** -6 if e == 0 else (1.0 + m / 8.0) * 2.0 ** (e - 7)
    return v


E4M3 = e4m3_values()


def to_e4m3(x):
    """float32 array -> uint8 codes: nearest representable magnitude, ties to the even code, values
    at or beyond 448 saturate to 0x7E; the sign bit is copied (so -0.0 -> 0x80)."""
    x = np.asarray(x, dtype=np.float32)
    a = np.abs(x).astype(np.float64)
    hi = np.searchsorted(E4M3, a, side="left")        # first magnitude >= a
    hi = np.clip(hi, 0, 126)
    lo = np.clip(hi - 1, 0, 126)
    dl, dh = a - E4M3[lo], E4M3[hi] - a
    code = np.where(dh < dl, hi, lo)
    tie = (dh == dl) & (hi != lo)
    code = np.where(tie, np.where(lo % 2 == 0, lo, hi), code)
    code = np.where(a == E4M3[hi], hi, code)           # exact hits (incl. 0)
    code = np.where(a >= 448.0, 126, code)
    sign = np.signbit(x).astype(np.uint8) << 7
    return (code.astype(np.uint8) | sign).astype(np.uint8)


def from_e4m3(codes):
    c = np.asarray(codes, dtype=np.uint8)
    mag = E4M3[np.minimum(c & 0x7F, 126)].astype(np.float32)
    return np.where(c & 0x80, -mag, mag).astype(np.float32)


def fp8_block_quantize(w, block=128):
    rows, cols = w.shape
    sr, sc = -(-rows // block), -(-cols // block)
    codes = np.zeros((rows, cols), np.uint8)
    scale = np.zeros((sr, sc), np.float32)
    for i in range(sr):
        for j in range(sc):
            blk = w[i * block:(i + 1) * block, j * block:(j + 1) * block]
            s = np.float32(np.max(np.abs(blk))) / np.float32(448.0)
            s = np.float32(max(s, EPS))
            scale[i, j] = s
            codes[i * block:(i + 1) * block, j * block:(j + 1) * block] = to_e4m3(blk / s)
    return codes, scale


def fp8_block_dequantize(codes, scale, block=128):
    s = np.repeat(np.repeat(scale, block, axis=0), block, axis=1)[: codes.shape[0], : codes.shape[1]]
    return (from_e4m3(codes) * s).astype(np.float32)


# ---- INT4 pack-quantized ---------------------------------------------------------------------------
def bf16_rne_bits(x):
    u = np.atleast_1d(np.asarray(x, dtype=np.float32)).view(np.uint32).astype(np.uint64)
    one, sh = np.uint64(1), np.uint64(16)
    return ((u + np.uint64(0x7FFF) + ((u >> sh) & one)) >> sh).astype(np.uint16)


def bf16_to_f32(b):
    return (np.asarray(b, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def int4_quantize(w, group):
    rows, cols = w.shape
    g = w.reshape(rows, cols // group, group)
    amax = np.max(np.abs(g), axis=2).astype(np.float32)
    s = np.maximum(amax / np.float32(7.5), EPS).astype(np.float32)
    sb = bf16_rne_bits(s)
    sf = bf16_to_f32(sb)
    q = np.rint(g / sf[:, :, None]).astype(np.float32)     # np.rint: round half to even
    q = np.clip(q, -8, 7).astype(np.int32).reshape(rows, cols)
    u = (q + 8).astype(np.uint32)
    packed = np.zeros((rows, cols // 8), np.uint32)
    for i in range(8):
        packed |= u[:, i::8] << np.uint32(4 * i)
    return packed.view(np.int32), sb


def int4_unpack_dequantize(packed, scale_bits, group):
    p = packed.view(np.uint32)
    rows, words = p.shape
    q = np.zeros((rows, words * 8), np.int32)
    for i in range(8):
        q[:, i::8] = ((p >> np.uint32(4 * i)) & 15).astype(np.int32) - 8
    s = np.repeat(bf16_to_f32(scale_bits), group, axis=1)
    return (q.astype(np.float32) * s).astype(np.float32)


# ---- comparison --------------------------------------------------------------------------------------
def load(d, name, dtype, shape):
    return np.fromfile(os.path.join(d, name), dtype=dtype).reshape(shape)


failures = []


def same_bytes(what, mine, kiln):
    a, b = np.ascontiguousarray(mine).tobytes(), np.ascontiguousarray(kiln).tobytes()
    if a != b:
        diff = np.flatnonzero(np.frombuffer(a, np.uint8) != np.frombuffer(b, np.uint8))
        failures.append(f"{what}: {len(diff)} of {len(a)} bytes differ, first at byte {diff[0]}")
    else:
        print(f"ok   {what}: {len(a)} bytes identical")


def self_test():
    """Spot checks of the NumPy encoder against values worked out by hand."""
    cases = {1.0: 0x38, 1.0625: 0x38, 1.1875: 0x3A, 432.0: 0x7E, 464.0: 0x7E, 1e9: 0x7E, -1e9: 0xFE,
             2.0 ** -10: 0x00, 3 * 2.0 ** -10: 0x02, 7.5 * 2.0 ** -9: 0x08, -0.0: 0x80, 240.0: 0x77}
    for x, c in cases.items():
        got = int(to_e4m3(np.array([x], np.float32))[0])
        if got != c:
            failures.append(f"numpy e4m3({x}) = {got:#x}, expected {c:#x}")
    if int(bf16_rne_bits(np.float32(1.0))[0]) != 0x3F80 or int(bf16_rne_bits(np.float32(1.00390625))[0]) != 0x3F80:
        failures.append("numpy bf16 rounding")  # 1 + 2^-8 is a tie between 0x3F80 and 0x3F81: even


def main():
    build = os.environ.get("BUILD", "build")
    exe = os.path.join(build if os.path.isabs(build) else os.path.join(ROOT, build), "tests", "kernels", "test_quant_dump")
    if not os.access(exe, os.X_OK):
        print(f"skip: {exe} not built")
        return 77
    self_test()
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([exe, "--dump", d], check=True)

        w = load(d, "fp8_in.f32", np.float32, (200, 300))
        codes, scale = fp8_block_quantize(w)
        same_bytes("fp8 weight (E4M3 codes) [200, 300]", codes, load(d, "fp8_data.u8", np.uint8, (200, 300)))
        same_bytes("fp8 weight_scale_inv f32 [2, 3]", scale, load(d, "fp8_scale.f32", np.float32, (2, 3)))
        same_bytes("fp8 dequantised f32 [200, 300]", fp8_block_dequantize(codes, scale),
                   load(d, "fp8_deq.f32", np.float32, (200, 300)))

        w = load(d, "int4_in.f32", np.float32, (96, 384))
        for g in (32, 128):
            packed, sb = int4_quantize(w, g)
            same_bytes(f"int4 g{g} weight_packed int32 [96, 48]", packed, load(d, f"int4_g{g}_packed.i32", np.int32, (96, 48)))
            same_bytes(f"int4 g{g} weight_scale bf16 [96, {384 // g}]", sb, load(d, f"int4_g{g}_scale.bf16", np.uint16, (96, 384 // g)))
            same_bytes(f"int4 g{g} unpacked+dequantised f32 [96, 384]", int4_unpack_dequantize(packed, sb, g),
                       load(d, f"int4_g{g}_deq.f32", np.float32, (96, 384)))
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
