/* chat_template_value.c — the interpreter's values with Python's semantics: the arena they live in,
 * UTF-8 helpers, truth, ==, <, str() and repr() (lists print as ['a', 1], floats as repr(float)),
 * json.dumps for the tojson filter (transformers: ensure_ascii=False, key order kept, ", " and ": "
 * separators) and JSON -> values (json.loads). */
#include "tokenizer/chat_template_internal.h"
#include "base/status.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>

/* ---- arena ------------------------------------------------------------------------------------- */
struct ct_chunk {
    ct_chunk *next;
    size_t cap;
    _Alignas(16) unsigned char data[];
};

_Noreturn static void arena_oom(ct_arena *a, size_t n) {
    if (a->oom_msg)
        snprintf(a->oom_msg, 1024, "out of memory: the chat template needs more than %zu MiB (asked for %zu bytes more)",
                 a->total >> 20, n);
    if (a->oom) longjmp(*a->oom, 2);
    abort(); /* unreachable: every arena in use has a handler */
}

void *ct_alloc(ct_arena *a, size_t n) {
    n = (n + 15) & ~(size_t)15;
    if (!n) n = 16;
    if (!a->head || a->used + n > a->cap) {
        size_t cap = n > (64u << 10) ? n : (64u << 10);
        if (a->limit && a->total + cap > a->limit) arena_oom(a, n);
        ct_chunk *c = malloc(sizeof *c + cap);
        if (!c) arena_oom(a, n);
        c->next = a->head;
        c->cap = cap;
        a->head = c;
        a->used = 0;
        a->cap = cap;
        a->total += cap;
    }
    void *p = a->head->data + a->used;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *ct_strndup(ct_arena *a, const char *s, size_t n) {
    char *p = ct_alloc(a, n + 1);
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

void ct_arena_free(ct_arena *a) {
    ct_chunk *c = a->head;
    while (c) {
        ct_chunk *nx = c->next;
        free(c);
        c = nx;
    }
    a->head = NULL;
    a->used = a->cap = a->total = 0;
}

/* ---- buffers ----------------------------------------------------------------------------------- */
static void buf_grow(ct_buf *b, size_t need) {
    if (b->n + need <= b->cap) return;
    size_t nc = b->cap ? b->cap * 2 : 64;
    while (nc < b->n + need) nc *= 2;
    char *np = ct_alloc(b->a, nc);
    if (b->n) memcpy(np, b->p, b->n);
    b->p = np;
    b->cap = nc;
}

void ct_buf_put(ct_buf *b, const char *s, size_t n) {
    if (!n) return;
    buf_grow(b, n);
    memcpy(b->p + b->n, s, n);
    b->n += n;
}

void ct_buf_putc(ct_buf *b, char c) {
    buf_grow(b, 1);
    b->p[b->n++] = c;
}

void ct_buf_printf(ct_buf *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if ((size_t)k < sizeof tmp) {
        ct_buf_put(b, tmp, (size_t)k);
        return;
    }
    buf_grow(b, (size_t)k + 1);
    va_start(ap, fmt);
    vsnprintf(b->p + b->n, (size_t)k + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)k;
}

ct_val ct_buf_val(ct_buf *b) { return ct_str(b->p ? b->p : "", b->n); }

/* ---- UTF-8 ------------------------------------------------------------------------------------- */
uint32_t ct_u8_dec(const char *s, size_t n, size_t *i) {
    const unsigned char *u = (const unsigned char *)s;
    size_t k = *i;
    unsigned char c = u[k];
    if (c < 0x80) {
        *i = k + 1;
        return c;
    }
    int len = c >= 0xc2 && c <= 0xdf ? 2 : (c & 0xf0) == 0xe0 ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    uint32_t cp = len == 2 ? c & 0x1f : len == 3 ? c & 0x0f : c & 0x07;
    if (!len || k + (size_t)len > n) {
        *i = k + 1;
        return 0xFFFFFFFFu;
    }
    for (int j = 1; j < len; j++) {
        if ((u[k + (size_t)j] & 0xc0) != 0x80) {
            *i = k + 1;
            return 0xFFFFFFFFu;
        }
        cp = (cp << 6) | (u[k + (size_t)j] & 0x3f);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff)) {
        *i = k + 1;
        return 0xFFFFFFFFu;
    }
    *i = k + (size_t)len;
    return cp;
}

size_t ct_u8_count(const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ((unsigned char)s[i] & 0xc0) != 0x80;
    return k;
}

size_t ct_u8_offset(const char *s, size_t n, size_t cp) {
    size_t i = 0;
    while (i < n && cp) {
        i++;
        while (i < n && ((unsigned char)s[i] & 0xc0) == 0x80) i++;
        cp--;
    }
    return i;
}

void ct_u8_enc(ct_buf *b, uint32_t cp) {
    char t[4];
    size_t n;
    if (cp < 0x80) { t[0] = (char)cp; n = 1; }
    else if (cp < 0x800) { t[0] = (char)(0xc0 | (cp >> 6)); t[1] = (char)(0x80 | (cp & 0x3f)); n = 2; }
    else if (cp < 0x10000) {
        t[0] = (char)(0xe0 | (cp >> 12)); t[1] = (char)(0x80 | ((cp >> 6) & 0x3f)); t[2] = (char)(0x80 | (cp & 0x3f)); n = 3;
    } else {
        t[0] = (char)(0xf0 | (cp >> 18)); t[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        t[2] = (char)(0x80 | ((cp >> 6) & 0x3f)); t[3] = (char)(0x80 | (cp & 0x3f)); n = 4;
    }
    ct_buf_put(b, t, n);
}

int ct_is_space(uint32_t c) {
    return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ---- lists and dicts ------------------------------------------------------------------------------ */
ct_val ct_list_new(ct_arena *a, size_t n, int tuple) {
    ct_val v = {0};
    v.t = CT_LIST;
    v.tuple = (uint8_t)(tuple != 0);
    v.u.l = ct_alloc(a, sizeof *v.u.l);
    v.u.l->n = n;
    v.u.l->v = ct_alloc(a, (n ? n : 1) * sizeof(ct_val));
    return v;
}

ct_val ct_dict_new(ct_arena *a, size_t cap) {
    ct_val v = {0};
    v.t = CT_DICT;
    v.u.d = ct_alloc(a, sizeof *v.u.d);
    v.u.d->cap = cap ? cap : 4;
    v.u.d->k = ct_alloc(a, v.u.d->cap * sizeof(ct_val));
    v.u.d->v = ct_alloc(a, v.u.d->cap * sizeof(ct_val));
    return v;
}

ct_val *ct_dict_get(const ct_dict *d, ct_val k) {
    for (size_t i = 0; i < d->n; i++)
        if (ct_equal(d->k[i], k)) return &d->v[i];
    return NULL;
}

ct_val *ct_dict_get_str(const ct_dict *d, const char *k, size_t n) {
    for (size_t i = 0; i < d->n; i++)
        if (d->k[i].t == CT_STR && d->k[i].u.s.n == n && memcmp(d->k[i].u.s.p, k, n) == 0) return &d->v[i];
    return NULL;
}

void ct_dict_set(ct_arena *a, ct_dict *d, ct_val k, ct_val v) {
    ct_val *slot = ct_dict_get(d, k);
    if (slot) {
        *slot = v;
        return;
    }
    if (d->n == d->cap) {
        size_t nc = d->cap * 2;
        ct_val *nk = ct_alloc(a, nc * sizeof *nk), *nv = ct_alloc(a, nc * sizeof *nv);
        memcpy(nk, d->k, d->n * sizeof *nk);
        memcpy(nv, d->v, d->n * sizeof *nv);
        d->k = nk;
        d->v = nv;
        d->cap = nc;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
}

/* ---- errors -------------------------------------------------------------------------------------- */
void ct_fail(ct_ctx *c, kiln_status st, const char *fmt, ...) {
    int k = snprintf(c->err, sizeof c->err, "%s:%d: ", c->name, c->line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err + k, sizeof c->err - (size_t)k, fmt, ap);
    va_end(ap);
    c->err_status = st;
    longjmp(c->jb, 1);
}

/* ---- Python semantics ----------------------------------------------------------------------------- */
const char *ct_type_name(ct_val v) {
    switch (v.t) {
    case CT_UNDEF: return "Undefined";
    case CT_NONE: return "NoneType";
    case CT_BOOL: return "bool";
    case CT_INT: return "int";
    case CT_FLOAT: return "float";
    case CT_STR: return "str";
    case CT_LIST: return v.tuple ? "tuple" : "list";
    case CT_DICT: return "dict";
    case CT_NS: return "Namespace";
    case CT_MACRO: return "Macro";
    case CT_FUNC: return "builtin_function_or_method";
    case CT_METHOD: return "builtin_function_or_method";
    case CT_LOOP: return "LoopContext";
    }
    return "object";
}

int ct_truthy(ct_ctx *c, ct_val v) {
    (void)c;
    switch (v.t) {
    case CT_UNDEF: case CT_NONE: return 0;
    case CT_BOOL: case CT_INT: return v.u.i != 0;
    case CT_FLOAT: return v.u.f != 0;
    case CT_STR: return v.u.s.n != 0;
    case CT_LIST: return v.u.l->n != 0;
    case CT_DICT: return v.u.d->n != 0;
    default: return 1;
    }
}

static int is_num(ct_val v) { return v.t == CT_BOOL || v.t == CT_INT || v.t == CT_FLOAT; }

int ct_equal(ct_val a, ct_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != CT_FLOAT && b.t != CT_FLOAT) return a.u.i == b.u.i;
        double x = a.t == CT_FLOAT ? a.u.f : (double)a.u.i, y = b.t == CT_FLOAT ? b.u.f : (double)b.u.i;
        return x == y;
    }
    if (a.t != b.t) return 0;
    switch (a.t) {
    case CT_UNDEF: case CT_NONE: return 1;
    case CT_STR: return a.u.s.n == b.u.s.n && memcmp(a.u.s.p, b.u.s.p, a.u.s.n) == 0;
    case CT_LIST:
        if (a.tuple != b.tuple || a.u.l->n != b.u.l->n) return 0;
        for (size_t i = 0; i < a.u.l->n; i++)
            if (!ct_equal(a.u.l->v[i], b.u.l->v[i])) return 0;
        return 1;
    case CT_DICT:
        if (a.u.d->n != b.u.d->n) return 0;
        for (size_t i = 0; i < a.u.d->n; i++) {
            ct_val *o = ct_dict_get(b.u.d, a.u.d->k[i]);
            if (!o || !ct_equal(a.u.d->v[i], *o)) return 0;
        }
        return 1;
    case CT_NS: return a.u.d == b.u.d;
    case CT_MACRO: return a.u.m == b.u.m;
    case CT_FUNC: return a.fn == b.fn;
    case CT_METHOD: return a.fn == b.fn && a.u.self == b.u.self;
    case CT_LOOP: return a.u.loop == b.u.loop;
    default: return 0;
    }
}

int ct_compare(ct_ctx *c, ct_val a, ct_val b) {
    if (is_num(a) && is_num(b)) {
        if (a.t != CT_FLOAT && b.t != CT_FLOAT) return a.u.i < b.u.i ? -1 : a.u.i > b.u.i;
        double x = a.t == CT_FLOAT ? a.u.f : (double)a.u.i, y = b.t == CT_FLOAT ? b.u.f : (double)b.u.i;
        return x < y ? -1 : x > y ? 1 : 0;
    }
    if (a.t == CT_STR && b.t == CT_STR) { /* UTF-8 byte order is code point order */
        size_t m = a.u.s.n < b.u.s.n ? a.u.s.n : b.u.s.n;
        int r = memcmp(a.u.s.p, b.u.s.p, m);
        if (r) return r < 0 ? -1 : 1;
        return a.u.s.n < b.u.s.n ? -1 : a.u.s.n > b.u.s.n;
    }
    if (a.t == CT_LIST && b.t == CT_LIST && a.tuple == b.tuple) {
        size_t m = a.u.l->n < b.u.l->n ? a.u.l->n : b.u.l->n;
        for (size_t i = 0; i < m; i++) {
            if (ct_equal(a.u.l->v[i], b.u.l->v[i])) continue;
            return ct_compare(c, a.u.l->v[i], b.u.l->v[i]);
        }
        return a.u.l->n < b.u.l->n ? -1 : a.u.l->n > b.u.l->n;
    }
    ct_fail(c, KILN_ERR_INVALID_ARG, "'<' not supported between instances of '%s' and '%s'", ct_type_name(a),
            ct_type_name(b));
}

/* Python repr(float): the shortest digits that round-trip; exponent form when the decimal point
 * falls 16+ digits right or 4+ left ("1e+16", "1e-05"), else positional with ".0" when integral. */
void ct_float_repr(ct_buf *b, double f) {
    if (isnan(f)) { ct_buf_put(b, "nan", 3); return; }
    if (isinf(f)) { if (f < 0) ct_buf_putc(b, '-'); ct_buf_put(b, "inf", 3); return; }
    if (f == 0) { if (signbit(f)) ct_buf_putc(b, '-'); ct_buf_put(b, "0.0", 3); return; }
    char tmp[64];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(tmp, sizeof tmp, "%.*e", prec, f);
        if (strtod(tmp, NULL) == f) break;
    }
    if (prec == 17) snprintf(tmp, sizeof tmp, "%.16e", f);
    /* tmp = [-]d[.ddd]e[+-]xx */
    char digits[32];
    int nd = 0, neg = 0;
    const char *q = tmp;
    if (*q == '-') { neg = 1; q++; }
    for (; *q && *q != 'e'; q++)
        if (*q >= '0' && *q <= '9') digits[nd++] = *q;
    int exp10 = atoi(q + 1);
    while (nd > 1 && digits[nd - 1] == '0') nd--;
    int decpt = exp10 + 1; /* digits d1 d2 ... with the point after decpt digits */
    if (neg) ct_buf_putc(b, '-');
    if (decpt > 16 || decpt < -3) {
        ct_buf_putc(b, digits[0]);
        if (nd > 1) {
            ct_buf_putc(b, '.');
            ct_buf_put(b, digits + 1, (size_t)nd - 1);
        }
        ct_buf_printf(b, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    } else if (decpt <= 0) {
        ct_buf_put(b, "0.", 2);
        for (int i = 0; i < -decpt; i++) ct_buf_putc(b, '0');
        ct_buf_put(b, digits, (size_t)nd);
    } else {
        for (int i = 0; i < decpt; i++) ct_buf_putc(b, i < nd ? digits[i] : '0');
        ct_buf_putc(b, '.');
        if (nd > decpt) ct_buf_put(b, digits + decpt, (size_t)(nd - decpt));
        else ct_buf_putc(b, '0');
    }
}

/* Python str.isprintable() for one code point */
static int printable(uint32_t cp) {
    if (cp == ' ') return 1;
    if (cp < 0x20 || cp == 0x7f) return 0;
    if (cp < 0x7f) return 1;
    switch (u_charType((UChar32)cp)) {
    case U_CONTROL_CHAR: case U_FORMAT_CHAR: case U_SURROGATE: case U_PRIVATE_USE_CHAR: case U_UNASSIGNED:
    case U_LINE_SEPARATOR: case U_PARAGRAPH_SEPARATOR: case U_SPACE_SEPARATOR:
        return 0;
    default:
        return 1;
    }
}

static void repr_str(ct_buf *b, const char *s, size_t n) {
    int has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = has_sq && !has_dq ? '"' : '\'';
    ct_buf_putc(b, q);
    for (size_t i = 0; i < n;) {
        size_t st = i;
        uint32_t cp = ct_u8_dec(s, n, &i);
        if (cp == (uint32_t)q || cp == '\\') { ct_buf_putc(b, '\\'); ct_buf_putc(b, (char)cp); }
        else if (cp == '\t') ct_buf_put(b, "\\t", 2);
        else if (cp == '\n') ct_buf_put(b, "\\n", 2);
        else if (cp == '\r') ct_buf_put(b, "\\r", 2);
        else if (printable(cp)) ct_buf_put(b, s + st, i - st);
        else if (cp <= 0xff) ct_buf_printf(b, "\\x%02x", cp);
        else if (cp <= 0xffff) ct_buf_printf(b, "\\u%04x", cp);
        else ct_buf_printf(b, "\\U%08x", cp);
    }
    ct_buf_putc(b, q);
}

static void str_or_repr(ct_ctx *c, ct_buf *b, ct_val v, int repr) {
    if (++c->depth > 500) ct_fail(c, KILN_ERR_UNSUPPORTED, "value nested too deeply to print");
    switch (v.t) {
    case CT_UNDEF: if (repr) ct_buf_put(b, "Undefined", 9); break;
    case CT_NONE: ct_buf_put(b, "None", 4); break;
    case CT_BOOL: if (v.u.i) ct_buf_put(b, "True", 4); else ct_buf_put(b, "False", 5); break;
    case CT_INT: ct_buf_printf(b, "%lld", (long long)v.u.i); break;
    case CT_FLOAT: ct_float_repr(b, v.u.f); break;
    case CT_STR: if (repr) repr_str(b, v.u.s.p, v.u.s.n); else ct_buf_put(b, v.u.s.p, v.u.s.n); break;
    case CT_LIST:
        if (v.view) ct_buf_printf(b, "dict_%s(", v.view == 1 ? "items" : v.view == 2 ? "keys" : "values");
        ct_buf_putc(b, v.tuple ? '(' : '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) ct_buf_put(b, ", ", 2);
            str_or_repr(c, b, v.u.l->v[i], 1);
        }
        if (v.tuple && v.u.l->n == 1) ct_buf_putc(b, ',');
        ct_buf_putc(b, v.tuple ? ')' : ']');
        if (v.view) ct_buf_putc(b, ')');
        break;
    case CT_NS: ct_buf_put(b, "<Namespace ", 11); /* fall through */
    case CT_DICT:
        ct_buf_putc(b, '{');
        for (size_t i = 0; i < v.u.d->n; i++) {
            if (i) ct_buf_put(b, ", ", 2);
            str_or_repr(c, b, v.u.d->k[i], 1);
            ct_buf_put(b, ": ", 2);
            str_or_repr(c, b, v.u.d->v[i], 1);
        }
        ct_buf_putc(b, '}');
        if (v.t == CT_NS) ct_buf_putc(b, '>');
        break;
    case CT_MACRO: ct_buf_printf(b, "<Macro '%s'>", v.u.m->name); break;
    case CT_FUNC: ct_buf_put(b, "<built-in function>", 19); break;
    case CT_METHOD: ct_buf_put(b, "<built-in method>", 17); break;
    case CT_LOOP: ct_buf_put(b, "<LoopContext>", 13); break;
    }
    c->depth--;
}

void ct_str_of(ct_ctx *c, ct_buf *b, ct_val v) { str_or_repr(c, b, v, 0); }
void ct_repr_of(ct_ctx *c, ct_buf *b, ct_val v) { str_or_repr(c, b, v, 1); }

ct_val ct_to_str(ct_ctx *c, ct_val v) {
    if (v.t == CT_STR) return v;
    ct_buf b = {&c->arena, NULL, 0, 0};
    ct_str_of(c, &b, v);
    return ct_buf_val(&b);
}

/* ---- json.dumps ---------------------------------------------------------------------------------- */
static void json_str(ct_buf *b, const char *s, size_t n, int ensure_ascii) {
    ct_buf_putc(b, '"');
    for (size_t i = 0; i < n;) {
        unsigned char ch = (unsigned char)s[i];
        /* ensure_ascii=False escapes only " \\ and controls; True also 0x7f and non-ASCII */
        if (ch >= 0x20 && ch != '"' && ch != '\\' && (ch < 0x7f || !ensure_ascii)) {
            size_t j = i + 1;
            while (j < n) {
                unsigned char d = (unsigned char)s[j];
                if (d < 0x20 || d == '"' || d == '\\' || (d >= 0x7f && ensure_ascii)) break;
                j++;
            }
            ct_buf_put(b, s + i, j - i);
            i = j;
            continue;
        }
        if (ch == '"') { ct_buf_put(b, "\\\"", 2); i++; continue; }
        if (ch == '\\') { ct_buf_put(b, "\\\\", 2); i++; continue; }
        if (ch < 0x20 || ch == 0x7f) {
            switch (ch) {
            case '\n': ct_buf_put(b, "\\n", 2); break;
            case '\r': ct_buf_put(b, "\\r", 2); break;
            case '\t': ct_buf_put(b, "\\t", 2); break;
            case '\b': ct_buf_put(b, "\\b", 2); break;
            case '\f': ct_buf_put(b, "\\f", 2); break;
            default: ct_buf_printf(b, "\\u%04x", ch);
            }
            i++;
            continue;
        }
        uint32_t cp = ct_u8_dec(s, n, &i); /* ensure_ascii and non-ASCII */
        if (cp >= 0x10000) {
            cp -= 0x10000;
            ct_buf_printf(b, "\\u%04x\\u%04x", 0xd800 + (cp >> 10), 0xdc00 + (cp & 0x3ff));
        } else {
            ct_buf_printf(b, "\\u%04x", cp);
        }
    }
    ct_buf_putc(b, '"');
}

static void json_float(ct_buf *b, double f) {
    if (isnan(f)) ct_buf_put(b, "NaN", 3);
    else if (isinf(f)) { if (f < 0) ct_buf_putc(b, '-'); ct_buf_put(b, "Infinity", 8); }
    else ct_float_repr(b, f);
}

static void json_newline(ct_buf *b, const ct_json_opts *o, int level) {
    ct_buf_putc(b, '\n');
    for (int i = 0; i < level; i++) ct_buf_put(b, o->indent, o->indent_len);
}

void ct_tojson(ct_ctx *c, ct_buf *b, ct_val v, const ct_json_opts *o, int level) {
    if (++c->depth > 500) ct_fail(c, KILN_ERR_UNSUPPORTED, "value nested too deeply for tojson");
    switch (v.t) {
    case CT_NONE: ct_buf_put(b, "null", 4); break;
    case CT_BOOL: if (v.u.i) ct_buf_put(b, "true", 4); else ct_buf_put(b, "false", 5); break;
    case CT_INT: ct_buf_printf(b, "%lld", (long long)v.u.i); break;
    case CT_FLOAT: json_float(b, v.u.f); break;
    case CT_STR: json_str(b, v.u.s.p, v.u.s.n, o->ensure_ascii); break;
    case CT_LIST:
        if (v.view)
            ct_fail(c, KILN_ERR_INVALID_ARG, "tojson: Object of type dict_%s is not JSON serializable",
                    v.view == 1 ? "items" : v.view == 2 ? "keys" : "values");
        if (!v.u.l->n) { ct_buf_put(b, "[]", 2); break; }
        ct_buf_putc(b, '[');
        for (size_t i = 0; i < v.u.l->n; i++) {
            if (i) ct_buf_put(b, o->item_sep, o->item_sep_len);
            if (o->indent) json_newline(b, o, level + 1);
            ct_tojson(c, b, v.u.l->v[i], o, level + 1);
        }
        if (o->indent) json_newline(b, o, level);
        ct_buf_putc(b, ']');
        break;
    case CT_DICT: {
        const ct_dict *d = v.u.d;
        if (!d->n) { ct_buf_put(b, "{}", 2); break; }
        size_t *order = ct_alloc(&c->arena, d->n * sizeof *order);
        for (size_t i = 0; i < d->n; i++) order[i] = i;
        if (o->sort_keys) /* json.dumps sorts the keys as given (str in practice); insertion sort, stable */
            for (size_t i = 1; i < d->n; i++) {
                size_t x = order[i], j = i;
                while (j > 0 && ct_compare(c, d->k[order[j - 1]], d->k[x]) > 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = x;
            }
        ct_buf_putc(b, '{');
        for (size_t ii = 0; ii < d->n; ii++) {
            size_t i = order[ii];
            if (ii) ct_buf_put(b, o->item_sep, o->item_sep_len);
            if (o->indent) json_newline(b, o, level + 1);
            ct_val k = d->k[i];
            switch (k.t) {
            case CT_STR: json_str(b, k.u.s.p, k.u.s.n, o->ensure_ascii); break;
            case CT_NONE: ct_buf_put(b, "\"null\"", 6); break;
            case CT_BOOL: ct_buf_put(b, k.u.i ? "\"true\"" : "\"false\"", k.u.i ? 6 : 7); break;
            case CT_INT: ct_buf_printf(b, "\"%lld\"", (long long)k.u.i); break;
            case CT_FLOAT: ct_buf_putc(b, '"'); json_float(b, k.u.f); ct_buf_putc(b, '"'); break;
            default: ct_fail(c, KILN_ERR_INVALID_ARG, "tojson: keys must be str, int, float, bool or None, not %s",
                             ct_type_name(k));
            }
            ct_buf_put(b, o->key_sep, o->key_sep_len);
            ct_tojson(c, b, d->v[i], o, level + 1);
        }
        if (o->indent) json_newline(b, o, level);
        ct_buf_putc(b, '}');
        break;
    }
    default:
        ct_fail(c, KILN_ERR_INVALID_ARG, "tojson: Object of type %s is not JSON serializable", ct_type_name(v));
    }
    c->depth--;
}

/* ---- JSON -> values ------------------------------------------------------------------------------ */
ct_val ct_from_json(ct_ctx *c, const json_t *j) {
    if (++c->depth > 500) ct_fail(c, KILN_ERR_UNSUPPORTED, "JSON input nested too deeply");
    ct_val v;
    switch (json_typeof(j)) {
    case JSON_OBJECT: {
        v = ct_dict_new(&c->arena, json_object_size(j));
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)j, key, val) { /* keys are unique: append */
            ct_dict *d = v.u.d;
            if (d->n == d->cap) { /* cannot happen: sized from json_object_size */
                ct_dict_set(&c->arena, d, ct_str(key, strlen(key)), ct_from_json(c, val));
                continue;
            }
            d->k[d->n] = ct_str(key, strlen(key));
            d->v[d->n] = ct_from_json(c, val);
            d->n++;
        }
        break;
    }
    case JSON_ARRAY:
        v = ct_list_new(&c->arena, json_array_size(j), 0);
        for (size_t i = 0; i < json_array_size(j); i++) v.u.l->v[i] = ct_from_json(c, json_array_get(j, i));
        break;
    case JSON_STRING: v = ct_str(json_string_value(j), json_string_length(j)); break;
    case JSON_INTEGER: v = ct_int(json_integer_value(j)); break;
    case JSON_REAL: v = ct_float(json_real_value(j)); break;
    case JSON_TRUE: v = ct_bool(1); break;
    case JSON_FALSE: v = ct_bool(0); break;
    default: v = ct_none(); break;
    }
    c->depth--;
    return v;
}
