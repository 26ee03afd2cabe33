#version 450
#ifdef SG
#extension GL_KHR_shader_subgroup_arithmetic : require
#endif
// matmul.comp — Y[t, r] = Σ_c W[r, c] · X[t, c] for one weight format (compiled once per format with
// -DFMT=...): one workgroup per (row, up to TT = 8 tokens), its 64 invocations striding over the row's 32-column
// blocks (256-column super-blocks for the K-quants and IQ4_XS; single columns for the float formats),
// then a tree sum in shared memory (-DSG: subgroup sums, then the subgroups' sums). The GGUF block quants are dequantized in registers as ggml's
// dequantize_row_* does (the same f32 products and differences as kernels/kquant.c), so results
// differ from the ref backend by the summation order only.
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
#define FMT_Q4_K 7
#define FMT_Q5_K 8
#define FMT_Q6_K 9
#define FMT_Q2_K 10
#define FMT_Q3_K 11
#define FMT_IQ4_XS 12
#define FMT_Q4_1 13
#define FMT_Q5_0 14
#define FMT_Q5_1 15
#define FMT_IQ4_NL 16
//
// BYID (matmul_id_*.spv, Vulkan 1.2: buffer device addresses): the MoE experts' matmul over the
// device's own routing, as ggml's mul_mat_id — workgroup y is the (token, slot) pair t of n·K, its
// expert e = ids[ids_off + t] at binding 0 (moe_route.comp wrote it there), the expert's data / scales
// addresses at words tab_off + 4e (lo, hi) and + 2 (lo, hi) of the same binding (each expert one
// chunk); X row t / x_div (x_div = K: every slot of a token reads the token's row; 1: its own row).
// BYID with TT8 (matmul8_id_*.spv, prefill chunks): workgroup y is tile y of the expert-sorted
// entries moe_sort.comp wrote at ord_off — up to 8 (token, slot) pairs t of one expert (0xffffffff
// past the expert's last; a tile starting with it is past the last tile and does nothing): the
// expert's weights are dequantized once for its up to 8 rows, each with its own X row t / x_div and
// Y row t — the floats of each row those of the one-row variant (see TT below).
//
// PAIR (matmul_pair_*.spv, Vulkan 1.2: buffer device addresses; one token per workgroup along y, as
// TT = 1): the SwiGLU MLP's input half, G[t, r] = silu(Σ_c Wg[r, c]·X[t, c]) · Σ_c Wu[r, c]·X[t, c]
// in one dispatch instead of three (gate, up, swiglu.comp): the workgroup computes gate row r, then
// up row r, through the chunks' addresses in P (g_*, u_*; weight rows p.r0 + x and p.r0u + x of
// them), each with the one-row variant's operations and reduction, and applies swiglu.comp's
// expression — so G is bit for bit what the three dispatches give (test_backend_ops checks it).
// The same X row is read twice by the workgroup, from cache the second time.
#if defined(PAIR) && (defined(TT8) || defined(BYID) || defined(ROWS4))
#error PAIR is a one-token variant of its own
#endif
layout(local_size_x = 64) in;
#if defined(BYID) || defined(PAIR)
#extension GL_EXT_buffer_reference : require
#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require
layout(buffer_reference, std430, buffer_reference_align = 4) readonly buffer WRef { uint v[]; };
layout(buffer_reference, std430, buffer_reference_align = 16) readonly buffer WRef4 { uvec4 v[]; };
layout(buffer_reference, std430, buffer_reference_align = 8) readonly buffer WRef2 { uvec2 v[]; };
#ifdef BYID
layout(std430, binding = 0) readonly buffer Ib { uint ids[]; };
#endif
WRef wref, sref;
WRef4 wref4;      // the same expert data, 16 / 8 bytes at a time (only where its address is 16-aligned)
WRef2 wref2;
bool w_aligned;   // that address is
#define W_AT(i) wref.v[i]
#define W4_AT(i) wref4.v[i]
#define W2_AT(i) wref2.v[i]
#define S_AT(i) sref.v[i]
#define W_ALIGNED w_aligned
#else
layout(std430, binding = 0) readonly buffer Wb { uint w[]; };
// the same binding's words 16 / 8 bytes at a time: the wide loads below (the chunk buffers start on
// a multiple of 16 bytes, and a row is read this way only where its start is)
layout(std430, binding = 0) readonly buffer W4b { uvec4 w4[]; };
layout(std430, binding = 0) readonly buffer W2b { uvec2 w2[]; };
layout(std430, binding = 1) readonly buffer Sb { uint s[]; };
#define W_AT(i) w[i]
#define W4_AT(i) w4[i]
#define W2_AT(i) w2[i]
#define S_AT(i) s[i]
#define W_ALIGNED true
#endif
layout(std430, binding = 2) readonly buffer Xb { float x[]; };
// X 16 bytes at a time where every X row the dispatch reads starts on a multiple of 4 floats
// (x_aligned): four consecutive columns per load, consecutive invocations on consecutive 16 bytes —
// on a GPU the GEMV's X loads, not its weight bytes, were its limit (each scalar load of a warp
// touched up to 32 cache lines: INT4 reads 8 bytes of X per weight byte)
layout(std430, binding = 2) readonly buffer X4b { vec4 x4[]; };
bool x_aligned;
vec4 x_at4(uint i) { return x_aligned ? x4[i >> 2] : vec4(x[i], x[i + 1u], x[i + 2u], x[i + 3u]); }
layout(std430, binding = 3) buffer Yb { float y[]; };
layout(std430, binding = 4) readonly buffer Lb { float lut[]; };  // FP8: e4m3 byte → float
layout(std140, binding = 5) uniform P {
    uint rows, cols, r0, n, x_off, x_stride, y_off, y_stride, block, scols, row_bytes;
    // stacked heads (MLA's absorbed per-head products in one dispatch): workgroup z = head h reads
    // weight rows h·h_rows + row, X from x_off + h·x_hstride, writes Y from y_off + h·y_hstride
    // (all 0 for a plain matmul, dispatched with z = 1)
    uint x_hstride, y_hstride, h_rows;
    uint x_div, tab_off, ids_off; // BYID only
    uint ord_off;                 // BYID with TT8 only: the expert-sorted tiles (moe_sort.comp)
    // PAIR only: the gate and up chunks' data and scales addresses (lo, hi words) and up's first row
    uint g_wlo, g_whi, g_slo, g_shi, u_wlo, u_whi, u_slo, u_shi, r0u;
} p;

