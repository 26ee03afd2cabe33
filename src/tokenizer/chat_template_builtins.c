/* chat_template_builtins.c — jinja2's filters and tests, the str / dict / list methods the
 * sandbox allows, and the globals (range, namespace, dict, raise_exception, strftime_now), with
 * Python's behaviour: code point indexing, Unicode case mapping and character classes via ICU,
 * split / strip / splitlines / replace as str does, round-half-even, repr in lists.
 * Arguments bind positionally and by keyword as in the Python signatures; a bad argument fails
 * with the callee's name. */
#include "tokenizer/chat_template_internal.h"
#include "base/status.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unicode/uchar.h>
#include <unicode/ucasemap.h>

/* ---- names ---------------------------------------------------------------------------------------- */
enum {
    F_ABS, F_ATTR, F_BATCH, F_CAPITALIZE, F_CENTER, F_COUNT, F_D, F_DEFAULT, F_DICTSORT, F_E, F_ESCAPE,
    F_FIRST, F_FLOAT, F_FORMAT, F_INDENT, F_INT, F_ITEMS, F_JOIN, F_LAST, F_LENGTH, F_LIST, F_LOWER, F_MAP,
    F_MAX, F_MIN, F_REJECT, F_REJECTATTR, F_REPLACE, F_REVERSE, F_ROUND, F_SAFE, F_SELECT, F_SELECTATTR,
    F_SORT, F_STRING, F_SUM, F_TITLE, F_TOJSON, F_TRIM, F_UNIQUE, F_UPPER, F_WORDCOUNT, F_N
};
static const char *const FILTERS[F_N] = {
    "abs", "attr", "batch", "capitalize", "center", "count", "d", "default", "dictsort", "e", "escape",
    "first", "float", "format", "indent", "int", "items", "join", "last", "length", "list", "lower", "map",
    "max", "min", "reject", "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr",
    "sort", "string", "sum", "title", "tojson", "trim", "unique", "upper", "wordcount"};

enum {
    T_BOOLEAN, T_CALLABLE, T_DEFINED, T_DIVISIBLEBY, T_EQ, T_EQUALTO, T_EQ2, T_ESCAPED, T_EVEN, T_FALSE,
    T_FILTER, T_FLOAT, T_GE, T_GE2, T_GT, T_GT2, T_GREATERTHAN, T_IN, T_INTEGER, T_ITERABLE, T_LE, T_LE2,
    T_LOWER, T_LESSTHAN, T_LT, T_LT2, T_MAPPING, T_NE, T_NE2, T_NONE, T_NUMBER, T_ODD, T_SAMEAS,
    T_SEQUENCE, T_STRING, T_TEST, T_TRUE, T_UNDEFINED, T_UPPER, T_N
};
static const char *const TESTS[T_N] = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "==", "escaped", "even", "false",
    "filter", "float", "ge", ">=", "gt", ">", "greaterthan", "in", "integer", "iterable", "le", "<=",
    "lower", "lessthan", "lt", "<", "mapping", "ne", "!=", "none", "number", "odd", "sameas",
    "sequence", "string", "test", "true", "undefined", "upper"};

enum { G_RANGE, G_NAMESPACE, G_DICT, G_RAISE, G_STRFTIME, G_LIPSUM, G_CYCLER, G_JOINER, G_N };
static const char *const GLOBALS[G_N] = {"range", "namespace", "dict", "raise_exception", "strftime_now",
                                         "lipsum", "cycler", "joiner"};

/* methods: str 0.., dict 100.., list 200.., loop 300.. */
enum {
    S_STARTSWITH, S_ENDSWITH, S_SPLIT, S_RSPLIT, S_SPLITLINES, S_STRIP, S_LSTRIP, S_RSTRIP, S_UPPER, S_LOWER,
    S_TITLE, S_CAPITALIZE, S_SWAPCASE, S_CASEFOLD, S_REPLACE, S_FIND, S_RFIND, S_INDEX, S_RINDEX, S_COUNT,
    S_JOIN, S_ISDIGIT, S_ISALPHA, S_ISALNUM, S_ISSPACE, S_ISLOWER, S_ISUPPER, S_ISDECIMAL, S_ISNUMERIC,
    S_FORMAT, S_CENTER, S_LJUST, S_RJUST, S_ZFILL, S_PARTITION, S_RPARTITION, S_REMOVEPREFIX, S_REMOVESUFFIX,
    S_N
};
static const char *const STR_METHODS[S_N] = {
    "startswith", "endswith", "split", "rsplit", "splitlines", "strip", "lstrip", "rstrip", "upper", "lower",
    "title", "capitalize", "swapcase", "casefold", "replace", "find", "rfind", "index", "rindex", "count",
    "join", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "isdecimal", "isnumeric",
    "format", "center", "ljust", "rjust", "zfill", "partition", "rpartition", "removeprefix", "removesuffix"};
static const char *const STR_UNSUPPORTED[] = {"encode", "expandtabs", "format_map", "istitle", "isidentifier",
                                              "isprintable", "isascii", "maketrans", "translate", NULL};
enum { D_ITEMS = 100, D_KEYS, D_VALUES, D_GET, D_COPY };
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", "copy", NULL};
static const char *const DICT_UNSAFE[] = {"pop", "popitem", "setdefault", "update", "clear", NULL};
enum { L_INDEX = 200, L_COUNT, L_COPY };
static const char *const LIST_METHODS[] = {"index", "count", "copy", NULL};
static const char *const LIST_UNSAFE[] = {"append", "extend", "insert", "pop", "remove", "reverse", "sort",
                                          "clear", NULL};
enum { LP_CYCLE = 300, LP_CHANGED };

static int find_name(const char *const *list, int n, const char *s, size_t len) {
    for (int i = 0; n < 0 ? list[i] != NULL : i < n; i++)
        if (strlen(list[i]) == len && memcmp(list[i], s, len) == 0) return i;
    return -1;
}

int ct_filter_id(const char *name, size_t n) { return find_name(FILTERS, F_N, name, n); }
int ct_test_id(const char *name, size_t n) { return find_name(TESTS, T_N, name, n); }
int ct_global_id(const char *name, size_t n) { return find_name(GLOBALS, G_N, name, n); }

ct_val ct_global_val(int id) {
    ct_val v = {0};
    v.t = CT_FUNC;
    v.fn = (uint16_t)id;
    return v;
}

int ct_method_id(ct_val v, const char *name, size_t n, int *unsafe) {
    *unsafe = 0;
    int i;
    switch (v.t) {
    case CT_STR:
        if ((i = find_name(STR_METHODS, S_N, name, n)) >= 0) return i;
        if (find_name(STR_UNSUPPORTED, -1, name, n) >= 0) *unsafe = 2;
        return -1;
    case CT_DICT:
        if ((i = find_name(DICT_METHODS, -1, name, n)) >= 0) return D_ITEMS + i;
        if (find_name(DICT_UNSAFE, -1, name, n) >= 0) *unsafe = 1;
        return -1;
    case CT_LIST:
        if ((i = find_name(LIST_METHODS, -1, name, n)) >= 0) return L_INDEX + i;
        if (find_name(LIST_UNSAFE, -1, name, n) >= 0) *unsafe = 1;
        return -1;
    case CT_LOOP:
        if (n == 5 && memcmp(name, "cycle", 5) == 0) return LP_CYCLE;
        if (n == 7 && memcmp(name, "changed", 7) == 0) return LP_CHANGED;
        return -1;
    default: return -1;
    }
}

/* ---- argument binding ------------------------------------------------------------------------------ */
/* Binds a->pos / a->kw to the parameter names; out[i].t == CT_UNDEF with given[i] == 0 when absent. */
static void bind(ct_ctx *c, const char *fn, ct_args *a, const char *const *names, int n, ct_val *out, char *given) {
    for (int i = 0; i < n; i++) {
        out[i] = ct_undef(NULL, 0);
        given[i] = 0;
    }
    if (a->npos > n) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes at most %d argument(s) (%d given)", fn, n, a->npos);
    for (int i = 0; i < a->npos; i++) {
        out[i] = a->pos[i];
        given[i] = 1;
    }
    for (int k = 0; k < a->nkw; k++) {
        int i = find_name(names, n, a->kw[k], strlen(a->kw[k]));
        if (i < 0) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() got an unexpected keyword argument '%s'", fn, a->kw[k]);
        if (given[i]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() got multiple values for argument '%s'", fn, a->kw[k]);
        out[i] = a->kwv[k];
        given[i] = 1;
    }
}

static ct_val need_str(ct_ctx *c, const char *fn, ct_val v) {
    if (v.t != CT_STR) {
        if (v.t == CT_UNDEF && v.u.s.p) ct_fail(c, KILN_ERR_INVALID_ARG, "%s: '%.*s' is undefined", fn, (int)v.u.s.n, v.u.s.p);
        ct_fail(c, KILN_ERR_INVALID_ARG, "%s: expected a string, got '%s'", fn, ct_type_name(v));
    }
    return v;
}

static int64_t need_int(ct_ctx *c, const char *fn, ct_val v) {
    if (v.t != CT_INT && v.t != CT_BOOL)
        ct_fail(c, KILN_ERR_INVALID_ARG, "%s: expected an integer, got '%s'", fn, ct_type_name(v));
    return v.u.i;
}

static int is_given_none(ct_val v, char given) { return !given || v.t == CT_NONE; }

/* ---- Unicode helpers --------------------------------------------------------------------------------- */
static int ascii_only(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return 0;
    return 1;
}

/* full case mapping of the whole string (ICU root locale, as Python's str.upper/lower) */
static ct_val case_map(ct_ctx *c, ct_val s, int upper) {
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (ascii_only(p, n)) {
        char *o = ct_alloc(&c->arena, n + 1);
        for (size_t i = 0; i < n; i++) {
            char ch = p[i];
            o[i] = upper ? (ch >= 'a' && ch <= 'z' ? (char)(ch - 32) : ch) : (ch >= 'A' && ch <= 'Z' ? (char)(ch + 32) : ch);
        }
        return ct_str(o, n);
    }
    UErrorCode err = U_ZERO_ERROR;
    UCaseMap *cm = ucasemap_open("", 0, &err);
    if (U_FAILURE(err)) ct_fail(c, KILN_ERR_INTERNAL, "ICU case mapping unavailable: %s", u_errorName(err));
    size_t cap = n * 3 + 16;
    char *o = ct_alloc(&c->arena, cap);
    int32_t k = upper ? ucasemap_utf8ToUpper(cm, o, (int32_t)cap, p, (int32_t)n, &err)
                      : ucasemap_utf8ToLower(cm, o, (int32_t)cap, p, (int32_t)n, &err);
    ucasemap_close(cm);
    if (U_FAILURE(err)) ct_fail(c, KILN_ERR_INTERNAL, "ICU case mapping failed: %s", u_errorName(err));
    return ct_str(o, (size_t)k);
}

static uint32_t cp_title(uint32_t cp) { return (uint32_t)u_totitle((UChar32)cp); }
static uint32_t cp_lower(uint32_t cp) { return (uint32_t)u_tolower((UChar32)cp); }
static uint32_t cp_upper(uint32_t cp) { return (uint32_t)u_toupper((UChar32)cp); }
static int cp_cased(uint32_t cp) { return u_hasBinaryProperty((UChar32)cp, UCHAR_CASED); }
static int cp_word(uint32_t cp) { return cp == '_' || u_isalnum((UChar32)cp) || u_hasBinaryProperty((UChar32)cp, UCHAR_ALPHABETIC); }

/* Python str.title(): a cased character after an uncased one is title-cased, others lower-cased */
static ct_val str_title(ct_ctx *c, ct_val s) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    int prev_cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp = ct_u8_dec(s.u.s.p, s.u.s.n, &i);
        ct_u8_enc(&b, prev_cased ? cp_lower(cp) : cp_title(cp));
        prev_cased = cp_cased(cp);
    }
    return ct_buf_val(&b);
}

