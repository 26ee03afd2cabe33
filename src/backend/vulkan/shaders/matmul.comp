#version 450
// matmul.comp — Y[t, r] = Σ_c W[r, c] · X[t, c] for one weight format (compiled once per format with
// -DFMT=...): one workgroup per (row, token), its 64 invocations striding over the row's 32-column
// blocks (or single columns for the float formats), then a tree sum in shared memory.
//
// Weights come row-major as checkpoints store them (the backend uploads tiled weights in that order),
// one chunk of rows per buffer: W binding = the chunk's data bytes as uint words, S = its scales.
// Bytes are read out of 32-bit words (no 8/16-bit storage feature needed, so lavapipe and every
// GPU run the same code). Shapes: X [n, x_stride] floats from x_off, Y [n, y_stride] from y_off.
#define FMT_F32 0
#define FMT_F16 1
#define FMT_BF16 2
#define FMT_FP8 3
#define FMT_INT4 4
#define FMT_Q8_0 5
#define FMT_Q4_0 6
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Wb { uint w[]; };
layout(std430, binding = 1) readonly buffer Sb { uint s[]; };
layout(std430, binding = 2) readonly buffer Xb { float x[]; };
layout(std430, binding = 3) buffer Yb { float y[]; };
layout(std430, binding = 4) readonly buffer Lb { float lut[]; };  // FP8: e4m3 byte → float
layout(push_constant) uniform P {
    uint rows, cols, r0, n, x_off, x_stride, y_off, y_stride, block, scols, row_bytes;
} p;
shared float part[64];

uint byte_at(uint off) { return (w[off >> 2] >> ((off & 3u) * 8u)) & 0xffu; }
float f16_at(uint off) { return unpackHalf2x16(byte_at(off) | (byte_at(off + 1u) << 8)).x; }
uint half_at(uint e) { return (w[e >> 1] >> ((e & 1u) * 16u)) & 0xffffu; }

void main() {
    const uint r = p.r0 + gl_WorkGroupID.x;   // row within the chunk
    const uint t = gl_WorkGroupID.y;
    const uint tid = gl_LocalInvocationID.x;
    const uint xb = p.x_off + t * p.x_stride;
    float acc = 0.0;
#if FMT == FMT_F32 || FMT == FMT_F16 || FMT == FMT_BF16
    const uint e0 = r * p.cols;
    for (uint c = tid; c < p.cols; c += 64u) {
#if FMT == FMT_F32
        const float wv = uintBitsToFloat(w[e0 + c]);
#elif FMT == FMT_F16
        const float wv = unpackHalf2x16(half_at(e0 + c)).x;
#else
        const float wv = uintBitsToFloat(half_at(e0 + c) << 16);
#endif
        acc += wv * x[xb + c];
    }
#elif FMT == FMT_FP8
    // data: e4m3 bytes [rows, cols]; scales f32 [ceil(rows/B), ceil(cols/B)] (chunks start at a multiple of B rows)
    const uint e0 = r * p.cols, srow = (r / p.block) * p.scols;
    for (uint c = tid; c < p.cols; c += 64u)
        acc += lut[byte_at(e0 + c)] * uintBitsToFloat(s[srow + c / p.block]) * x[xb + c];
#elif FMT == FMT_INT4
    // data: int32 [rows, cols/8], nibble j of word k = column 8k + j, offset by +8; scales bf16 [rows, cols/group]
    const uint words = p.cols / 8u, w0 = r * words;
    for (uint k = tid; k < words; k += 64u) {
        const uint v = w[w0 + k];
        const uint si = r * p.scols + (8u * k) / p.block;
        const float sc = uintBitsToFloat(((s[si >> 1] >> ((si & 1u) * 16u)) & 0xffffu) << 16);
        float d = 0.0;
        for (uint j = 0u; j < 8u; j++) d += float(int((v >> (4u * j)) & 15u) - 8) * x[xb + 8u * k + j];
        acc += sc * d;
    }
#elif FMT == FMT_Q8_0
    // blocks of 34 bytes: f16 scale, 32 int8
    const uint nb = p.cols / 32u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 34u;
        const uint c0 = xb + 32u * b;
        float d = 0.0;
        for (uint j = 0u; j < 32u; j++) d += float((int(byte_at(off + 2u + j)) << 24) >> 24) * x[c0 + j];
        acc += f16_at(off) * d;
    }
#elif FMT == FMT_Q4_0
    // blocks of 18 bytes: f16 scale, 16 bytes: low nibbles columns 0..15, high nibbles 16..31, offset by +8
    const uint nb = p.cols / 32u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 18u;
        const uint c0 = xb + 32u * b;
        float d = 0.0;
        for (uint j = 0u; j < 16u; j++) {
            const uint v = byte_at(off + 2u + j);
            d += float(int(v & 15u) - 8) * x[c0 + j] + float(int(v >> 4) - 8) * x[c0 + 16u + j];
        }
        acc += f16_at(off) * d;
    }
#else
#error unknown FMT
#endif
    part[tid] = acc;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) part[tid] += part[tid + h];
        barrier();
    }
    if (tid == 0u) y[p.y_off + t * p.y_stride + r] = part[0];
}
