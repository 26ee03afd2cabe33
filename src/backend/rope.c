/* backend/rope.c — RoPE frequency tables (plain and YaRN) and rotation in both pair layouts. */
#include "backend/rope.h"
#include "base/status.h"
#include <math.h>
#include <string.h>

float kiln_yarn_get_mscale(float scale, float m) {
    if (scale <= 1.0f) return 1.0f;
    return (float)(0.1 * (double)m * log((double)scale) + 1.0);
}

float kiln_yarn_softmax_factor(const kiln_yarn *y) {
    if (!y || !y->enabled || y->mscale_all_dim == 0.0f) return 1.0f;
    float ms = kiln_yarn_get_mscale(y->factor, y->mscale_all_dim);
    return ms * ms;
}

/* Dimension index at which a frequency completes `rot` rotations over ctx positions (YaRN paper). */
static double correction_dim(double rot, int dim, double base, int ctx) {
    return ((double)dim * log((double)ctx / (rot * 2.0 * M_PI))) / (2.0 * log(base));
}

kiln_status kiln_rope_init(kiln_rope *r, int rot_dim, float theta, kiln_rope_style style, const kiln_yarn *y) {
    memset(r, 0, sizeof *r);
    if (rot_dim < 2 || rot_dim % 2 || rot_dim / 2 > KILN_ROPE_MAX_HALF)
        return kiln_fail(KILN_ERR_UNSUPPORTED, "rope: rotary dimension %d must be even and in [2, %d]", rot_dim, 2 * KILN_ROPE_MAX_HALF);
    if (!(theta > 1.0f)) return kiln_fail(KILN_ERR_FORMAT, "rope: rope_theta = %g must be > 1", theta);
    r->rot_dim = rot_dim;
    r->style = style;
    r->theta = theta;
    r->mscale = 1.0f;
    int half = rot_dim / 2;
    for (int i = 0; i < half; i++) {
        /* float32 as torch: base ** (arange(0, dim, 2).float() / dim), then reciprocal */
        float pos_freq = powf(theta, (float)(2 * i) / (float)rot_dim);
        r->inv_freq[i] = 1.0f / pos_freq;
    }
    if (y && y->enabled) {
        if (!(y->factor > 0.0f) || y->orig_ctx < 1)
            return kiln_fail(KILN_ERR_FORMAT, "rope_scaling: yarn needs factor > 0 and original_max_position_embeddings >= 1 (got %g, %d)",
                             y->factor, y->orig_ctx);
        double bf = y->beta_fast > 0 ? y->beta_fast : 32.0, bs = y->beta_slow > 0 ? y->beta_slow : 1.0;
        double low = floor(correction_dim(bf, rot_dim, theta, y->orig_ctx));
        double high = ceil(correction_dim(bs, rot_dim, theta, y->orig_ctx));
        if (low < 0) low = 0;
        if (high > rot_dim - 1) high = rot_dim - 1;
        float lo = (float)low, hi = (float)high;
        if (lo == hi) hi += 0.001f; /* prevent a singular ramp */
        for (int i = 0; i < half; i++) {
            float pos_freq = powf(theta, (float)(2 * i) / (float)rot_dim);
            float extrap = 1.0f / pos_freq, interp = 1.0f / (y->factor * pos_freq);
            float ramp = ((float)i - lo) / (hi - lo);
            if (ramp < 0) ramp = 0;
            if (ramp > 1) ramp = 1;
            float e = 1.0f - ramp;
            r->inv_freq[i] = interp * (1.0f - e) + extrap * e;
        }
        if (y->attention_factor > 0) r->mscale = y->attention_factor;
        else if (y->mscale != 0.0f && y->mscale_all_dim != 0.0f)
            r->mscale = kiln_yarn_get_mscale(y->factor, y->mscale) / kiln_yarn_get_mscale(y->factor, y->mscale_all_dim);
        else r->mscale = kiln_yarn_get_mscale(y->factor, 1.0f);
    }
    return KILN_OK;
}

void kiln_rope_table(const kiln_rope *r, int pos, float *cs) {
    int half = r->rot_dim / 2;
    for (int i = 0; i < half; i++) {
        float a = (float)pos * r->inv_freq[i];
        cs[i] = cosf(a) * r->mscale;
        cs[half + i] = sinf(a) * r->mscale;
    }
}

void kiln_rope_apply(const kiln_rope *r, float *v, int n_heads, int stride, const float *cs) {
    int half = r->rot_dim / 2;
    for (int h = 0; h < n_heads; h++) {
        float *x = v + (size_t)h * stride;
        for (int i = 0; i < half; i++) {
            int a = r->style == KILN_ROPE_NORM ? 2 * i : i, b = r->style == KILN_ROPE_NORM ? 2 * i + 1 : i + half;
            float c = cs[i], s = cs[half + i], x0 = x[a], x1 = x[b];
            x[a] = x0 * c - x1 * s;
            x[b] = x1 * c + x0 * s;
        }
    }
}