/* Python str.capitalize(): first character title-cased, the rest lower-cased */
static ct_val str_capitalize(ct_ctx *c, ct_val s) {
    if (!s.u.s.n) return s;
    size_t i = 0;
    uint32_t cp = ct_u8_dec(s.u.s.p, s.u.s.n, &i);
    ct_buf b = {&c->arena, NULL, 0, 0};
    ct_u8_enc(&b, cp_title(cp));
    ct_val rest = case_map(c, ct_str(s.u.s.p + i, s.u.s.n - i), 0);
    ct_buf_put(&b, rest.u.s.p, rest.u.s.n);
    return ct_buf_val(&b);
}

static ct_val str_swapcase(ct_ctx *c, ct_val s) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp = ct_u8_dec(s.u.s.p, s.u.s.n, &i);
        ct_u8_enc(&b, u_isUUppercase((UChar32)cp) ? cp_lower(cp) : u_isULowercase((UChar32)cp) ? cp_upper(cp) : cp);
    }
    return ct_buf_val(&b);
}

/* jinja2's title filter: words start after runs of [-\s({[<], first letter upper, rest lower */
static ct_val jinja_title(ct_ctx *c, ct_val s) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    int at_start = 1;
    for (size_t i = 0; i < s.u.s.n;) {
        uint32_t cp = ct_u8_dec(s.u.s.p, s.u.s.n, &i);
        int sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || ct_is_space(cp);
        if (sep) {
            ct_u8_enc(&b, cp);
            at_start = 1;
        } else {
            ct_u8_enc(&b, at_start ? cp_upper(cp) : cp_lower(cp));
            at_start = 0;
        }
    }
    return ct_buf_val(&b);
}

enum { CLS_DIGIT, CLS_ALPHA, CLS_ALNUM, CLS_SPACE, CLS_DECIMAL, CLS_NUMERIC };
static int cp_class(uint32_t cp, int cls) {
    int nt = u_getIntPropertyValue((UChar32)cp, UCHAR_NUMERIC_TYPE);
    switch (cls) {
    case CLS_DIGIT: return nt == U_NT_DECIMAL || nt == U_NT_DIGIT;
    case CLS_DECIMAL: return nt == U_NT_DECIMAL;
    case CLS_NUMERIC: return nt != U_NT_NONE;
    case CLS_ALPHA: return u_isalpha((UChar32)cp);
    case CLS_ALNUM: return u_isalpha((UChar32)cp) || nt != U_NT_NONE;
    default: return ct_is_space(cp);
    }
}

static int str_is(ct_val s, int cls) {
    if (!s.u.s.n) return 0;
    for (size_t i = 0; i < s.u.s.n;)
        if (!cp_class(ct_u8_dec(s.u.s.p, s.u.s.n, &i), cls)) return 0;
    return 1;
}

/* islower / isupper: some cased character and none of the other case (or title case) */
static int str_case_is(ct_val s, int lower) {
    int cased = 0;
    for (size_t i = 0; i < s.u.s.n;) {
        UChar32 cp = (UChar32)ct_u8_dec(s.u.s.p, s.u.s.n, &i);
        if (lower ? (u_isUUppercase(cp) || u_istitle(cp)) : (u_isULowercase(cp) || u_istitle(cp))) return 0;
        if (lower ? u_isULowercase(cp) : u_isUUppercase(cp)) cased = 1;
    }
    return cased;
}

/* ---- str methods ----------------------------------------------------------------------------------------- */
static int in_chars(uint32_t cp, ct_val chars) {
    for (size_t i = 0; i < chars.u.s.n;)
        if (ct_u8_dec(chars.u.s.p, chars.u.s.n, &i) == cp) return 1;
    return 0;
}

/* strip: which = 1 left, 2 right, 3 both; chars none = whitespace */
static ct_val str_strip(ct_ctx *c, ct_val s, ct_val chars, int have_chars, int which) {
    if (have_chars) need_str(c, "strip", chars);
    const char *p = s.u.s.p;
    size_t a = 0, e = s.u.s.n;
    if (which & 1)
        while (a < e) {
            size_t j = a;
            uint32_t cp = ct_u8_dec(p, e, &j);
            if (have_chars ? !in_chars(cp, chars) : !ct_is_space(cp)) break;
            a = j;
        }
    if (which & 2)
        while (e > a) {
            size_t st = e - 1;
            while (st > a && ((unsigned char)p[st] & 0xc0) == 0x80) st--;
            size_t j = st;
            uint32_t cp = ct_u8_dec(p, e, &j);
            if (have_chars ? !in_chars(cp, chars) : !ct_is_space(cp)) break;
            e = st;
        }
    return ct_str(p + a, e - a);
}

