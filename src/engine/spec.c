/* spec.c — speculative decoding's drafters (issue 25; docs/SPECULATIVE.md). This stage: prompt
 * lookup (n-gram drafting from the context, as vLLM's `ngram` / llama.cpp's lookup decoding).
 *
 * kiln_ngram_draft: for n from n_max down to n_min, the context's last n tokens are searched for an
 * earlier occurrence; the first n with a match wins (the longest suffix that repeats), and of its
 * occurrences the most recent one (the nearest repetition is the likeliest to continue the same
 * way); the up to k tokens that followed it are the draft. O(n_ctx · n_max) per call: a few
 * thousand comparisons for the contexts kiln run sees, nothing next to a forward pass. */
#include "kiln.h"
#include <string.h>

int kiln_ngram_draft(const int32_t *ctx, int n_ctx, int n_min, int n_max, int k, int32_t *out) {
    if (!ctx || n_ctx < 2 || k < 1 || n_min < 1 || n_max < n_min) return 0;
    for (int n = n_max < n_ctx - 1 ? n_max : n_ctx - 1; n >= n_min; n--) {
        const int32_t *suffix = ctx + n_ctx - n;
        /* the match must end before the suffix starts (it needs a token after it) */
        for (int start = n_ctx - n - 1; start >= 0; start--) {
            if (memcmp(ctx + start, suffix, (size_t)n * sizeof *ctx) != 0) continue;
            const int from = start + n, avail = n_ctx - from;
            const int m = avail < k ? avail : k;
            memcpy(out, ctx + from, (size_t)m * sizeof *ctx);
            return m;
        }
    }
    return 0;
}
