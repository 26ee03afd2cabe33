// fp8.glsl — E4M3 conversions shared by the shaders that write or round FP8 values (included by
// kv_store.comp, kv_store_dsa.comp, fp8_round.comp), each operation for operation the host's:
// fp8() is kiln_kv_f32_to_fp8 (kv/kv.c), fp8_value() kiln_fp8_e4m3_to_f32 (base/fp.c) and
// block_scale() kiln_fp8_block_scale (base/fp.h).

// kiln_kv_f32_to_fp8 in integers: round to nearest even, saturating at ±448, NaN → 0. Below 2^-6
// the host rounds through a float addition (x + 16384: steps of 2^-9, round to nearest even); here
// the same rounding of m · 2^(e - 141).
uint fp8(float x) {
    const uint u = floatBitsToUint(x), a = u & 0x7fffffffu, sign = (u >> 24) & 0x80u;
    if (a > 0x7f800000u) return 0u;
    uint code;
    if (a < 0x3c800000u) {
        const uint e = a >> 23, sh = 141u - e;
        if (e == 0u || sh >= 25u) code = 0u; // under 2^-10 (ties included: the even code is 0)
        else {
            const uint m = (a & 0x7fffffu) | 0x800000u, mid = 1u << (sh - 1u), rem = m & ((1u << sh) - 1u);
            code = m >> sh;
            if (rem > mid || (rem == mid && (code & 1u) != 0u)) code++;
        }
    } else {
        code = (a - 0x3c000000u + 0x7ffffu + ((a >> 20) & 1u)) >> 20;
        if (code > 0x7eu) code = 0x7eu;
    }
    return sign | code;
}

// The value of E4M3 code c (0..255; the NaN codes 0x7f / 0xff are never produced by fp8()):
// subnormals m · 2^-9, normals (1 + m/8) · 2^(e - 7), built from their bits (exact).
float fp8_value(uint c) {
    const uint e = (c >> 3) & 15u, m = c & 7u;
    const float v = e == 0u ? float(m) * uintBitsToFloat(0x3b000000u) : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    return (c & 0x80u) != 0u ? -v : v;
}

// DeepSeek's act_quant scale of a 128-value block (scale_fmt ue8m0): 2^ceil(log2(max(amax, 1e-4) / 448)),
// from the float's bits as the host computes it; amax ≥ 0.
float block_scale(float amax) {
    precise float a = max(amax, uintBitsToFloat(0x38d1b717u)) * uintBitsToFloat(0x3b124925u); // 1e-4f, 1/448 as floats
    const uint bits = floatBitsToUint(a);
    const int e = int((bits >> 23) & 0xffu) - 127 + ((bits & 0x7fffffu) != 0u ? 1 : 0);
    return uintBitsToFloat(uint(e + 127) << 23);
}

// 1 / s for a block_scale() s, exact (s a normal power of two), built from the bits: 0 when s is
// +inf (a block holding ±inf), as the host's 1.0f / s gives — the bit trick alone would wrap to −inf.
float block_inv(float s) {
    const uint u = floatBitsToUint(s);
    return u >= 0x7f800000u ? 0.0 : uintBitsToFloat((254u << 23) - u);
}