typedef struct { ct_val *v; size_t n, cap; } vvec;
static void vv_push(ct_ctx *c, vvec *v, ct_val x) {
    if (v->n == v->cap) {
        size_t nc = v->cap ? v->cap * 2 : 8;
        ct_val *nv = ct_alloc(&c->arena, nc * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}
static ct_val vv_list(ct_ctx *c, vvec *v, int tuple) {
    ct_val l = ct_list_new(&c->arena, v->n, tuple);
    if (v->n) memcpy(l.u.l->v, v->v, v->n * sizeof(ct_val));
    return l;
}

static size_t next_space(const char *p, size_t n, size_t i, int want_space) {
    while (i < n) {
        size_t j = i;
        uint32_t cp = ct_u8_dec(p, n, &j);
        if (ct_is_space(cp) == want_space) return i;
        i = j;
    }
    return n;
}

static ct_val str_split(ct_ctx *c, ct_val s, ct_val sep, int have_sep, int64_t maxsplit) {
    vvec out = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (!have_sep) {
        size_t i = 0;
        while (maxsplit-- != 0) {
            i = next_space(p, n, i, 0);
            if (i >= n) break;
            size_t j = next_space(p, n, i, 1);
            vv_push(c, &out, ct_str(p + i, j - i));
            i = j;
        }
        if (i < n) {
            i = next_space(p, n, i, 0);
            if (i < n) vv_push(c, &out, ct_str(p + i, n - i));
        }
        return vv_list(c, &out, 0);
    }
    need_str(c, "split", sep);
    if (!sep.u.s.n) ct_fail(c, KILN_ERR_INVALID_ARG, "split: empty separator");
    size_t i = 0;
    while (maxsplit-- != 0) {
        const char *f = memmem(p + i, n - i, sep.u.s.p, sep.u.s.n);
        if (!f) break;
        vv_push(c, &out, ct_str(p + i, (size_t)(f - (p + i))));
        i = (size_t)(f - p) + sep.u.s.n;
    }
    vv_push(c, &out, ct_str(p + i, n - i));
    return vv_list(c, &out, 0);
}

static size_t prev_cp(const char *p, size_t i) {
    if (!i) return 0;
    i--;
    while (i > 0 && ((unsigned char)p[i] & 0xc0) == 0x80) i--;
    return i;
}

static ct_val str_rsplit(ct_ctx *c, ct_val s, ct_val sep, int have_sep, int64_t maxsplit) {
    vvec out = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    if (!have_sep) {
        size_t e = n;
        while (maxsplit-- != 0) {
            while (e > 0) { /* skip trailing whitespace */
                size_t st = prev_cp(p, e), j = st;
                if (!ct_is_space(ct_u8_dec(p, n, &j))) break;
                e = st;
            }
            if (!e) break;
            size_t b = e;
            while (b > 0) {
                size_t st = prev_cp(p, b), j = st;
                if (ct_is_space(ct_u8_dec(p, n, &j))) break;
                b = st;
            }
            vv_push(c, &out, ct_str(p + b, e - b));
            e = b;
        }
        if (e > 0) {
            while (e > 0) {
                size_t st = prev_cp(p, e), j = st;
                if (!ct_is_space(ct_u8_dec(p, n, &j))) break;
                e = st;
            }
            size_t b = 0;
            while (b < e) {
                size_t j = b;
                if (!ct_is_space(ct_u8_dec(p, n, &j))) break;
                b = j;
            }
            (void)b;
            if (e > 0) vv_push(c, &out, ct_str(p, e));
        }
    } else {
        need_str(c, "rsplit", sep);
        if (!sep.u.s.n) ct_fail(c, KILN_ERR_INVALID_ARG, "rsplit: empty separator");
        size_t e = n;
        while (maxsplit-- != 0) {
            const char *f = NULL;
            for (size_t k = e >= sep.u.s.n ? e - sep.u.s.n + 1 : 0; k-- > 0;)
                if (memcmp(p + k, sep.u.s.p, sep.u.s.n) == 0) { f = p + k; break; }
            if (!f) break;
            size_t at = (size_t)(f - p);
            vv_push(c, &out, ct_str(p + at + sep.u.s.n, e - at - sep.u.s.n));
            e = at;
        }
        vv_push(c, &out, ct_str(p, e));
    }
    /* collected right to left */
    for (size_t i = 0; i < out.n / 2; i++) {
        ct_val t = out.v[i];
        out.v[i] = out.v[out.n - 1 - i];
        out.v[out.n - 1 - i] = t;
    }
    return vv_list(c, &out, 0);
}

static int is_line_break(uint32_t cp) {
    return cp == '\n' || cp == '\r' || cp == 0x0b || cp == 0x0c || cp == 0x1c || cp == 0x1d || cp == 0x1e ||
           cp == 0x85 || cp == 0x2028 || cp == 0x2029;
}

static ct_val str_splitlines(ct_ctx *c, ct_val s, int keepends) {
    vvec out = {0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0, start = 0;
    while (i < n) {
        size_t j = i;
        uint32_t cp = ct_u8_dec(p, n, &j);
        if (!is_line_break(cp)) {
            i = j;
            continue;
        }
        size_t eol = j;
        if (cp == '\r' && j < n && p[j] == '\n') eol = j + 1;
        vv_push(c, &out, ct_str(p + start, (keepends ? eol : i) - start));
        start = i = eol;
    }
    if (start < n) vv_push(c, &out, ct_str(p + start, n - start));
    return vv_list(c, &out, 0);
}

static ct_val str_replace(ct_ctx *c, ct_val s, ct_val old, ct_val new_, int64_t count) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n, i = 0;
    if (!old.u.s.n) { /* between every character */
        for (;;) {
            if (count-- != 0) ct_buf_put(&b, new_.u.s.p, new_.u.s.n);
            else { ct_buf_put(&b, p + i, n - i); break; }
            if (i >= n) break;
            size_t j = i;
            ct_u8_dec(p, n, &j);
            ct_buf_put(&b, p + i, j - i);
            i = j;
        }
        return ct_buf_val(&b);
    }
    while (count-- != 0) {
        const char *f = memmem(p + i, n - i, old.u.s.p, old.u.s.n);
        if (!f) break;
        ct_buf_put(&b, p + i, (size_t)(f - (p + i)));
        ct_buf_put(&b, new_.u.s.p, new_.u.s.n);
        i = (size_t)(f - p) + old.u.s.n;
    }
    ct_buf_put(&b, p + i, n - i);
    return ct_buf_val(&b);
}

/* start / end arguments (code point indices, Python slice rules) to byte offsets */
static void str_range(ct_ctx *c, const char *fn, ct_val s, ct_val st, char gs, ct_val en, char ge, size_t *a, size_t *e) {
    int64_t L = (int64_t)ct_u8_count(s.u.s.p, s.u.s.n), x = 0, y = L;
    if (!is_given_none(st, gs)) {
        x = need_int(c, fn, st);
        if (x < 0) x = x + L < 0 ? 0 : x + L;
        if (x > L) x = L;
    }
    if (!is_given_none(en, ge)) {
        y = need_int(c, fn, en);
        if (y < 0) y = y + L < 0 ? 0 : y + L;
        if (y > L) y = L;
    }
    if (y < x) y = x;
    *a = ct_u8_offset(s.u.s.p, s.u.s.n, (size_t)x);
    *e = ct_u8_offset(s.u.s.p, s.u.s.n, (size_t)y);
}

static int64_t cp_index(ct_val s, size_t byte_off) { return (int64_t)ct_u8_count(s.u.s.p, byte_off); }

static int affix(ct_ctx *c, const char *fn, ct_val s, size_t a, size_t e, ct_val x, int end) {
    if (x.t == CT_LIST && x.tuple) {
        for (size_t i = 0; i < x.u.l->n; i++)
            if (affix(c, fn, s, a, e, x.u.l->v[i], end)) return 1;
        return 0;
    }
    if (x.t != CT_STR) ct_fail(c, KILN_ERR_INVALID_ARG, "%s first arg must be str or a tuple of str, not %s", fn, ct_type_name(x));
    size_t k = x.u.s.n;
    if (k > e - a) return 0;
    return memcmp(s.u.s.p + (end ? e - k : a), x.u.s.p, k) == 0;
}

/* a minimal str.format: {} {0} {name} {{ }} with !s / !r; no format specs */
static ct_val str_format(ct_ctx *c, ct_val s, ct_args *a) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    const char *p = s.u.s.p;
    size_t n = s.u.s.n;
    int auto_idx = 0;
    for (size_t i = 0; i < n; i++) {
        char ch = p[i];
        if (ch == '{' && i + 1 < n && p[i + 1] == '{') { ct_buf_putc(&b, '{'); i++; continue; }
        if (ch == '}' && i + 1 < n && p[i + 1] == '}') { ct_buf_putc(&b, '}'); i++; continue; }
        if (ch == '}') ct_fail(c, KILN_ERR_INVALID_ARG, "format: single '}' encountered in format string");
        if (ch != '{') { ct_buf_putc(&b, ch); continue; }
        size_t j = i + 1;
        while (j < n && p[j] != '}') j++;
        if (j >= n) ct_fail(c, KILN_ERR_INVALID_ARG, "format: single '{' encountered in format string");
        const char *f = p + i + 1;
        size_t fl = j - i - 1, conv_at = fl;
        for (size_t k = 0; k < fl; k++)
            if (f[k] == '!' || f[k] == ':' || f[k] == '.' || f[k] == '[') { conv_at = k; break; }
        int repr = 0;
        if (conv_at < fl) {
            if (f[conv_at] == '!' && conv_at + 2 == fl && (f[conv_at + 1] == 'r' || f[conv_at + 1] == 's'))
                repr = f[conv_at + 1] == 'r';
            else
                ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'str.format' field '{%.*s}' (format specs, "
                        "attribute or item access)", (int)fl, f);
        }
        ct_val v;
        if (conv_at == 0) {
            if (auto_idx >= a->npos) ct_fail(c, KILN_ERR_INVALID_ARG, "format: replacement index %d out of range", auto_idx);
            v = a->pos[auto_idx++];
        } else if (f[0] >= '0' && f[0] <= '9') {
            long k = strtol(f, NULL, 10);
            if (k >= a->npos) ct_fail(c, KILN_ERR_INVALID_ARG, "format: replacement index %ld out of range", k);
            v = a->pos[k];
        } else {
            int k;
            for (k = 0; k < a->nkw; k++)
                if (strlen(a->kw[k]) == conv_at && memcmp(a->kw[k], f, conv_at) == 0) break;
            if (k == a->nkw) ct_fail(c, KILN_ERR_INVALID_ARG, "format: no argument named '%.*s'", (int)conv_at, f);
            v = a->kwv[k];
        }
        if (repr) ct_repr_of(c, &b, v);
        else ct_str_of(c, &b, v);
        i = j;
    }
    return ct_buf_val(&b);
}

static ct_val pad(ct_ctx *c, ct_val s, int64_t width, ct_val fill, char gfill, int mode /* 0 center 1 ljust 2 rjust */) {
    uint32_t fc = ' ';
    if (gfill) {
        need_str(c, "fillchar", fill);
        if (ct_u8_count(fill.u.s.p, fill.u.s.n) != 1)
            ct_fail(c, KILN_ERR_INVALID_ARG, "the fill character must be exactly one character long");
        size_t i = 0;
        fc = ct_u8_dec(fill.u.s.p, fill.u.s.n, &i);
    }
    int64_t len = (int64_t)ct_u8_count(s.u.s.p, s.u.s.n);
    if (width <= len) return s;
    if (width > (1 << 24)) ct_fail(c, KILN_ERR_INVALID_ARG, "width %lld too large", (long long)width);
    int64_t marg = width - len, left = mode == 1 ? 0 : mode == 2 ? marg : marg / 2 + (marg & width & 1);
    ct_buf b = {&c->arena, NULL, 0, 0};
    for (int64_t i = 0; i < left; i++) ct_u8_enc(&b, fc);
    ct_buf_put(&b, s.u.s.p, s.u.s.n);
    for (int64_t i = 0; i < marg - left; i++) ct_u8_enc(&b, fc);
    return ct_buf_val(&b);
}

static ct_val str_method(ct_ctx *c, int id, ct_val s, ct_args *a) {
    const char *fn = STR_METHODS[id];
    ct_val v[4];
    char g[4];
    static const char *const P_PREFIX[] = {"prefix", "start", "end"};
    static const char *const P_SPLIT[] = {"sep", "maxsplit"};
    static const char *const P_KEEP[] = {"keepends"};
    static const char *const P_CHARS[] = {"chars"};
    static const char *const P_REPLACE[] = {"old", "new", "count"};
    static const char *const P_FIND[] = {"sub", "start", "end"};
    static const char *const P_ONE[] = {"x"};
    static const char *const P_NONE[] = {NULL};
    static const char *const P_PAD[] = {"width", "fillchar"};
    size_t x, e;
    switch (id) {
    case S_STARTSWITH:
    case S_ENDSWITH:
        bind(c, fn, a, P_PREFIX, 3, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes at least 1 argument", fn);
        str_range(c, fn, s, v[1], g[1], v[2], g[2], &x, &e);
        return ct_bool(affix(c, fn, s, x, e, v[0], id == S_ENDSWITH));
    case S_SPLIT:
    case S_RSPLIT: {
        bind(c, fn, a, P_SPLIT, 2, v, g);
        int64_t maxsplit = is_given_none(v[1], g[1]) ? -1 : need_int(c, fn, v[1]);
        int have = !is_given_none(v[0], g[0]);
        return id == S_SPLIT ? str_split(c, s, v[0], have, maxsplit) : str_rsplit(c, s, v[0], have, maxsplit);
    }
    case S_SPLITLINES:
        bind(c, fn, a, P_KEEP, 1, v, g);
        return str_splitlines(c, s, g[0] && ct_truthy(c, v[0]));
    case S_STRIP:
    case S_LSTRIP:
    case S_RSTRIP:
        bind(c, fn, a, P_CHARS, 1, v, g);
        return str_strip(c, s, v[0], !is_given_none(v[0], g[0]), id == S_STRIP ? 3 : id == S_LSTRIP ? 1 : 2);
    case S_UPPER: case S_LOWER: case S_CASEFOLD:
        bind(c, fn, a, P_NONE, 0, v, g);
        return case_map(c, s, id == S_UPPER);
    case S_TITLE: bind(c, fn, a, P_NONE, 0, v, g); return str_title(c, s);
    case S_CAPITALIZE: bind(c, fn, a, P_NONE, 0, v, g); return str_capitalize(c, s);
    case S_SWAPCASE: bind(c, fn, a, P_NONE, 0, v, g); return str_swapcase(c, s);
    case S_REPLACE:
        bind(c, fn, a, P_REPLACE, 3, v, g);
        if (!g[0] || !g[1]) ct_fail(c, KILN_ERR_INVALID_ARG, "replace() takes at least 2 arguments");
        return str_replace(c, s, need_str(c, fn, v[0]), need_str(c, fn, v[1]), g[2] ? need_int(c, fn, v[2]) : -1);
    case S_FIND: case S_RFIND: case S_INDEX: case S_RINDEX: case S_COUNT: {
        bind(c, fn, a, P_FIND, 3, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes at least 1 argument", fn);
        ct_val sub = need_str(c, fn, v[0]);
        str_range(c, fn, s, v[1], g[1], v[2], g[2], &x, &e);
        const char *p = s.u.s.p;
        if (id == S_COUNT) {
            if (!sub.u.s.n) return ct_int((int64_t)ct_u8_count(p + x, e - x) + 1);
            int64_t k = 0;
            for (size_t i = x; i + sub.u.s.n <= e;) {
                const char *f = memmem(p + i, e - i, sub.u.s.p, sub.u.s.n);
                if (!f) break;
                k++;
                i = (size_t)(f - p) + sub.u.s.n;
            }
            return ct_int(k);
        }
        int64_t at = -1;
        if (sub.u.s.n <= e - x) {
            if (id == S_FIND || id == S_INDEX) {
                const char *f = memmem(p + x, e - x, sub.u.s.p, sub.u.s.n);
                if (f) at = cp_index(s, (size_t)(f - p));
            } else {
                for (size_t k = e - sub.u.s.n + 1; k-- > x;)
                    if (memcmp(p + k, sub.u.s.p, sub.u.s.n) == 0) { at = cp_index(s, k); break; }
            }
        }
        if (at < 0 && (id == S_INDEX || id == S_RINDEX)) ct_fail(c, KILN_ERR_INVALID_ARG, "%s: substring not found", fn);
        return ct_int(at);
    }
    case S_JOIN: {
        bind(c, fn, a, P_ONE, 1, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "join() takes exactly one argument");
        ct_val l = ct_list_of(c, v[0]);
        ct_buf b = {&c->arena, NULL, 0, 0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            ct_val it = l.u.l->v[i];
            if (it.t != CT_STR)
                ct_fail(c, KILN_ERR_INVALID_ARG, "sequence item %zu: expected str instance, %s found", i, ct_type_name(it));
            if (i) ct_buf_put(&b, s.u.s.p, s.u.s.n);
            ct_buf_put(&b, it.u.s.p, it.u.s.n);
        }
        return ct_buf_val(&b);
    }
    case S_ISDIGIT: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_is(s, CLS_DIGIT));
    case S_ISALPHA: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_is(s, CLS_ALPHA));
    case S_ISALNUM: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_is(s, CLS_ALNUM));
    case S_ISSPACE: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_is(s, CLS_SPACE));
    case S_ISDECIMAL: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_is(s, CLS_DECIMAL));
    case S_ISNUMERIC: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_is(s, CLS_NUMERIC));
    case S_ISLOWER: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_case_is(s, 1));
    case S_ISUPPER: bind(c, fn, a, P_NONE, 0, v, g); return ct_bool(str_case_is(s, 0));
    case S_FORMAT: return str_format(c, s, a);
    case S_CENTER: case S_LJUST: case S_RJUST:
        bind(c, fn, a, P_PAD, 2, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes at least 1 argument", fn);
        return pad(c, s, need_int(c, fn, v[0]), v[1], g[1], id == S_CENTER ? 0 : id == S_LJUST ? 1 : 2);
    case S_ZFILL: {
        bind(c, fn, a, P_PAD, 1, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "zfill() takes exactly one argument");
        int64_t w = need_int(c, fn, v[0]), len = (int64_t)ct_u8_count(s.u.s.p, s.u.s.n);
        if (w <= len) return s;
        if (w > (1 << 24)) ct_fail(c, KILN_ERR_INVALID_ARG, "width too large");
        ct_buf b = {&c->arena, NULL, 0, 0};
        size_t k = 0;
        if (s.u.s.n && (s.u.s.p[0] == '+' || s.u.s.p[0] == '-')) ct_buf_putc(&b, s.u.s.p[k++]);
        for (int64_t i = 0; i < w - len; i++) ct_buf_putc(&b, '0');
        ct_buf_put(&b, s.u.s.p + k, s.u.s.n - k);
        return ct_buf_val(&b);
    }
    case S_PARTITION: case S_RPARTITION: {
        bind(c, fn, a, P_ONE, 1, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes exactly one argument", fn);
        ct_val sep = need_str(c, fn, v[0]);
        if (!sep.u.s.n) ct_fail(c, KILN_ERR_INVALID_ARG, "%s: empty separator", fn);
        const char *p = s.u.s.p, *f = NULL;
        size_t n = s.u.s.n;
        if (id == S_PARTITION) f = memmem(p, n, sep.u.s.p, sep.u.s.n);
        else if (sep.u.s.n <= n)
            for (size_t k = n - sep.u.s.n + 1; k-- > 0;)
                if (memcmp(p + k, sep.u.s.p, sep.u.s.n) == 0) { f = p + k; break; }
        ct_val t = ct_list_new(&c->arena, 3, 1);
        if (!f) {
            t.u.l->v[0] = id == S_PARTITION ? s : ct_str("", 0);
            t.u.l->v[1] = ct_str("", 0);
            t.u.l->v[2] = id == S_PARTITION ? ct_str("", 0) : s;
        } else {
            t.u.l->v[0] = ct_str(p, (size_t)(f - p));
            t.u.l->v[1] = sep;
            t.u.l->v[2] = ct_str(f + sep.u.s.n, n - (size_t)(f - p) - sep.u.s.n);
        }
        return t;
    }
    case S_REMOVEPREFIX: case S_REMOVESUFFIX: {
        bind(c, fn, a, P_ONE, 1, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes exactly one argument", fn);
        ct_val x2 = need_str(c, fn, v[0]);
        if (x2.u.s.n > s.u.s.n) return s;
        if (id == S_REMOVEPREFIX)
            return memcmp(s.u.s.p, x2.u.s.p, x2.u.s.n) == 0 ? ct_str(s.u.s.p + x2.u.s.n, s.u.s.n - x2.u.s.n) : s;
        return memcmp(s.u.s.p + s.u.s.n - x2.u.s.n, x2.u.s.p, x2.u.s.n) == 0 ? ct_str(s.u.s.p, s.u.s.n - x2.u.s.n) : s;
    }
    }
    ct_fail(c, KILN_ERR_INTERNAL, "internal error: str method %d", id);
}

ct_val ct_call_method(ct_ctx *c, ct_val m, ct_args *a) {
    ct_val self = *m.u.self, v[2];
    char g[2];
    static const char *const P_GET[] = {"key", "default"};
    static const char *const P_NONE[] = {NULL};
    static const char *const P_ONE[] = {"x"};
    if (m.fn < 100) return str_method(c, m.fn, self, a);
    switch (m.fn) {
    case D_ITEMS: {
        bind(c, "items", a, P_NONE, 0, v, g);
        ct_val l = ct_list_new(&c->arena, self.u.d->n, 0);
        for (size_t i = 0; i < self.u.d->n; i++) {
            ct_val t = ct_list_new(&c->arena, 2, 1);
            t.u.l->v[0] = self.u.d->k[i];
            t.u.l->v[1] = self.u.d->v[i];
            l.u.l->v[i] = t;
        }
        l.view = 1;
        return l;
    }
    case D_KEYS: {
        bind(c, "keys", a, P_NONE, 0, v, g);
        ct_val l = ct_list_of(c, self);
        l.view = 2;
        return l;
    }
    case D_VALUES: {
        bind(c, "values", a, P_NONE, 0, v, g);
        ct_val l = ct_list_new(&c->arena, self.u.d->n, 0);
        memcpy(l.u.l->v, self.u.d->v, self.u.d->n * sizeof(ct_val));
        l.view = 3;
        return l;
    }
    case D_GET: {
        bind(c, "get", a, P_GET, 2, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "get expected at least 1 argument, got 0");
        ct_val *r = ct_dict_get(self.u.d, v[0]);
        return r ? *r : g[1] ? v[1] : ct_none();
    }
    case D_COPY: bind(c, "copy", a, P_NONE, 0, v, g); return self;
    case L_COPY: bind(c, "copy", a, P_NONE, 0, v, g); return self;
    case L_INDEX:
    case L_COUNT: {
        bind(c, m.fn == L_INDEX ? "index" : "count", a, P_ONE, 1, v, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "%s() takes exactly one argument", m.fn == L_INDEX ? "index" : "count");
        int64_t k = 0;
        for (size_t i = 0; i < self.u.l->n; i++)
            if (ct_equal(self.u.l->v[i], v[0])) {
                if (m.fn == L_INDEX) return ct_int((int64_t)i);
                k++;
            }
        if (m.fn == L_INDEX) ct_fail(c, KILN_ERR_INVALID_ARG, "list.index(x): x not in list");
        return ct_int(k);
    }
    case LP_CYCLE:
        if (!a->npos) ct_fail(c, KILN_ERR_INVALID_ARG, "loop.cycle: no items for cycling given");
        return a->pos[self.u.loop->index0 % (size_t)a->npos];
    case LP_CHANGED: ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'loop.changed'");
    }
    ct_fail(c, KILN_ERR_INTERNAL, "internal error: method %d", m.fn);
}

/* ---- tests ------------------------------------------------------------------------------------------------ */
static int sameas(ct_val a, ct_val b) {
    if (a.t != b.t) return 0;
    switch (a.t) {
    case CT_NONE: case CT_UNDEF: return 1;
    case CT_BOOL: return a.u.i == b.u.i;
    case CT_INT: return a.u.i == b.u.i && a.u.i >= -5 && a.u.i <= 256; /* CPython's small-int cache */
    case CT_STR: return a.u.s.p == b.u.s.p && a.u.s.n == b.u.s.n;
    case CT_LIST: return a.u.l == b.u.l;
    case CT_DICT: case CT_NS: return a.u.d == b.u.d;
    default: return ct_equal(a, b);
    }
}

int ct_call_test(ct_ctx *c, int id, ct_val v, ct_args *a) {
    ct_val x[1];
    char g[1];
    static const char *const P_OTHER[] = {"other"};
    static const char *const P_NUM[] = {"num"};
    static const char *const P_SEQ[] = {"seq"};
    static const char *const P_NONE[] = {NULL};
    const char *fn = TESTS[id];
    switch (id) {
    case T_EQ: case T_EQUALTO: case T_EQ2: case T_NE: case T_NE2: case T_GE: case T_GE2: case T_GT: case T_GT2:
    case T_GREATERTHAN: case T_LE: case T_LE2: case T_LT: case T_LT2: case T_LESSTHAN: case T_SAMEAS:
        bind(c, fn, a, P_OTHER, 1, x, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "test '%s' needs an argument", fn);
        break;
    case T_DIVISIBLEBY: bind(c, fn, a, P_NUM, 1, x, g); if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "test 'divisibleby' needs an argument"); break;
    case T_IN: bind(c, fn, a, P_SEQ, 1, x, g); if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "test 'in' needs an argument"); break;
    default: bind(c, fn, a, P_NONE, 0, x, g); break;
    }
    switch (id) {
    case T_BOOLEAN: return v.t == CT_BOOL;
    case T_CALLABLE: /* Undefined defines __call__ (which fails) */
        return v.t == CT_MACRO || v.t == CT_FUNC || v.t == CT_METHOD || v.t == CT_LOOP || v.t == CT_UNDEF;
    case T_DEFINED: return v.t != CT_UNDEF;
    case T_UNDEFINED: return v.t == CT_UNDEF;
    case T_NONE: return v.t == CT_NONE;
    case T_TRUE: return v.t == CT_BOOL && v.u.i;
    case T_FALSE: return v.t == CT_BOOL && !v.u.i;
    case T_INTEGER: return v.t == CT_INT;
    case T_FLOAT: return v.t == CT_FLOAT;
    case T_NUMBER: return v.t == CT_INT || v.t == CT_FLOAT || v.t == CT_BOOL;
    case T_STRING: return v.t == CT_STR;
    case T_MAPPING: return v.t == CT_DICT;
    case T_ITERABLE: return v.t == CT_STR || v.t == CT_LIST || v.t == CT_DICT || v.t == CT_UNDEF || v.t == CT_LOOP;
    case T_SEQUENCE: return v.t == CT_STR || v.t == CT_LIST || v.t == CT_DICT || v.t == CT_UNDEF;
    case T_ESCAPED: return 0;
    case T_LOWER: return str_case_is(ct_to_str(c, v), 1);
    case T_UPPER: return str_case_is(ct_to_str(c, v), 0);
    case T_ODD: case T_EVEN: case T_DIVISIBLEBY: {
        ct_val d = id == T_DIVISIBLEBY ? x[0] : ct_int(2);
        if ((v.t != CT_INT && v.t != CT_BOOL && v.t != CT_FLOAT) || (d.t != CT_INT && d.t != CT_BOOL && d.t != CT_FLOAT))
            ct_fail(c, KILN_ERR_INVALID_ARG, "test '%s': expected numbers, got '%s'", fn, ct_type_name(v));
        double m;
        if (v.t != CT_FLOAT && d.t != CT_FLOAT) {
            if (!d.u.i) ct_fail(c, KILN_ERR_INVALID_ARG, "integer division or modulo by zero");
            int64_t r = v.u.i % d.u.i;
            m = (double)r;
        } else {
            double dv = d.t == CT_FLOAT ? d.u.f : (double)d.u.i;
            if (dv == 0) ct_fail(c, KILN_ERR_INVALID_ARG, "float modulo by zero");
            m = fmod(v.t == CT_FLOAT ? v.u.f : (double)v.u.i, dv);
        }
        return id == T_ODD ? m != 0 : m == 0;
    }
    case T_EQ: case T_EQUALTO: case T_EQ2: return ct_equal(v, x[0]);
    case T_NE: case T_NE2: return !ct_equal(v, x[0]);
    case T_GE: case T_GE2: return ct_compare(c, v, x[0]) >= 0;
    case T_GT: case T_GT2: case T_GREATERTHAN: return ct_compare(c, v, x[0]) > 0;
    case T_LE: case T_LE2: return ct_compare(c, v, x[0]) <= 0;
    case T_LT: case T_LT2: case T_LESSTHAN: return ct_compare(c, v, x[0]) < 0;
    case T_SAMEAS: return sameas(v, x[0]);
    case T_IN: {
        ct_val seq = x[0];
        if (seq.t == CT_STR) {
            if (v.t != CT_STR) ct_fail(c, KILN_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s", ct_type_name(v));
            return !v.u.s.n || memmem(seq.u.s.p, seq.u.s.n, v.u.s.p, v.u.s.n) != NULL;
        }
        if (seq.t == CT_DICT) return ct_dict_get(seq.u.d, v) != NULL;
        ct_val l = ct_list_of(c, seq);
        for (size_t i = 0; i < l.u.l->n; i++)
            if (ct_equal(l.u.l->v[i], v)) return 1;
        return 0;
    }
    case T_FILTER: return v.t == CT_STR && ct_filter_id(v.u.s.p, v.u.s.n) >= 0; /* `'name' is filter` */
    case T_TEST: return v.t == CT_STR && ct_test_id(v.u.s.p, v.u.s.n) >= 0;
    }
    ct_fail(c, KILN_ERR_INTERNAL, "internal error: test %d", id);
}