uint byte_at(uint off) { return (W_AT(off >> 2) >> ((off & 3u) * 8u)) & 0xffu; }
// An IEEE half's value from its bits, exact, subnormals included: unpackHalf2x16 may flush a
// subnormal half to 0 where the device does not preserve 16-bit denormals, and GGUF block scales
// (a Q6_K d of ~1e-5) are often subnormal halves — a whole block would read as zeros.
float half_value(uint h) {
    const uint e = (h >> 10) & 31u, m = h & 1023u;
    const float v = e == 0u ? float(m) * uintBitsToFloat(0x33800000u) // m · 2^-24: a normal float
                  : uintBitsToFloat(e == 31u ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    return uintBitsToFloat(floatBitsToUint(v) | ((h & 0x8000u) << 16));
}
// An E4M3 byte's value (kiln's fp8 table: no infinities, S.1111.111 NaN), exact: normal
// (1 + m/8)·2^(e−7) as float bits, subnormal m·2^−9.
float e4m3_value(uint b) {
    const uint e = (b >> 3) & 15u, m = b & 7u;
    const float v = (b & 0x7fu) == 0x7fu ? uintBitsToFloat(0x7fc00000u)
                  : e == 0u ? float(m) * uintBitsToFloat(0x3b000000u) // 2^-9
                  : uintBitsToFloat(((e + 120u) << 23) | (m << 20));
    return uintBitsToFloat(floatBitsToUint(v) | ((b & 0x80u) << 24));
}
float f16_at(uint off) { return half_value(byte_at(off) | (byte_at(off + 1u) << 8)); }
uint half_at(uint e) { return (W_AT(e >> 1) >> ((e & 1u) * 16u)) & 0xffffu; }
// INT4 group scale of (row, word k): bf16 [rows, cols/group], two per 32-bit word
float int4_scale(uint row, uint k) {
    const uint si = row * p.scols + (8u * k) / p.block;
    return uintBitsToFloat(((S_AT(si >> 1) >> ((si & 1u) * 16u)) & 0xffffu) << 16);
}
uint u32_at(uint off) { return byte_at(off) | (byte_at(off + 1u) << 8) | (byte_at(off + 2u) << 16) | (byte_at(off + 3u) << 24); }
// IQ4_NL / IQ4_XS: ggml-common.h's kvalues_iq4nl
const float iq4_levels[16] = float[16](-127.0, -104.0, -83.0, -65.0, -49.0, -35.0, -22.0, -10.0, 1.0, 13.0, 25.0, 38.0, 53.0, 69.0, 89.0, 113.0);

// Tokens per workgroup, TT: 1 (matmul_*.spv, decode and small batches) or 8 (-DTT8: matmul8_*.spv,
// n ≥ 4: each weight is dequantized once and multiplied into up to 8 tokens' rows, so a prefill
// reads a weight row once per 8 tokens). The two compute a token's result with the same operations
// — the weight's value `precise` (never contracted), each product entering its sum through an
// explicit fma, the same reduction tree — so results do not depend on the variant or on how many
// tokens a call has (a batched verification step gives the decode step's floats). BYID: one
// (token, slot) row per workgroup (each has its own expert).
#ifdef TT8
#define TT 8u
#else
#define TT 1u
#endif
// ROWS4 (matmul4r_*.spv, INT4 only, one token per workgroup along y as TT = 1): a workgroup computes
// 4 consecutive weight rows, each invocation loading its X values once for the 4 rows (the one-row
// variant's invocations each reload them: for INT4, 32 bytes of X per 4-byte weight word).
// Invocation tid takes the same words of every row, in the same order, with the same fma chain and
// the same reduction per row, so the floats are the one-row variant's bit for bit (test_backend_ops,
// subgroup and tree sums): decode and batched verification still agree. Opt-in
// (KILN_VK_GEMV_ROWS=4) until a GPU run's A/B (scripts/gpu_check.sh) measures its speed.
#if defined(ROWS4) && (defined(TT8) || defined(BYID) || FMT != FMT_INT4)
#error ROWS4 is the one-token INT4 variant
#endif
#ifdef ROWS4
#define NACC 4u
#else
#define NACC TT
#endif
// acc[q] += w · x[i + XO(q)] for the workgroup's tokens q < nt (XO(q): token q's X row, q·x_stride
// from the first; BYID8: each entry's own row)
#if defined(BYID) && defined(TT8)
#define BYID8 1
#define XO(q) xo[q]
#else
#define XO(q) ((q) * p.x_stride)
#endif
#define ACC(w, i) { precise float w_ = (w); for (uint q = 0u; q < TT; q++) if (q < nt) acc[q] = fma(w_, x[(i) + XO(q)], acc[q]); }
#define ACC2(w1, i1, w2, i2) { precise float u_ = (w1), v_ = (w2); \
    for (uint q = 0u; q < TT; q++) if (q < nt) acc[q] = fma(v_, x[(i2) + XO(q)], fma(u_, x[(i1) + XO(q)], acc[q])); }
