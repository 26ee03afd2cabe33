/* text.c — byte buffers, UTF-8 repair and the streaming detokenizer (see text.h). */
#include "server/text.h"
#include <sys/random.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void kiln_sbuf_put(kiln_sbuf *b, const void *s, size_t n) {
    if (b->oom) return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->len + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) { b->oom = 1; return; }
        b->p = p;
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}
void kiln_sbuf_puts(kiln_sbuf *b, const char *s) { kiln_sbuf_put(b, s, strlen(s)); }
void kiln_sbuf_printf(kiln_sbuf *b, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) { kiln_sbuf_put(b, tmp, (size_t)n); return; }
    char *big = malloc((size_t)n + 1);
    if (!big) { b->oom = 1; return; }
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    kiln_sbuf_put(b, big, (size_t)n);
    free(big);
}
void kiln_sbuf_free(kiln_sbuf *b) { free(b->p); memset(b, 0, sizeof *b); }

/* Length of the valid UTF-8 character at s[0..n), 0 if the bytes there are not one (RFC 3629:
 * no overlongs, no surrogates, nothing above U+10FFFF); *partial = 1 when the bytes are a valid
 * but incomplete beginning. */
static size_t utf8_char(const unsigned char *s, size_t n, int *partial) {
    *partial = 0;
    unsigned c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    unsigned lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else return 0;
    for (size_t i = 1; i < need; i++) {
        if (i >= n) { *partial = 1; return 0; }
        unsigned b = s[i];
        if (i == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    }
    return need;
}

int kiln_utf8_valid(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t i = 0; i < n;) {
        int partial;
        size_t k = utf8_char(u + i, n - i, &partial);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

void kiln_utf8_repair(const char *s, size_t n, kiln_sbuf *out) {
    const unsigned char *u = (const unsigned char *)s;
    size_t i = 0, run = 0; /* run: start of the current valid stretch */
    while (i < n) {
        int partial;
        size_t k = utf8_char(u + i, n - i, &partial);
        if (k) { i += k; continue; }
        kiln_sbuf_put(out, s + run, i - run);
        kiln_sbuf_put(out, "\xEF\xBF\xBD", 3);
        /* skip the maximal invalid subpart: the lead plus the continuation bytes it accepted */
        size_t j = i + 1;
        unsigned c = u[i];
        size_t need = c >= 0xF0 && c <= 0xF4 ? 4 : c >= 0xE0 && c <= 0xEF ? 3 : c >= 0xC2 && c <= 0xDF ? 2 : 1;
        for (size_t t = 1; t < need && j < n; t++, j++) {
            int p2;
            if (!utf8_char(u + i, t + 1, &p2) && !p2) break;
        }
        i = j;
        run = i;
    }
    kiln_sbuf_put(out, s + run, n - run);
}

size_t kiln_utf8_complete_prefix(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        size_t i = n - back;
        if ((u[i] & 0xC0) == 0x80) continue; /* continuation byte: look further back */
        int partial;
        utf8_char(u + i, back, &partial);
        return partial ? i : n;
    }
    return n;
}

int kiln_detok_push(kiln_detok *d, const char *piece, size_t n) {
    if (d->stopped) return 1;
    size_t old = d->text.len;
    kiln_sbuf_put(&d->text, piece, n);
    /* a stop string completed by these bytes starts at most stop_len - 1 bytes before them */
    size_t best = (size_t)-1;
    int best_i = 0;
    for (int i = 0; i < d->n_stops; i++) {
        size_t L = d->stop_len[i];
        if (!L || d->text.len < L) continue;
        size_t from = old >= L - 1 ? old - (L - 1) : 0;
        if (from < d->sent) from = d->sent;
        const char *hit = memmem(d->text.p + from, d->text.len - from, d->stops[i], L);
        if (hit && (size_t)(hit - d->text.p) < best) best = (size_t)(hit - d->text.p), best_i = i;
    }
    if (best != (size_t)-1) {
        d->text.len = best;
        if (d->text.p) d->text.p[best] = 0;
        d->stopped = 1;
        d->stop_index = best_i;
    }
    return d->stopped;
}

size_t kiln_detok_take(kiln_detok *d, int final, kiln_sbuf *out) {
    size_t end = d->text.len;
    if (!final && !d->stopped) {
        /* hold back a tail that may still become a stop string */
        size_t hold = 0;
        for (int i = 0; i < d->n_stops; i++)
            for (size_t k = d->stop_len[i] - 1; k > hold; k--)
                if (k <= end - d->sent && memcmp(d->text.p + end - k, d->stops[i], k) == 0) { hold = k; break; }
        end -= hold;
        end = d->sent + kiln_utf8_complete_prefix(d->text.p + d->sent, end - d->sent);
    }
    size_t n = end - d->sent;
    if (n) kiln_utf8_repair(d->text.p + d->sent, n, out);
    d->sent = end;
    return n;
}

void kiln_detok_free(kiln_detok *d) { kiln_sbuf_free(&d->text); }

void kiln_random_hex(char *out, size_t nbytes) {
    unsigned char r[64] = {0};
    if (nbytes > sizeof r) nbytes = sizeof r;
    size_t got = 0;
    while (got < nbytes) {
        ssize_t k = getrandom(r + got, nbytes - got, 0);
        if (k <= 0) break; /* cannot happen for <= 256 bytes once the pool is initialised */
        got += (size_t)k;
    }
    static const char hex[] = "0123456789abcdef";
    for (size_t i = 0; i < nbytes; i++) {
        out[2 * i] = hex[r[i] >> 4];
        out[2 * i + 1] = hex[r[i] & 15];
    }
    out[2 * nbytes] = 0;
}