/* ---- filters ------------------------------------------------------------------------------------------------ */
/* jinja2's make_attrgetter: "a.b.0" -> getitem per part (digits are ints) */
static ct_val attr_get(ct_ctx *c, ct_val obj, ct_val attr, ct_val dflt, int have_default) {
    ct_val r = obj;
    if (attr.t == CT_INT) {
        r = ct_getitem(c, r, attr);
    } else {
        if (attr.t != CT_STR) ct_fail(c, KILN_ERR_INVALID_ARG, "attribute must be a string or an integer, not %s", ct_type_name(attr));
        const char *p = attr.u.s.p;
        size_t n = attr.u.s.n, i = 0;
        while (i <= n) {
            size_t j = i;
            while (j < n && p[j] != '.') j++;
            int digits = j > i;
            for (size_t k = i; k < j; k++)
                if (p[k] < '0' || p[k] > '9') digits = 0;
            ct_val key = digits ? ct_int(strtoll(ct_strndup(&c->arena, p + i, j - i), NULL, 10)) : ct_str(p + i, j - i);
            r = ct_getitem(c, r, key);
            i = j + 1;
        }
    }
    if (have_default && r.t == CT_UNDEF) r = dflt;
    return r;
}

/* stable merge sort of vals by key (key may be NULL: the values themselves) */
static void msort(ct_ctx *c, ct_val *vals, ct_val *keys, size_t n, int reverse, ct_val *tv, ct_val *tk) {
    if (n < 2) return;
    size_t h = n / 2;
    msort(c, vals, keys, h, reverse, tv, tk);
    msort(c, vals + h, keys + h, n - h, reverse, tv, tk);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        int cmp = ct_compare(c, keys[j], keys[i]);
        int take_right = reverse ? cmp > 0 : cmp < 0;
        if (take_right) { tv[k] = vals[j]; tk[k++] = keys[j++]; }
        else { tv[k] = vals[i]; tk[k++] = keys[i++]; }
    }
    while (i < h) { tv[k] = vals[i]; tk[k++] = keys[i++]; }
    while (j < n) { tv[k] = vals[j]; tk[k++] = keys[j++]; }
    memcpy(vals, tv, n * sizeof *vals);
    memcpy(keys, tk, n * sizeof *keys);
}