// the same into a block's partial sums d[q]
#define DACC(w, i) { precise float w_ = (w); for (uint q = 0u; q < TT; q++) if (q < nt) d[q] = fma(w_, x[(i) + XO(q)], d[q]); }
#define DACC2(w1, i1, w2, i2) { precise float u_ = (w1), v_ = (w2); \
    for (uint q = 0u; q < TT; q++) if (q < nt) d[q] = fma(v_, x[(i2) + XO(q)], fma(u_, x[(i1) + XO(q)], d[q])); }
// four columns (the weights' vec4 w, in order) into acc / d from X columns i .. i + 3
#define ACC4(w4, i) { precise vec4 w_ = (w4); for (uint q = 0u; q < TT; q++) if (q < nt) { const vec4 x_ = x_at4((i) + XO(q)); \
    acc[q] = fma(w_[3], x_[3], fma(w_[2], x_[2], fma(w_[1], x_[1], fma(w_[0], x_[0], acc[q])))); } }
#define DACC8(v, i) { for (uint q = 0u; q < TT; q++) if (q < nt) { const vec4 xa_ = x_at4((i) + XO(q)), xb_ = x_at4((i) + 4u + XO(q)); \
    precise float r_ = d[q]; for (uint j = 0u; j < 4u; j++) { precise float w_ = float(int(((v) >> (4u * j)) & 15u) - 8); r_ = fma(w_, xa_[j], r_); } \
    for (uint j = 0u; j < 4u; j++) { precise float w_ = float(int(((v) >> (4u * j + 16u)) & 15u) - 8); r_ = fma(w_, xb_[j], r_); } d[q] = r_; } }
#define DRESET() for (uint q = 0u; q < TT; q++) d[q] = 0.0
#define DSCALE(sc) { precise float s_ = (sc); for (uint q = 0u; q < TT; q++) if (q < nt) acc[q] = fma(s_, d[q], acc[q]); }
shared float part[NACC][64];
// the start of token q's Y row (BYID8: its entry's row)
#ifdef BYID8
#define YROW(q) (p.y_off + ent[q] * p.y_stride)
#else
#define YROW(q) (p.y_off + hz * p.y_hstride + (t + (q)) * p.y_stride)
#endif

