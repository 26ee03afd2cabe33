/* fp.c — reference float conversions (see fp.h). */
#include "base/fp.h"
#include <pthread.h>

float kiln_fp8_e4m3_table[256];

float kiln_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    if (exp == 0) {
        if (man == 0) return kiln_bits_to_f32(sign);
        float v = ldexpf((float)man, -24); /* subnormal */
        return sign ? -v : v;
    }
    if (exp == 31) return kiln_bits_to_f32(sign | 0x7f800000u | (man << 13));
    return kiln_bits_to_f32(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t kiln_f32_to_f16(float f) {
    uint32_t u = kiln_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return sign | 0x7e00;
    if (a >= 0x477ff000u) return sign | 0x7c00; /* rounds to >= 65520 → inf */
    if (a < 0x38800000u) { /* subnormal half (or zero): value = m * 2^-24 */
        float v = kiln_bits_to_f32(a);
        float m = nearbyintf(v * 16777216.0f); /* RNE under the default rounding mode */
        return sign | (uint16_t)m;
    }
    uint32_t r = a + 0xfffu + ((a >> 13) & 1u); /* RNE on the 13 dropped bits */
    return sign | (uint16_t)(((r >> 13) - (112u << 10)));
}

static float fp8_decode(uint8_t v) {
    int s = v >> 7, e = (v >> 3) & 15, m = v & 7;
    float r;
    if (e == 15 && m == 7) return NAN;
    if (e == 0) r = ldexpf((float)m, -9); /* subnormal: m/8 * 2^-6 */
    else r = ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return s ? -r : r;
}

uint8_t kiln_f32_to_fp8_e4m3(float f) {
    if (isnan(f)) return 0x7f;
    uint8_t sign = signbit(f) ? 0x80 : 0;
    float a = fabsf(f);
    if (a >= 448.0f) return sign | 0x7e; /* saturate */
    /* Find the nearest representable value, ties to even code. Codes 0..0x7e are monotonic in
     * magnitude, so a binary search over the table gives the neighbours. */
    int lo = 0, hi = 0x7e;
    while (hi - lo > 1) {
        int mid = (lo + hi) / 2;
        if (kiln_fp8_e4m3_table[mid] <= a) lo = mid; else hi = mid;
    }
    float dl = a - kiln_fp8_e4m3_table[lo], dh = kiln_fp8_e4m3_table[hi] - a;
    int code;
    if (dl < dh) code = lo;
    else if (dh < dl) code = hi;
    else code = (lo & 1) ? hi : lo;
    if (a < kiln_fp8_e4m3_table[lo]) code = lo; /* a == 0 case */
    return sign | (uint8_t)code;
}

static pthread_once_t fp_once = PTHREAD_ONCE_INIT;
static void fp_init_once(void) {
    for (int i = 0; i < 256; i++) kiln_fp8_e4m3_table[i] = fp8_decode((uint8_t)i);
}
void kiln_fp_init(void) { pthread_once(&fp_once, fp_init_once); }