/* the comparison key jinja uses: lower-cased strings unless case_sensitive */
static ct_val sort_key(ct_ctx *c, ct_val v, int case_sensitive) {
    if (!case_sensitive && v.t == CT_STR) return case_map(c, v, 0);
    return v;
}

static ct_val sorted(ct_ctx *c, ct_val list, int reverse, int case_sensitive, ct_val attr, int have_attr) {
    size_t n = list.u.l->n;
    ct_val r = ct_list_new(&c->arena, n, 0);
    ct_val *keys = ct_alloc(&c->arena, (n ? n : 1) * sizeof *keys), *tv = ct_alloc(&c->arena, (n ? n : 1) * sizeof *tv),
           *tk = ct_alloc(&c->arena, (n ? n : 1) * sizeof *tk);
    for (size_t i = 0; i < n; i++) {
        r.u.l->v[i] = list.u.l->v[i];
        keys[i] = sort_key(c, have_attr ? attr_get(c, list.u.l->v[i], attr, ct_none(), 0) : list.u.l->v[i], case_sensitive);
    }
    msort(c, r.u.l->v, keys, n, reverse, tv, tk);
    return r;
}

static ct_val html_escape(ct_ctx *c, ct_val s) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    for (size_t i = 0; i < s.u.s.n; i++) {
        char ch = s.u.s.p[i];
        switch (ch) {
        case '&': ct_buf_put(&b, "&amp;", 5); break;
        case '<': ct_buf_put(&b, "&lt;", 4); break;
        case '>': ct_buf_put(&b, "&gt;", 4); break;
        case '"': ct_buf_put(&b, "&#34;", 5); break;
        case '\'': ct_buf_put(&b, "&#39;", 5); break;
        default: ct_buf_putc(&b, ch);
        }
    }
    return ct_buf_val(&b);
}

/* Python float(str): strips whitespace, accepts underscores between digits, inf / nan */
static int parse_float(ct_ctx *c, ct_val s, double *out) {
    ct_val t = str_strip(c, s, ct_none(), 0, 3);
    if (!t.u.s.n || t.u.s.n > 400) return 0;
    char buf[512];
    size_t k = 0;
    for (size_t i = 0; i < t.u.s.n; i++) {
        char ch = t.u.s.p[i];
        if (ch == '_') {
            if (!i || i + 1 >= t.u.s.n || !(t.u.s.p[i - 1] >= '0' && t.u.s.p[i - 1] <= '9') ||
                !(t.u.s.p[i + 1] >= '0' && t.u.s.p[i + 1] <= '9'))
                return 0;
            continue;
        }
        if ((unsigned char)ch >= 0x80) return 0;
        buf[k++] = ch;
    }
    buf[k] = 0;
    if (k > 1 && (buf[0] == '0' || ((buf[0] == '+' || buf[0] == '-') && buf[1] == '0')) && strpbrk(buf, "xXpP")) return 0;
    char *end;
    double d = strtod(buf, &end);
    if (*end) return 0;
    const char *alpha = buf + (buf[0] == '+' || buf[0] == '-');
    if ((alpha[0] | 32) == 'i' && strcasecmp(alpha, "inf") && strcasecmp(alpha, "infinity")) return 0;
    if ((alpha[0] | 32) == 'n' && strcasecmp(alpha, "nan")) return 0;
    *out = d;
    return 1;
}

/* Python int(str, base): whitespace, sign, underscores, base prefixes for base 0/2/8/16 */
static int parse_int(ct_ctx *c, ct_val s, int base, int64_t *out) {
    ct_val t = str_strip(c, s, ct_none(), 0, 3);
    if (!t.u.s.n || t.u.s.n > 200) return 0;
    char buf[256];
    size_t k = 0, i = 0;
    const char *p = t.u.s.p;
    size_t n = t.u.s.n;
    int neg = 0;
    if (p[0] == '+' || p[0] == '-') { neg = p[0] == '-'; i++; }
    if (i + 1 < n && p[i] == '0' && ((p[i + 1] | 32) == 'x' || (p[i + 1] | 32) == 'o' || (p[i + 1] | 32) == 'b')) {
        int pb = (p[i + 1] | 32) == 'x' ? 16 : (p[i + 1] | 32) == 'o' ? 8 : 2;
        if (base == 0 || base == pb) { base = pb; i += 2; if (i < n && p[i] == '_') i++; }
    }
    if (base == 0) base = 10;
    for (; i < n; i++) {
        char ch = p[i];
        if (ch == '_' && k && i + 1 < n && p[i + 1] != '_') continue;
        int d = ch >= '0' && ch <= '9' ? ch - '0' : (ch | 32) >= 'a' && (ch | 32) <= 'z' ? (ch | 32) - 'a' + 10 : 99;
        if (d >= base) return 0;
        buf[k++] = ch;
    }
    if (!k) return 0;
    buf[k] = 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, base);
    if (*end || v > (unsigned long long)INT64_MAX + (unsigned long long)neg) ct_fail(c, KILN_ERR_UNSUPPORTED, "integer '%.*s' beyond 64 bits", (int)n, p);
    *out = neg ? (int64_t)(0 - v) : (int64_t)v;
    return 1;
}