void main() {
    const uint hz = gl_WorkGroupID.z;
#ifdef ROWS4
    const uint ro = p.r0 + gl_WorkGroupID.x * 4u; // first output row of the workgroup's 4
    const uint nr = min(4u, p.r0 + p.rows - ro);  // rows of this workgroup (p.rows: the dispatch's)
#else
    const uint ro = p.r0 + gl_WorkGroupID.x;  // output row (within the chunk, within the head)
#endif
#ifdef PAIR
    uint r;                                   // weight row within the chunk: gate's, then up's
#else
    const uint r = ro + hz * p.h_rows;        // weight row within the chunk
#endif
    const uint t = gl_WorkGroupID.y * TT;     // first token (BYID: the (token, slot) row; BYID8: the tile's first entry)
    const uint tid = gl_LocalInvocationID.x;
#ifdef BYID8
    uint ent[TT], xo[TT];                     // the tile's entries and their X rows
    if (ids[p.ord_off + t] == 0xffffffffu) return; // past the last tile (the whole workgroup: no barrier reached)
    uint nt = 0u;
    for (uint q = 0u; q < TT; q++) {
        ent[q] = ids[p.ord_off + t + q];
        if (ent[q] != 0xffffffffu) nt = q + 1u;
        xo[q] = ent[q] != 0xffffffffu ? p.x_off + (ent[q] / p.x_div) * p.x_stride : 0u;
    }
    const uint ex = ids[p.ids_off + ent[0]];
    wref = WRef(uint64_t(ids[p.tab_off + 4u * ex]) | (uint64_t(ids[p.tab_off + 4u * ex + 1u]) << 32));
    sref = WRef(uint64_t(ids[p.tab_off + 4u * ex + 2u]) | (uint64_t(ids[p.tab_off + 4u * ex + 3u]) << 32));
    w_aligned = (ids[p.tab_off + 4u * ex] & 15u) == 0u;
    wref4 = WRef4(uint64_t(ids[p.tab_off + 4u * ex]) | (uint64_t(ids[p.tab_off + 4u * ex + 1u]) << 32));
    wref2 = WRef2(uint64_t(ids[p.tab_off + 4u * ex]) | (uint64_t(ids[p.tab_off + 4u * ex + 1u]) << 32));
    const uint xb = 0u;
#elif defined(BYID)
    const uint nt = min(TT, p.n - t);         // tokens of this workgroup
    const uint ex = ids[p.ids_off + t];
    wref = WRef(uint64_t(ids[p.tab_off + 4u * ex]) | (uint64_t(ids[p.tab_off + 4u * ex + 1u]) << 32));
    sref = WRef(uint64_t(ids[p.tab_off + 4u * ex + 2u]) | (uint64_t(ids[p.tab_off + 4u * ex + 3u]) << 32));
    w_aligned = (ids[p.tab_off + 4u * ex] & 15u) == 0u;
    wref4 = WRef4(uint64_t(ids[p.tab_off + 4u * ex]) | (uint64_t(ids[p.tab_off + 4u * ex + 1u]) << 32));
    wref2 = WRef2(uint64_t(ids[p.tab_off + 4u * ex]) | (uint64_t(ids[p.tab_off + 4u * ex + 1u]) << 32));
    const uint xb = p.x_off + (t / p.x_div) * p.x_stride;
#else
    const uint nt = min(TT, p.n - t);         // tokens of this workgroup
    const uint xb = p.x_off + hz * p.x_hstride + t * p.x_stride;
#endif
    x_aligned = p.x_off % 4u == 0u && p.x_stride % 4u == 0u && p.x_hstride % 4u == 0u;
    float acc[NACC];
    float d[TT];
#ifdef PAIR
    float gate_sum = 0.0; // tid 0's: the gate row's dot product
    for (uint which = 0u; which < 2u; which++) { // 0: gate, 1: up
    const uint wlo = which == 0u ? p.g_wlo : p.u_wlo, whi = which == 0u ? p.g_whi : p.u_whi;
    const uint slo = which == 0u ? p.g_slo : p.u_slo, shi = which == 0u ? p.g_shi : p.u_shi;
    wref = WRef(uint64_t(wlo) | (uint64_t(whi) << 32));
    sref = WRef(uint64_t(slo) | (uint64_t(shi) << 32));
    wref4 = WRef4(uint64_t(wlo) | (uint64_t(whi) << 32));
    wref2 = WRef2(uint64_t(wlo) | (uint64_t(whi) << 32));
    w_aligned = (wlo & 15u) == 0u;
    r = (which == 0u ? p.r0 : p.r0u) + gl_WorkGroupID.x;
#endif
    for (uint q = 0u; q < NACC; q++) acc[q] = 0.0;
#if FMT == FMT_F32 || FMT == FMT_F16 || FMT == FMT_BF16
    const uint e0 = r * p.cols;
    if (p.cols % 4u == 0u && W_ALIGNED) {
        // wide: invocation tid takes columns 4u .. 4u + 3 for u = tid, tid + 64, ... (in column
        // order): consecutive invocations read consecutive weight bytes and consecutive X vec4s
        for (uint u = tid; u < p.cols / 4u; u += 64u) {
#if FMT == FMT_F32
            const uvec4 wv = W4_AT(e0 / 4u + u);
            ACC4(uintBitsToFloat(wv), xb + 4u * u);
#elif FMT == FMT_F16
            const uvec2 wv = W2_AT(e0 / 4u + u);
            ACC4(vec4(half_value(wv.x & 0xffffu), half_value(wv.x >> 16), half_value(wv.y & 0xffffu), half_value(wv.y >> 16)), xb + 4u * u);
#else
            const uvec2 wv = W2_AT(e0 / 4u + u);
            ACC4(uintBitsToFloat(uvec4(wv.x << 16, wv.x & 0xffff0000u, wv.y << 16, wv.y & 0xffff0000u)), xb + 4u * u);
#endif
        }
    } else
    for (uint c = tid; c < p.cols; c += 64u) {
#if FMT == FMT_F32
        const float wv = uintBitsToFloat(W_AT(e0 + c));
#elif FMT == FMT_F16
        const float wv = half_value(half_at(e0 + c));
#else
        const float wv = uintBitsToFloat(half_at(e0 + c) << 16);
#endif
        ACC(wv, xb + c);
    }
#elif FMT == FMT_FP8
    // data: e4m3 bytes [rows, cols]; scales f32 [ceil(rows/B), ceil(cols/B)] (chunks start at a multiple of B rows)
    const uint e0 = r * p.cols, srow = (r / p.block) * p.scols;
    if (p.cols % 4u == 0u && p.block % 4u == 0u) {
        // wide: one weight word (4 columns, one scale block) and one X vec4 per step, as above; the
        // bytes decoded arithmetically (e4m3_value: the table's values without a dependent load)
        for (uint u = tid; u < p.cols / 4u; u += 64u) {
            const uint wv = W_AT(e0 / 4u + u);
            const float sc = uintBitsToFloat(S_AT(srow + (4u * u) / p.block));
            ACC4(vec4(e4m3_value(wv & 0xffu), e4m3_value((wv >> 8) & 0xffu), e4m3_value((wv >> 16) & 0xffu), e4m3_value(wv >> 24)) * sc,
                 xb + 4u * u);
        }
    } else
    for (uint c = tid; c < p.cols; c += 64u) ACC(lut[byte_at(e0 + c)] * uintBitsToFloat(S_AT(srow + c / p.block)), xb + c);
#elif FMT == FMT_INT4 && defined(ROWS4)
    // as below, the 8 X values of word k loaded once for the workgroup's rows r .. r + nr - 1; per
    // row the operations of DRESET / DACC / DSCALE with one token
    const uint words = p.cols / 8u;
    for (uint k = tid; k < words; k += 64u) {
        const vec4 xa = x_at4(xb + 8u * k), xc = x_at4(xb + 8u * k + 4u);
        const float xv[8] = float[8](xa.x, xa.y, xa.z, xa.w, xc.x, xc.y, xc.z, xc.w);
        for (uint q = 0u; q < 4u; q++) {
            if (q < nr) {
                const uint v = W_AT((r + q) * words + k);
                precise float s_ = int4_scale(r + q, k);
                float dq = 0.0;
                for (uint j = 0u; j < 8u; j++) {
                    precise float w_ = float(int((v >> (4u * j)) & 15u) - 8);
                    dq = fma(w_, xv[j], dq);
                }
                acc[q] = fma(s_, dq, acc[q]);
            }
        }
    }
#elif FMT == FMT_INT4
    // data: int32 [rows, cols/8], nibble j of word k = column 8k + j, offset by +8; scales bf16 [rows, cols/group]
    const uint words = p.cols / 8u, w0 = r * words;
    for (uint k = tid; k < words; k += 64u) {
        const uint v = W_AT(w0 + k);
        const float sc = int4_scale(r, k);
        DRESET();
        DACC8(v, xb + 8u * k); // consecutive invocations: consecutive words, consecutive X vec4 pairs
        DSCALE(sc);
    }
#elif FMT == FMT_Q8_0
    // blocks of 34 bytes: f16 scale, 32 int8
    const uint nb = p.cols / 32u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 34u;
        const uint c0 = xb + 32u * b;
        DRESET();
        for (uint j = 0u; j < 32u; j++) DACC(float((int(byte_at(off + 2u + j)) << 24) >> 24), c0 + j);
        DSCALE(f16_at(off));
    }
#elif FMT == FMT_Q4_0
    // blocks of 18 bytes: f16 scale, 16 bytes: low nibbles columns 0..15, high nibbles 16..31, offset by +8
    const uint nb = p.cols / 32u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 18u;
        const uint c0 = xb + 32u * b;
        DRESET();
        for (uint j = 0u; j < 16u; j++) {
            const uint v = byte_at(off + 2u + j);
            DACC2(float(int(v & 15u) - 8), c0 + j, float(int(v >> 4) - 8), c0 + 16u + j);
        }
        DSCALE(f16_at(off));
    }