/* Python round(x, ndigits) for floats: correctly rounded, ties to even (via printf's exact rounding) */
static double py_round(double x, int64_t nd) {
    if (!isfinite(x)) return x;
    if (nd > 300) return x;
    if (nd < -308) return 0.0 * x;
    if (nd >= 0) {
        char buf[512];
        snprintf(buf, sizeof buf, "%.*f", (int)nd, x);
        return strtod(buf, NULL);
    }
    double p = pow(10.0, (double)-nd);
    double y = x / p, r = nearbyint(y);
    return r * p;
}

/* %-formatting for the format filter: %s %r %d %i %f %F %e %E %g %G %x %X %o %c %% with flags, width, precision */
static ct_val percent_format(ct_ctx *c, ct_val fmt, ct_val *args, int nargs) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    const char *p = fmt.u.s.p;
    size_t n = fmt.u.s.n;
    int ai = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] != '%') { ct_buf_putc(&b, p[i]); continue; }
        size_t j = i + 1;
        char spec[32];
        size_t k = 0;
        spec[k++] = '%';
        while (j < n && strchr("-+ 0#", p[j]) && k < 8) spec[k++] = p[j++];
        while (j < n && p[j] >= '0' && p[j] <= '9' && k < 16) spec[k++] = p[j++];
        if (j < n && p[j] == '.') {
            spec[k++] = p[j++];
            while (j < n && p[j] >= '0' && p[j] <= '9' && k < 24) spec[k++] = p[j++];
        }
        if (j >= n) ct_fail(c, KILN_ERR_INVALID_ARG, "format: incomplete format");
        char conv = p[j];
        if (conv == '%') { ct_buf_putc(&b, '%'); i = j; continue; }
        if (conv == '(' || conv == '*') ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'format' with '%%%c'", conv);
        if (ai >= nargs) ct_fail(c, KILN_ERR_INVALID_ARG, "format: not enough arguments for format string");
        ct_val v = args[ai++];
        switch (conv) {
        case 's': case 'r': {
            ct_buf t = {&c->arena, NULL, 0, 0};
            if (conv == 'r') ct_repr_of(c, &t, v);
            else ct_str_of(c, &t, v);
            spec[k++] = 's';
            spec[k] = 0;
            ct_val tv = ct_buf_val(&t);
            ct_buf_printf(&b, spec, ct_strndup(&c->arena, tv.u.s.p, tv.u.s.n));
            break;
        }
        case 'd': case 'i': case 'x': case 'X': case 'o': case 'c': {
            int64_t iv;
            if (v.t == CT_INT || v.t == CT_BOOL) iv = v.u.i;
            else if (v.t == CT_FLOAT && conv != 'c' && conv != 'x' && conv != 'X' && conv != 'o') iv = (int64_t)v.u.f;
            else ct_fail(c, KILN_ERR_INVALID_ARG, "format: %%%c format: a number is required, not %s", conv, ct_type_name(v));
            if (conv == 'c') {
                ct_u8_enc(&b, (uint32_t)iv);
                break;
            }
            spec[k++] = 'l';
            spec[k++] = 'l';
            spec[k++] = conv == 'i' ? 'd' : conv;
            spec[k] = 0;
            ct_buf_printf(&b, spec, (long long)iv);
            break;
        }
        case 'f': case 'F': case 'e': case 'E': case 'g': case 'G': {
            if (v.t != CT_INT && v.t != CT_BOOL && v.t != CT_FLOAT)
                ct_fail(c, KILN_ERR_INVALID_ARG, "format: must be real number, not %s", ct_type_name(v));
            double d = v.t == CT_FLOAT ? v.u.f : (double)v.u.i;
            spec[k++] = conv;
            spec[k] = 0;
            ct_buf_printf(&b, spec, d);
            break;
        }
        default: ct_fail(c, KILN_ERR_INVALID_ARG, "format: unsupported format character '%c'", conv);
        }
        i = j;
    }
    if (ai < nargs) ct_fail(c, KILN_ERR_INVALID_ARG, "format: not all arguments converted during string formatting");
    return ct_buf_val(&b);
}

static ct_val select_common(ct_ctx *c, ct_val v, ct_args *a, int attr_mode, int reject) {
    ct_val l = ct_list_of(c, v);
    int off = attr_mode ? 1 : 0;
    if (attr_mode && a->npos < 1) ct_fail(c, KILN_ERR_INVALID_ARG, "%s: missing the attribute name", reject ? "rejectattr" : "selectattr");
    if (a->nkw) ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct: keyword arguments to select / reject");
    int tid = -1;
    if (a->npos > off) {
        ct_val tn = a->pos[off];
        if (tn.t != CT_STR) ct_fail(c, KILN_ERR_INVALID_ARG, "select / reject: the test name must be a string");
        tid = ct_test_id(tn.u.s.p, tn.u.s.n);
        if (tid < 0) ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'test %.*s'", (int)tn.u.s.n, tn.u.s.p);
    }
    ct_args ta = {a->pos + off + 1, a->npos > off + 1 ? a->npos - off - 1 : 0, NULL, NULL, 0};
    vvec out = {0};
    for (size_t i = 0; i < l.u.l->n; i++) {
        ct_val item = l.u.l->v[i], x = attr_mode ? attr_get(c, item, a->pos[0], ct_none(), 0) : item;
        int ok = tid < 0 ? ct_truthy(c, x) : ct_call_test(c, tid, x, &ta);
        if (ok != reject) vv_push(c, &out, item);
    }
    return vv_list(c, &out, 0);
}

ct_val ct_call_filter(ct_ctx *c, int id, ct_val v, ct_args *a) {
    const char *fn = FILTERS[id];
    ct_val x[5];
    char g[5];
    static const char *const P_NONE[] = {NULL};
    static const char *const P_DEFAULT[] = {"default_value", "boolean"};
    static const char *const P_JOIN[] = {"d", "attribute"};
    static const char *const P_SORT[] = {"reverse", "case_sensitive", "attribute"};
    static const char *const P_UNIQUE[] = {"case_sensitive", "attribute"};
    static const char *const P_DICTSORT[] = {"case_sensitive", "by", "reverse"};
    static const char *const P_INT[] = {"default", "base"};
    static const char *const P_FLOAT[] = {"default"};
    static const char *const P_ROUND[] = {"precision", "method"};
    static const char *const P_REPLACE[] = {"old", "new", "count"};
    static const char *const P_TRIM[] = {"chars"};
    static const char *const P_INDENT[] = {"width", "first", "blank"};
    static const char *const P_TOJSON[] = {"ensure_ascii", "indent", "separators", "sort_keys"};
    static const char *const P_SUM[] = {"attribute", "start"};
    static const char *const P_BATCH[] = {"linecount", "fill_with"};
    static const char *const P_CENTER[] = {"width"};
    static const char *const P_ATTR[] = {"name"};
    switch (id) {
    case F_DEFAULT: case F_D:
        bind(c, fn, a, P_DEFAULT, 2, x, g);
        if (v.t == CT_UNDEF || (g[1] && ct_truthy(c, x[1]) && !ct_truthy(c, v))) return g[0] ? x[0] : ct_str("", 0);
        return v;
    case F_LENGTH: case F_COUNT:
        bind(c, fn, a, P_NONE, 0, x, g);
        switch (v.t) {
        case CT_STR: return ct_int((int64_t)ct_u8_count(v.u.s.p, v.u.s.n));
        case CT_LIST: return ct_int((int64_t)v.u.l->n);
        case CT_DICT: return ct_int((int64_t)v.u.d->n);
        case CT_UNDEF: return ct_int(0);
        default: ct_fail(c, KILN_ERR_INVALID_ARG, "object of type '%s' has no len()", ct_type_name(v));
        }
    case F_FIRST: case F_LAST: {
        bind(c, fn, a, P_NONE, 0, x, g);
        if (v.t == CT_UNDEF && id == F_LAST) ct_fail(c, KILN_ERR_INVALID_ARG, "last: the value is undefined");
        ct_val l = ct_list_of(c, v);
        if (!l.u.l->n) return ct_undef(id == F_FIRST ? "No first item, sequence was empty." : "No last item, sequence was empty.", 34);
        return l.u.l->v[id == F_FIRST ? 0 : l.u.l->n - 1];
    }
    case F_JOIN: {
        bind(c, fn, a, P_JOIN, 2, x, g);
        ct_val sep = g[0] ? ct_to_str(c, x[0]) : ct_str("", 0);
        ct_val l = ct_list_of(c, v);
        ct_buf b = {&c->arena, NULL, 0, 0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            if (i) ct_buf_put(&b, sep.u.s.p, sep.u.s.n);
            ct_str_of(c, &b, g[1] && x[1].t != CT_NONE ? attr_get(c, l.u.l->v[i], x[1], ct_none(), 0) : l.u.l->v[i]);
        }
        return ct_buf_val(&b);
    }
    case F_LIST: bind(c, fn, a, P_NONE, 0, x, g); return ct_list_of(c, v);
    case F_REVERSE: {
        bind(c, fn, a, P_NONE, 0, x, g);
        if (v.t == CT_STR) {
            ct_val l = ct_list_of(c, v);
            ct_buf b = {&c->arena, NULL, 0, 0};
            for (size_t i = l.u.l->n; i-- > 0;) ct_buf_put(&b, l.u.l->v[i].u.s.p, l.u.l->v[i].u.s.n);
            return ct_buf_val(&b);
        }
        ct_val l = ct_list_of(c, v), r = ct_list_new(&c->arena, l.u.l->n, 0);
        for (size_t i = 0; i < l.u.l->n; i++) r.u.l->v[i] = l.u.l->v[l.u.l->n - 1 - i];
        return r;
    }
    case F_SORT:
        bind(c, fn, a, P_SORT, 3, x, g);
        return sorted(c, ct_list_of(c, v), g[0] && ct_truthy(c, x[0]), g[1] && ct_truthy(c, x[1]), x[2],
                      g[2] && x[2].t != CT_NONE);
    case F_UNIQUE: {
        bind(c, fn, a, P_UNIQUE, 2, x, g);
        ct_val l = ct_list_of(c, v);
        vvec out = {0}, seen = {0};
        for (size_t i = 0; i < l.u.l->n; i++) {
            ct_val k = sort_key(c, g[1] && x[1].t != CT_NONE ? attr_get(c, l.u.l->v[i], x[1], ct_none(), 0) : l.u.l->v[i],
                                g[0] && ct_truthy(c, x[0]));
            size_t j;
            for (j = 0; j < seen.n; j++)
                if (ct_equal(seen.v[j], k)) break;
            if (j < seen.n) continue;
            vv_push(c, &seen, k);
            vv_push(c, &out, l.u.l->v[i]);
        }
        return vv_list(c, &out, 0);
    }
    case F_ITEMS: {
        bind(c, fn, a, P_NONE, 0, x, g);
        if (v.t == CT_UNDEF) return ct_list_new(&c->arena, 0, 0);
        if (v.t != CT_DICT) ct_fail(c, KILN_ERR_INVALID_ARG, "items: can only get item pairs from a mapping, not %s", ct_type_name(v));
        ct_val m = {0};
        m.t = CT_METHOD;
        m.fn = D_ITEMS;
        m.u.self = &v;
        ct_args none = {NULL, 0, NULL, NULL, 0};
        return ct_call_method(c, m, &none);
    }
    case F_DICTSORT: {
        bind(c, fn, a, P_DICTSORT, 3, x, g);
        if (v.t != CT_DICT) ct_fail(c, KILN_ERR_INVALID_ARG, "dictsort: expected a mapping, got %s", ct_type_name(v));
        int by_value = 0;
        if (g[1]) {
            ct_val by = need_str(c, fn, x[1]);
            if (by.u.s.n == 5 && memcmp(by.u.s.p, "value", 5) == 0) by_value = 1;
            else if (!(by.u.s.n == 3 && memcmp(by.u.s.p, "key", 3) == 0))
                ct_fail(c, KILN_ERR_INVALID_ARG, "dictsort: you can only sort by either \"key\" or \"value\"");
        }
        ct_val items = ct_list_new(&c->arena, v.u.d->n, 0);
        for (size_t i = 0; i < v.u.d->n; i++) {
            ct_val t = ct_list_new(&c->arena, 2, 1);
            t.u.l->v[0] = v.u.d->k[i];
            t.u.l->v[1] = v.u.d->v[i];
            items.u.l->v[i] = t;
        }
        return sorted(c, items, g[2] && ct_truthy(c, x[2]), g[0] && ct_truthy(c, x[0]), ct_int(by_value), 1);
    }
    case F_MAP: {
        ct_val l = ct_list_of(c, v);
        ct_val r = ct_list_new(&c->arena, l.u.l->n, 0);
        int attr_mode = a->npos == 0;
        if (attr_mode) {
            static const char *const P_MAP[] = {"attribute", "default"};
            bind(c, fn, a, P_MAP, 2, x, g);
            if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "map: needs a filter name or attribute=");
            for (size_t i = 0; i < l.u.l->n; i++) r.u.l->v[i] = attr_get(c, l.u.l->v[i], x[0], x[1], g[1]);
            return r;
        }
        ct_val fname = a->pos[0];
        if (fname.t != CT_STR) ct_fail(c, KILN_ERR_INVALID_ARG, "map: the filter name must be a string");
        int fid = ct_filter_id(fname.u.s.p, fname.u.s.n);
        if (fid < 0) ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'filter %.*s'", (int)fname.u.s.n, fname.u.s.p);
        ct_args fa = {a->pos + 1, a->npos - 1, a->kw, a->kwv, a->nkw};
        for (size_t i = 0; i < l.u.l->n; i++) r.u.l->v[i] = ct_call_filter(c, fid, l.u.l->v[i], &fa);
        return r;
    }
    case F_SELECT: return select_common(c, v, a, 0, 0);
    case F_REJECT: return select_common(c, v, a, 0, 1);
    case F_SELECTATTR: return select_common(c, v, a, 1, 0);
    case F_REJECTATTR: return select_common(c, v, a, 1, 1);
    case F_STRING: bind(c, fn, a, P_NONE, 0, x, g); return ct_to_str(c, v);
    case F_SAFE: bind(c, fn, a, P_NONE, 0, x, g); return v;
    case F_E: case F_ESCAPE: bind(c, fn, a, P_NONE, 0, x, g); return html_escape(c, ct_to_str(c, v));
    case F_UPPER: case F_LOWER: bind(c, fn, a, P_NONE, 0, x, g); return case_map(c, ct_to_str(c, v), id == F_UPPER);
    case F_CAPITALIZE: bind(c, fn, a, P_NONE, 0, x, g); return str_capitalize(c, ct_to_str(c, v));
    case F_TITLE: bind(c, fn, a, P_NONE, 0, x, g); return jinja_title(c, ct_to_str(c, v));
    case F_TRIM:
        bind(c, fn, a, P_TRIM, 1, x, g);
        return str_strip(c, ct_to_str(c, v), x[0], !is_given_none(x[0], g[0]), 3);
    case F_REPLACE:
        bind(c, fn, a, P_REPLACE, 3, x, g);
        if (!g[0] || !g[1]) ct_fail(c, KILN_ERR_INVALID_ARG, "replace: needs old and new");
        return str_replace(c, ct_to_str(c, v), ct_to_str(c, x[0]), ct_to_str(c, x[1]),
                           is_given_none(x[2], g[2]) ? -1 : need_int(c, fn, x[2]));
    case F_WORDCOUNT: {
        bind(c, fn, a, P_NONE, 0, x, g);
        ct_val s = ct_to_str(c, v);
        int64_t k = 0;
        int in_word = 0;
        for (size_t i = 0; i < s.u.s.n;) {
            int w = cp_word(ct_u8_dec(s.u.s.p, s.u.s.n, &i));
            if (w && !in_word) k++;
            in_word = w;
        }
        return ct_int(k);
    }
    case F_CENTER:
        bind(c, fn, a, P_CENTER, 1, x, g);
        return pad(c, ct_to_str(c, v), g[0] ? need_int(c, fn, x[0]) : 80, ct_none(), 0, 0);
    case F_INDENT: {
        bind(c, fn, a, P_INDENT, 3, x, g);
        ct_val ind;
        if (g[0] && x[0].t == CT_STR) ind = x[0];
        else {
            int64_t w = g[0] ? need_int(c, fn, x[0]) : 4;
            if (w > 4096) ct_fail(c, KILN_ERR_INVALID_ARG, "indent: width too large");
            char *sp = ct_alloc(&c->arena, (size_t)(w > 0 ? w : 0) + 1);
            for (int64_t i = 0; i < w; i++) sp[i] = ' ';
            ind = ct_str(sp, (size_t)(w > 0 ? w : 0));
        }
        ct_buf sb = {&c->arena, NULL, 0, 0};
        ct_str_of(c, &sb, v);
        ct_buf_putc(&sb, '\n'); /* jinja2 appends a newline so splitlines keeps a trailing empty line */
        ct_val lines = str_splitlines(c, ct_buf_val(&sb), 0);
        ct_buf b = {&c->arena, NULL, 0, 0};
        if (g[1] && ct_truthy(c, x[1])) ct_buf_put(&b, ind.u.s.p, ind.u.s.n);
        for (size_t i = 0; i < lines.u.l->n; i++) {
            ct_val ln = lines.u.l->v[i];
            if (i) {
                ct_buf_putc(&b, '\n');
                if (ln.u.s.n || (g[2] && ct_truthy(c, x[2]))) ct_buf_put(&b, ind.u.s.p, ind.u.s.n);
            }
            ct_buf_put(&b, ln.u.s.p, ln.u.s.n);
        }
        return ct_buf_val(&b);
    }
    case F_INT: {
        bind(c, fn, a, P_INT, 2, x, g);
        ct_val dflt = g[0] ? x[0] : ct_int(0);
        int64_t base = g[1] ? need_int(c, fn, x[1]) : 10, r;
        switch (v.t) {
        case CT_INT: case CT_BOOL: return ct_int(v.u.i);
        case CT_FLOAT:
            if (!isfinite(v.u.f) || fabs(v.u.f) >= 9.2e18) return dflt;
            return ct_int((int64_t)v.u.f);
        case CT_STR: {
            if (parse_int(c, v, (int)base, &r)) return ct_int(r);
            double d;
            if (parse_float(c, v, &d) && isfinite(d) && fabs(d) < 9.2e18) return ct_int((int64_t)d);
            return dflt;
        }
        default: return dflt;
        }
    }
    case F_FLOAT: {
        bind(c, fn, a, P_FLOAT, 1, x, g);
        ct_val dflt = g[0] ? x[0] : ct_float(0.0);
        double d;
        if (v.t == CT_FLOAT) return v;
        if (v.t == CT_INT || v.t == CT_BOOL) return ct_float((double)v.u.i);
        if (v.t == CT_STR && parse_float(c, v, &d)) return ct_float(d);
        return dflt;
    }
    case F_ABS:
        bind(c, fn, a, P_NONE, 0, x, g);
        if (v.t == CT_INT || v.t == CT_BOOL) {
            if (v.u.i == INT64_MIN) ct_fail(c, KILN_ERR_UNSUPPORTED, "integer overflow in abs");
            return ct_int(v.u.i < 0 ? -v.u.i : v.u.i);
        }
        if (v.t == CT_FLOAT) return ct_float(fabs(v.u.f));
        ct_fail(c, KILN_ERR_INVALID_ARG, "bad operand type for abs(): '%s'", ct_type_name(v));
    case F_ROUND: {
        bind(c, fn, a, P_ROUND, 2, x, g);
        int64_t prec = g[0] ? need_int(c, fn, x[0]) : 0;
        int method = 0; /* common */
        if (g[1]) {
            ct_val m = need_str(c, fn, x[1]);
            if (m.u.s.n == 4 && memcmp(m.u.s.p, "ceil", 4) == 0) method = 1;
            else if (m.u.s.n == 5 && memcmp(m.u.s.p, "floor", 5) == 0) method = 2;
            else if (!(m.u.s.n == 6 && memcmp(m.u.s.p, "common", 6) == 0))
                ct_fail(c, KILN_ERR_INVALID_ARG, "round: method must be common, ceil or floor");
        }
        if (v.t != CT_INT && v.t != CT_BOOL && v.t != CT_FLOAT)
            ct_fail(c, KILN_ERR_INVALID_ARG, "round: type %s doesn't define __round__", ct_type_name(v));
        if (method == 0) {
            if (v.t != CT_FLOAT) { /* round(int, n) stays an int */
                if (prec >= 0) return ct_int(v.u.i);
                double r = py_round((double)v.u.i, prec);
                return ct_int((int64_t)r);
            }
            return ct_float(py_round(v.u.f, prec));
        }
        double d = v.t == CT_FLOAT ? v.u.f : (double)v.u.i, p = pow(10.0, (double)prec);
        return ct_float((method == 1 ? ceil(d * p) : floor(d * p)) / p);
    }
    case F_SUM: {
        bind(c, fn, a, P_SUM, 2, x, g);
        ct_val l = ct_list_of(c, v), acc = g[1] ? x[1] : ct_int(0);
        ct_node dummy;
        (void)dummy;
        for (size_t i = 0; i < l.u.l->n; i++) {
            ct_val it = g[0] && x[0].t != CT_NONE ? attr_get(c, l.u.l->v[i], x[0], ct_none(), 0) : l.u.l->v[i];
            if (!((acc.t == CT_INT || acc.t == CT_BOOL || acc.t == CT_FLOAT) && (it.t == CT_INT || it.t == CT_BOOL || it.t == CT_FLOAT)))
                ct_fail(c, KILN_ERR_INVALID_ARG, "sum: unsupported operand type(s) for +: '%s' and '%s'", ct_type_name(acc), ct_type_name(it));
            if (acc.t == CT_FLOAT || it.t == CT_FLOAT)
                acc = ct_float((acc.t == CT_FLOAT ? acc.u.f : (double)acc.u.i) + (it.t == CT_FLOAT ? it.u.f : (double)it.u.i));
            else {
                int64_t r;
                if (__builtin_add_overflow(acc.u.i, it.u.i, &r)) ct_fail(c, KILN_ERR_UNSUPPORTED, "integer overflow in sum");
                acc = ct_int(r);
            }
        }
        return acc;
    }
    case F_MIN: case F_MAX: {
        bind(c, fn, a, P_UNIQUE, 2, x, g);
        ct_val l = ct_list_of(c, v);
        if (!l.u.l->n) return ct_undef(id == F_MIN ? "No aggregated item, sequence was empty." : "No aggregated item, sequence was empty.", 39);
        int cs = g[0] && ct_truthy(c, x[0]), have_attr = g[1] && x[1].t != CT_NONE;
        size_t best = 0;
        ct_val bk = sort_key(c, have_attr ? attr_get(c, l.u.l->v[0], x[1], ct_none(), 0) : l.u.l->v[0], cs);
        for (size_t i = 1; i < l.u.l->n; i++) {
            ct_val k = sort_key(c, have_attr ? attr_get(c, l.u.l->v[i], x[1], ct_none(), 0) : l.u.l->v[i], cs);
            int cmp = ct_compare(c, k, bk);
            if (id == F_MIN ? cmp < 0 : cmp > 0) { best = i; bk = k; }
        }
        return l.u.l->v[best];
    }
    case F_BATCH: {
        bind(c, fn, a, P_BATCH, 2, x, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "batch: needs linecount");
        int64_t k = need_int(c, fn, x[0]);
        if (k <= 0) ct_fail(c, KILN_ERR_INVALID_ARG, "batch: linecount must be positive");
        ct_val l = ct_list_of(c, v);
        vvec out = {0};
        for (size_t i = 0; i < l.u.l->n; i += (size_t)k) {
            size_t m = l.u.l->n - i < (size_t)k ? l.u.l->n - i : (size_t)k;
            int fill = g[1] && x[1].t != CT_NONE && m < (size_t)k;
            ct_val row = ct_list_new(&c->arena, fill ? (size_t)k : m, 0);
            memcpy(row.u.l->v, l.u.l->v + i, m * sizeof(ct_val));
            for (size_t j = m; fill && j < (size_t)k; j++) row.u.l->v[j] = x[1];
            vv_push(c, &out, row);
        }
        return vv_list(c, &out, 0);
    }
    case F_TOJSON: {
        bind(c, fn, a, P_TOJSON, 4, x, g);
        ct_json_opts o = {0, 0, NULL, 0, ", ", ": ", 2, 2};
        o.ensure_ascii = g[0] && ct_truthy(c, x[0]);
        o.sort_keys = g[3] && ct_truthy(c, x[3]);
        if (g[1] && x[1].t != CT_NONE) {
            if (x[1].t == CT_STR) {
                o.indent = x[1].u.s.p;
                o.indent_len = x[1].u.s.n;
            } else {
                int64_t w = need_int(c, fn, x[1]);
                if (w > 4096) ct_fail(c, KILN_ERR_INVALID_ARG, "tojson: indent too large");
                char *sp = ct_alloc(&c->arena, (size_t)(w > 0 ? w : 0) + 1);
                for (int64_t i = 0; i < w; i++) sp[i] = ' ';
                o.indent = sp;
                o.indent_len = (size_t)(w > 0 ? w : 0);
            }
            o.item_sep = ",";
            o.item_sep_len = 1;
        }
        if (g[2] && x[2].t != CT_NONE) {
            ct_val sv = x[2];
            if (sv.t != CT_LIST || sv.u.l->n != 2 || sv.u.l->v[0].t != CT_STR || sv.u.l->v[1].t != CT_STR)
                ct_fail(c, KILN_ERR_INVALID_ARG, "tojson: separators must be a pair of strings");
            o.item_sep = sv.u.l->v[0].u.s.p;
            o.item_sep_len = sv.u.l->v[0].u.s.n;
            o.key_sep = sv.u.l->v[1].u.s.p;
            o.key_sep_len = sv.u.l->v[1].u.s.n;
        }
        ct_buf b = {&c->arena, NULL, 0, 0};
        ct_tojson(c, &b, v, &o, 0);
        return ct_buf_val(&b);
    }
    case F_ATTR: {
        bind(c, fn, a, P_ATTR, 1, x, g);
        if (!g[0]) ct_fail(c, KILN_ERR_INVALID_ARG, "attr: needs a name");
        ct_val nm = ct_to_str(c, x[0]);
        if (v.t == CT_DICT) { /* attr() does not fall back to items */
            int unsafe = 0, mid = ct_method_id(v, nm.u.s.p, nm.u.s.n, &unsafe);
            if (mid < 0 || unsafe) return ct_undef(nm.u.s.p, nm.u.s.n);
        }
        return ct_getattr(c, v, nm.u.s.p, nm.u.s.n);
    }
    case F_FORMAT: {
        if (a->nkw) ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'format' with keyword arguments");
        return percent_format(c, ct_to_str(c, v), a->pos, a->npos);
    }
    }
    ct_fail(c, KILN_ERR_INTERNAL, "internal error: filter %d", id);
}