#elif FMT == FMT_Q4_K || FMT == FMT_Q5_K
    // Q4_K (144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales / mins for 8 sub-blocks of 32,
    // 128 bytes of nibbles (low nibbles of a 32-byte run: values 64j..64j+31, high: 64j+32..64j+63).
    // Q5_K (176 bytes): the same with 32 bytes of fifth bits (bit 2j / 2j+1 of byte l) before the nibbles.
    const uint nb = p.cols / 256u;
#if FMT == FMT_Q4_K
    const uint bsz = 144u, qoff = 16u;
#else
    const uint bsz = 176u, qoff = 48u;
#endif
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * bsz;
        const float d = f16_at(off), dmin = f16_at(off + 2u);
        const uint c0 = xb + 256u * b;
        for (uint j = 0u; j < 4u; j++) {
            float sc[2], mn[2];
            for (uint h = 0u; h < 2u; h++) { // ggml's get_scale_min_k4 for sub-block 2j + h
                const uint k = 2u * j + h;
                uint a, m;
                if (k < 4u) { a = byte_at(off + 4u + k) & 63u; m = byte_at(off + 8u + k) & 63u; }
                else {
                    a = (byte_at(off + 8u + k) & 15u) | ((byte_at(off + k) >> 6) << 4);        // scales[k+4], scales[k-4]
                    m = (byte_at(off + 8u + k) >> 4) | ((byte_at(off + 4u + k) >> 6) << 4);    // scales[k+4], scales[k]
                }
                sc[h] = d * float(a);
                mn[h] = dmin * float(m);
            }
            for (uint l = 0u; l < 32u; l++) {
                const uint v = byte_at(off + qoff + 32u * j + l);
                uint lo = v & 15u, hi = v >> 4;
#if FMT == FMT_Q5_K
                const uint qh = byte_at(off + 16u + l);
                lo += ((qh >> (2u * j)) & 1u) << 4;
                hi += ((qh >> (2u * j + 1u)) & 1u) << 4;
#endif
                ACC2(sc[0] * float(lo) - mn[0], c0 + 64u * j + l, sc[1] * float(hi) - mn[1], c0 + 64u * j + 32u + l);
            }
        }
    }