/* ---- globals ------------------------------------------------------------------------------------------------------ */
ct_val ct_call_global(ct_ctx *c, int id, ct_args *a) {
    switch (id) {
    case G_RANGE: {
        if (a->nkw) ct_fail(c, KILN_ERR_INVALID_ARG, "range() takes no keyword arguments");
        if (a->npos < 1 || a->npos > 3) ct_fail(c, KILN_ERR_INVALID_ARG, "range expected 1 to 3 arguments, got %d", a->npos);
        int64_t start = 0, stop, step = 1;
        if (a->npos == 1) stop = need_int(c, "range", a->pos[0]);
        else {
            start = need_int(c, "range", a->pos[0]);
            stop = need_int(c, "range", a->pos[1]);
            if (a->npos == 3) step = need_int(c, "range", a->pos[2]);
        }
        if (!step) ct_fail(c, KILN_ERR_INVALID_ARG, "range() arg 3 must not be zero");
        int64_t n = step > 0 ? (stop > start ? (stop - start - 1) / step + 1 : 0) : (start > stop ? (start - stop - 1) / (-step) + 1 : 0);
        if (n > 10000000) ct_fail(c, KILN_ERR_INVALID_ARG, "range too big (%lld items)", (long long)n);
        ct_val l = ct_list_new(&c->arena, (size_t)n, 0);
        for (int64_t i = 0; i < n; i++) l.u.l->v[i] = ct_int(start + i * step);
        return l;
    }
    case G_NAMESPACE:
    case G_DICT: {
        if (a->npos > 1) ct_fail(c, KILN_ERR_INVALID_ARG, "%s expected at most 1 argument, got %d", GLOBALS[id], a->npos);
        ct_val d = ct_dict_new(&c->arena, (size_t)a->nkw + 4);
        if (a->npos) {
            ct_val init = a->pos[0];
            if (init.t == CT_DICT || init.t == CT_NS) {
                for (size_t i = 0; i < init.u.d->n; i++) ct_dict_set(&c->arena, d.u.d, init.u.d->k[i], init.u.d->v[i]);
            } else {
                ct_val l = ct_list_of(c, init);
                for (size_t i = 0; i < l.u.l->n; i++) {
                    ct_val pr = l.u.l->v[i];
                    if (pr.t != CT_LIST || pr.u.l->n != 2)
                        ct_fail(c, KILN_ERR_INVALID_ARG, "%s: sequence element #%zu has the wrong length", GLOBALS[id], i);
                    ct_dict_set(&c->arena, d.u.d, pr.u.l->v[0], pr.u.l->v[1]);
                }
            }
        }
        for (int k = 0; k < a->nkw; k++) ct_dict_set(&c->arena, d.u.d, ct_str(a->kw[k], strlen(a->kw[k])), a->kwv[k]);
        if (id == G_NAMESPACE) d.t = CT_NS;
        return d;
    }
    case G_RAISE: {
        ct_buf b = {&c->arena, NULL, 0, 0};
        for (int i = 0; i < a->npos; i++) ct_str_of(c, &b, a->pos[i]);
        ct_buf_putc(&b, 0);
        ct_fail(c, KILN_ERR_INVALID_ARG, "raise_exception: %s", b.p);
    }
    case G_STRFTIME: {
        if (a->npos != 1 || a->pos[0].t != CT_STR || a->nkw)
            ct_fail(c, KILN_ERR_INVALID_ARG, "strftime_now() takes one string argument");
        time_t now = time(NULL);
        struct tm tmv;
        localtime_r(&now, &tmv);
        char out[1024];
        const char *f = ct_strndup(&c->arena, a->pos[0].u.s.p, a->pos[0].u.s.n);
        size_t k = strftime(out, sizeof out, f, &tmv);
        if (!k && *f) ct_fail(c, KILN_ERR_INVALID_ARG, "strftime_now: the format gives no output or more than 1 KiB");
        return ct_str(ct_strndup(&c->arena, out, k), k);
    }
    default: ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct '%s()'", GLOBALS[id]);
    }
}