#elif FMT == FMT_Q6_K
    // Q6_K (210 bytes): 128 bytes of low nibbles, 64 bytes of 2-bit highs, 16 int8 scales (one per
    // 16 values), f16 d; two halves of 128 values, each as ggml's dequantize_row_q6_K reads them
    const uint nb = p.cols / 256u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 210u;
        const float d = f16_at(off + 208u);
        const uint c0 = xb + 256u * b;
        for (uint n2 = 0u; n2 < 2u; n2++) {
            const uint ql = off + 64u * n2, qh = off + 128u + 32u * n2, scb = off + 192u + 8u * n2, y0 = c0 + 128u * n2;
            for (uint l = 0u; l < 32u; l++) {
                const uint is = l / 16u, h = byte_at(qh + l), a = byte_at(ql + l), c = byte_at(ql + l + 32u);
                const int q1 = int((a & 15u) | ((h & 3u) << 4)) - 32, q2 = int((c & 15u) | (((h >> 2) & 3u) << 4)) - 32;
                const int q3 = int((a >> 4) | (((h >> 4) & 3u) << 4)) - 32, q4 = int((c >> 4) | (((h >> 6) & 3u) << 4)) - 32;
                const float s1 = d * float((int(byte_at(scb + is)) << 24) >> 24), s2 = d * float((int(byte_at(scb + is + 2u)) << 24) >> 24);
                const float s3 = d * float((int(byte_at(scb + is + 4u)) << 24) >> 24), s4 = d * float((int(byte_at(scb + is + 6u)) << 24) >> 24);
                ACC2(s1 * float(q1), y0 + l, s2 * float(q2), y0 + 32u + l);
                ACC2(s3 * float(q3), y0 + 64u + l, s4 * float(q4), y0 + 96u + l);
            }
        }
    }
#elif FMT == FMT_Q4_1 || FMT == FMT_Q5_0 || FMT == FMT_Q5_1 || FMT == FMT_IQ4_NL
    // blocks of 32 (kernels/kquant.c): element i (0..15) is the low nibble of quant byte i, i + 16
    // its high nibble; Q5_0 / Q5_1 add bit i of the 32-bit qh as the fifth bit.
    // Q4_1 (20 bytes): f16 d, f16 m, nibbles; w = q·d + m. Q5_0 (22): f16 d, qh, nibbles; w = (q − 16)·d.
    // Q5_1 (24): f16 d, f16 m, qh, nibbles; w = q·d + m. IQ4_NL (18): f16 d, nibbles; w = d·level[q].
#if FMT == FMT_Q4_1
    const uint bsz = 20u, qoff = 4u;
#elif FMT == FMT_Q5_0
    const uint bsz = 22u, qoff = 6u;
#elif FMT == FMT_Q5_1
    const uint bsz = 24u, qoff = 8u;
#else
    const uint bsz = 18u, qoff = 2u;
#endif
    const uint nb = p.cols / 32u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * bsz;
        const uint c0 = xb + 32u * b;
        const float dd = f16_at(off);
#if FMT == FMT_Q4_1 || FMT == FMT_Q5_1
        const float m = f16_at(off + 2u);
#endif
#if FMT == FMT_Q5_0
        const uint qh = u32_at(off + 2u);
#elif FMT == FMT_Q5_1
        const uint qh = u32_at(off + 4u);
#endif
        for (uint j = 0u; j < 16u; j++) {
            const uint v = byte_at(off + qoff + j);
            uint lo = v & 15u, hi = v >> 4;
#if FMT == FMT_Q5_0 || FMT == FMT_Q5_1
            lo |= ((qh >> j) & 1u) << 4;
            hi |= ((qh >> (j + 16u)) & 1u) << 4;
#endif
#if FMT == FMT_Q4_1 || FMT == FMT_Q5_1
            ACC2(float(lo) * dd + m, c0 + j, float(hi) * dd + m, c0 + 16u + j);
#elif FMT == FMT_Q5_0
            ACC2(float(int(lo) - 16) * dd, c0 + j, float(int(hi) - 16) * dd, c0 + 16u + j);
#else
            ACC2(dd * iq4_levels[lo], c0 + j, dd * iq4_levels[hi], c0 + 16u + j);
#endif
        }
    }
#elif FMT == FMT_Q2_K
    // Q2_K (84 bytes per 256): 16 scale bytes (low nibble scale, high nibble min, one pair per 16
    // weights), 64 bytes of 2-bit quants, f16 d, f16 dmin; group g's quants: byte 32·(g/8) + 16·(g%2) + l
    // at bit 2·((g%8)/2). w = (d·sc)·q − dmin·m (kernels/kquant.c kiln_q2_k_to_f32).
    const uint nb = p.cols / 256u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 84u;
        const float d = f16_at(off + 80u), dmin = f16_at(off + 82u);
        const uint c0 = xb + 256u * b;
        for (uint g = 0u; g < 16u; g++) {
            const uint sc = byte_at(off + g);
            const float dl = d * float(sc & 15u), ml = dmin * float(sc >> 4);
            const uint qb = off + 16u + 32u * (g / 8u) + 16u * (g % 2u), shift = 2u * ((g % 8u) / 2u);
            for (uint l = 0u; l < 16u; l++) ACC(dl * float((byte_at(qb + l) >> shift) & 3u) - ml, c0 + 16u * g + l);
        }
    }
#elif FMT == FMT_Q3_K
    // Q3_K (110 bytes per 256): 32 bytes of high bits, 64 bytes of 2-bit low quants (placed as Q2_K's),
    // 12 bytes of 16 packed 6-bit scales (+32), f16 d; a clear high bit subtracts 4
    // (kernels/kquant.c kiln_q3_k_to_f32). w = (d·(sc − 32))·q.
    const uint nb = p.cols / 256u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 110u;
        const float d = f16_at(off + 108u);
        const uint c0 = xb + 256u * b;
        for (uint g = 0u; g < 16u; g++) {
            const uint lo = g < 8u ? byte_at(off + 96u + g) & 15u : byte_at(off + 96u + g - 8u) >> 4;
            const uint hi = (byte_at(off + 104u + g % 4u) >> (2u * (g / 4u))) & 3u;
            const float dl = d * float(int(lo | (hi << 4)) - 32);
            const uint hf = g / 8u, j = (g % 8u) / 2u, o = 16u * (g % 2u);
            const uint qb = off + 32u + 32u * hf, bit = 1u << (4u * hf + j);
            for (uint l = o; l < o + 16u; l++) {
                const int v = int((byte_at(qb + l) >> (2u * j)) & 3u) - ((byte_at(off + l) & bit) != 0u ? 0 : 4);
                ACC(dl * float(v), c0 + 16u * g + l - o);
            }
        }
    }
#elif FMT == FMT_IQ4_XS
    // IQ4_XS (136 bytes per 256): f16 d, u16 of 2-bit scale highs, 4 bytes of 4-bit scale lows,
    // 128 bytes of nibbles, 16 per sub-block of 32 (kernels/kquant.c kiln_iq4_xs_to_f32).
    // w = (d·(sc − 32))·level[q].
    const uint nb = p.cols / 256u;
    for (uint b = tid; b < nb; b += 64u) {
        const uint off = r * p.row_bytes + b * 136u;
        const float d = f16_at(off);
        const uint sh = byte_at(off + 2u) | (byte_at(off + 3u) << 8);
        const uint c0 = xb + 256u * b;
        for (uint j = 0u; j < 8u; j++) {
            const uint ls = ((byte_at(off + 4u + j / 2u) >> (4u * (j % 2u))) & 15u) | (((sh >> (2u * j)) & 3u) << 4);
            const float dl = d * float(int(ls) - 32);
            for (uint i = 0u; i < 16u; i++) {
                const uint v = byte_at(off + 8u + 16u * j + i);
                ACC2(dl * iq4_levels[v & 15u], c0 + 32u * j + i, dl * iq4_levels[v >> 4], c0 + 32u * j + 16u + i);
            }
        }
    }
#else
#error unknown FMT
#endif
#ifdef PAIR
    // the one-row variant's reduction below (NACC = 1), its sum kept by invocation 0
    float sum = 0.0;
#ifdef SG
    {
        const float s = subgroupAdd(acc[0]);
        if (subgroupElect()) part[0][gl_SubgroupID] = s;
    }
    barrier();
    if (tid == 0u) {
        sum = part[0][0];
        for (uint i = 1u; i < gl_NumSubgroups; i++) sum += part[0][i];
    }
#else
    part[0][tid] = acc[0];
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h) part[0][tid] += part[0][tid + h];
        barrier();
    }
    if (tid == 0u) sum = part[0][0];
#endif
    barrier(); // part is written again by the up row's sums
    if (which == 0u) gate_sum = sum;
    else if (tid == 0u) {
        // swiglu.comp's expression, as precise there
        precise const float v = gate_sum;
        precise const float o = v / (1.0 + exp(-v)) * sum;
        y[p.y_off + t * p.y_stride + gl_WorkGroupID.x] = o;
    }
    }
#else
#ifdef ROWS4
    // the workgroup's outputs are rows, not tokens: the same reductions per row
#define NOUT nr
#define OUT_AT(q) (p.y_off + hz * p.y_hstride + t * p.y_stride + ro + (q))
#else
#define NOUT nt
#define OUT_AT(q) (YROW(q) + ro)
#endif
#ifdef SG
    // subgroup variant (sgmatmul*.spv, where the device has subgroup arithmetic): each subgroup's
    // sum in one operation, then the subgroups' sums in subgroup order — the same operations for a
    // token whatever tokens share its workgroup, so batch invariance holds here too
    for (uint q = 0u; q < NACC; q++) {
        const float s = subgroupAdd(acc[q]);
        if (subgroupElect()) part[q][gl_SubgroupID] = s;
    }
    barrier();
    if (tid < NOUT) {
        float sum = part[tid][0];
        for (uint i = 1u; i < gl_NumSubgroups; i++) sum += part[tid][i];
        y[OUT_AT(tid)] = sum;
    }
#else
    for (uint q = 0u; q < NACC; q++) part[q][tid] = acc[q];
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1) {
        if (tid < h)
            for (uint q = 0u; q < NACC; q++) part[q][tid] += part[q][tid + h];
        barrier();
    }
    if (tid < NOUT) y[OUT_AT(tid)] = part[tid][0];
#endif
#endif // PAIR
}
