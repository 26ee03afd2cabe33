/* chat_template_parse.c — the lexer and parser of the chat template interpreter.
 *
 * The lexer follows jinja2's (3.1) rules for the transformers environment: newlines normalized to
 * "\n" and one trailing newline dropped (keep_trailing_newline=False); {{ }}, {% %}, {# #} with
 * "-" (strip all whitespace on that side) and "+" (keep it); trim_blocks (the first "\n" after a
 * %} or #} goes); lstrip_blocks (spaces and tabs from the start of a line up to a {% or {# go,
 * unless it is {%+); {% raw %}. Inside tags: names, strings with Python escapes, integers, floats
 * and operators; a block or variable end only counts outside brackets.
 *
 * The parser is a recursive descent over those tokens with jinja2's grammar and precedence:
 *   condexpr:  or ("if" or ["else" condexpr])*
 *   or / and / not / compare (== != < <= > >= in, not in; chained) / + - / ~ / * / // % / ** /
 *   unary (- +) / primary + postfix (.name [index] [a:b:c] (call)) + filters (| f(args)) and
 *   tests (is [not] t [arg]).
 * Unknown tags, filters and tests fail here with the construct's name and line. */
#include "tokenizer/chat_template_internal.h"
#include "base/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unicode/uchar.h>

/* ---- tokens ------------------------------------------------------------------------------------ */
enum {
    TK_DATA, TK_VAR_BEGIN, TK_VAR_END, TK_BLOCK_BEGIN, TK_BLOCK_END, TK_NAME, TK_STRING, TK_INT,
    TK_FLOAT, TK_OP, TK_EOF
};
/* operators */
enum {
    O_ADD, O_SUB, O_DIV, O_FLOORDIV, O_MUL, O_MOD, O_POW, O_TILDE, O_LBRACKET, O_RBRACKET, O_LPAREN,
    O_RPAREN, O_LBRACE, O_RBRACE, O_EQ, O_NE, O_GT, O_GTEQ, O_LT, O_LTEQ, O_ASSIGN, O_DOT, O_COLON,
    O_PIPE, O_COMMA, O_SEMICOLON
};
static const struct { const char *s; int op; } OPS[] = {
    {"//", O_FLOORDIV}, {"**", O_POW}, {"==", O_EQ}, {"!=", O_NE}, {">=", O_GTEQ}, {"<=", O_LTEQ},
    {"+", O_ADD}, {"-", O_SUB}, {"/", O_DIV}, {"*", O_MUL}, {"%", O_MOD}, {"~", O_TILDE},
    {"[", O_LBRACKET}, {"]", O_RBRACKET}, {"(", O_LPAREN}, {")", O_RPAREN}, {"{", O_LBRACE},
    {"}", O_RBRACE}, {">", O_GT}, {"<", O_LT}, {"=", O_ASSIGN}, {".", O_DOT}, {":", O_COLON},
    {"|", O_PIPE}, {",", O_COMMA}, {";", O_SEMICOLON},
};

typedef struct tok {
    uint8_t type, op;
    int line;
    const char *s; /* DATA / NAME / STRING (decoded) text */
    size_t n;
    int64_t i;
    double f;
} tok;

typedef struct parser {
    ct_arena *a;
    jmp_buf jb;
    char *err;
    kiln_status st;
    const char *name;
    const char *src; /* normalized source */
    size_t len;
    tok *t;
    size_t nt, cap, pos;
    int depth;
    kiln_chat_template *tmpl;
} parser;

_Noreturn static void pfail(parser *p, kiln_status st, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
_Noreturn static void pfail(parser *p, kiln_status st, int line, const char *fmt, ...) {
    int k = snprintf(p->err, 1024, "%s:%d: ", p->name, line);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->err + k, 1024 - (size_t)k, fmt, ap);
    va_end(ap);
    p->st = st;
    longjmp(p->jb, 1);
}

static void push_tok(parser *p, tok t) {
    if (p->nt == p->cap) {
        size_t nc = p->cap ? p->cap * 2 : 256;
        tok *nt = ct_alloc(p->a, nc * sizeof *nt);
        if (p->nt) memcpy(nt, p->t, p->nt * sizeof *nt);
        p->t = nt;
        p->cap = nc;
    }
    p->t[p->nt++] = t;
}

/* ---- lexer --------------------------------------------------------------------------------------- */
/* Python's \s at s[i] (Unicode whitespace): its byte length, 0 if not whitespace. */
static size_t space_at(const char *s, size_t n, size_t i) {
    unsigned char c = (unsigned char)s[i];
    if (c < 0x80) return (c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f)) ? 1 : 0;
    size_t j = i;
    uint32_t cp = ct_u8_dec(s, n, &j);
    return ct_is_space(cp) ? j - i : 0;
}

/* Length of text without trailing whitespace (Python str.rstrip()). */
static size_t rstrip_len(const char *s, size_t n) {
    size_t end = n;
    while (end > 0) {
        size_t st = end - 1;
        while (st > 0 && ((unsigned char)s[st] & 0xc0) == 0x80) st--;
        if (!space_at(s, end, st)) break;
        end = st;
    }
    return end;
}

/* lstrip_blocks: if only whitespace follows the last newline of text (or text is all whitespace
 * and a line starts there), drop that whitespace. */
static size_t lstrip_len(const char *s, size_t n, int line_starting) {
    size_t l = n;
    while (l > 0 && s[l - 1] != '\n') l--;
    if (l == 0 && !line_starting) return n;
    if (l == n) return n; /* nothing after the newline: \s+ needs at least one character */
    for (size_t i = l; i < n;) {
        size_t k = space_at(s, n, i);
        if (!k) return n;
        i += k;
    }
    return l;
}

static int count_nl(const char *s, size_t n) {
    int k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == '\n';
    return k;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* (\d+_)*\d+ at s[i]: returns the end, or i when none */
static size_t digits_us(const char *s, size_t n, size_t i) {
    size_t j = i;
    if (j >= n || !is_digit(s[j])) return i;
    while (j < n && is_digit(s[j])) j++;
    while (j + 1 < n && s[j] == '_' && is_digit(s[j + 1])) {
        j++;
        while (j < n && is_digit(s[j])) j++;
    }
    return j;
}

/* e[+-]?(\d+_)*\d+ at s[i]: its end, 0 if none */
static size_t exp_at(const char *s, size_t n, size_t i) {
    if (i >= n || (s[i] != 'e' && s[i] != 'E')) return 0;
    size_t q = i + 1;
    if (q < n && (s[q] == '+' || s[q] == '-')) q++;
    size_t r = digits_us(s, n, q);
    return r > q ? r : 0;
}

static void append_digits(char *buf, size_t cap, const char *s, size_t n) {
    size_t k = 0;
    for (size_t i = 0; i < n && k + 1 < cap; i++)
        if (s[i] != '_') buf[k++] = s[i];
    buf[k] = 0;
}

/* Decodes a string literal body as Python's unicode_escape does. */
static void unescape(parser *p, int line, const char *s, size_t n, const char **out, size_t *outn) {
    ct_buf b = {p->a, NULL, 0, 0};
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (c != '\\' || i + 1 >= n) {
            ct_buf_putc(&b, c);
            continue;
        }
        char e = s[++i];
        uint32_t cp;
        int k, want;
        switch (e) {
        case '\n': break; /* line continuation */
        case '\\': ct_buf_putc(&b, '\\'); break;
        case '\'': ct_buf_putc(&b, '\''); break;
        case '"': ct_buf_putc(&b, '"'); break;
        case 'a': ct_buf_putc(&b, '\a'); break;
        case 'b': ct_buf_putc(&b, '\b'); break;
        case 'f': ct_buf_putc(&b, '\f'); break;
        case 'n': ct_buf_putc(&b, '\n'); break;
        case 'r': ct_buf_putc(&b, '\r'); break;
        case 't': ct_buf_putc(&b, '\t'); break;
        case 'v': ct_buf_putc(&b, '\v'); break;
        case 'x': case 'u': case 'U':
            want = e == 'x' ? 2 : e == 'u' ? 4 : 8;
            cp = 0;
            for (k = 0; k < want; k++) {
                char h = i + 1 + (size_t)k < n ? s[i + 1 + (size_t)k] : 0;
                int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10
                        : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
                if (d < 0) pfail(p, KILN_ERR_INVALID_ARG, line, "truncated \\%c escape in a string literal", e);
                cp = cp * 16 + (uint32_t)d;
            }
            if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
                pfail(p, KILN_ERR_INVALID_ARG, line, "\\%c escape out of range in a string literal", e);
            i += (size_t)want;
            ct_u8_enc(&b, cp);
            break;
        case 'N': pfail(p, KILN_ERR_UNSUPPORTED, line, "unsupported construct '\\N{...}' (a named escape)");
        default:
            if (e >= '0' && e <= '7') {
                cp = (uint32_t)(e - '0');
                for (k = 0; k < 2 && i + 1 < n && s[i + 1] >= '0' && s[i + 1] <= '7'; k++) cp = cp * 8 + (uint32_t)(s[++i] - '0');
                ct_u8_enc(&b, cp);
            } else { /* unknown escapes stay as written */
                ct_buf_putc(&b, '\\');
                ct_buf_putc(&b, e);
            }
        }
    }
    ct_val v = ct_buf_val(&b);
    *out = v.u.s.p;
    *outn = v.u.s.n;
}

/* Tokens inside {{ }} / {% %} up to the end delimiter (end = '}' or '%'). Returns the position
 * after the end delimiter (with trim_blocks / "-" handling) and sets *line_starting. */
static size_t lex_tag(parser *p, size_t i, int *line, char end, int *line_starting) {
    const char *s = p->src;
    size_t n = p->len;
    char stack[256];
    int sp = 0;
    for (;;) {
        if (i >= n) pfail(p, KILN_ERR_INVALID_ARG, *line, "unexpected end of template inside a %s tag",
                          end == '}' ? "{{ }}" : "{% %}");
        /* end delimiter (only outside brackets) */
        if (sp == 0) {
            size_t j = i;
            int sign = 0;
            if (s[j] == '-' || (s[j] == '+' && end == '%')) sign = s[j++];
            if (j + 1 < n && s[j] == end && s[j + 1] == '}') {
                tok t = {end == '}' ? TK_VAR_END : TK_BLOCK_END, 0, *line, NULL, 0, 0, 0};
                push_tok(p, t);
                j += 2;
                if (sign == '-') {
                    size_t k;
                    while (j < n && (k = space_at(s, n, j))) {
                        if (s[j] == '\n') (*line)++;
                        j += k;
                    }
                } else if (sign == 0 && end == '%' && j < n && s[j] == '\n') { /* trim_blocks */
                    j++;
                    (*line)++;
                }
                *line_starting = s[j - 1] == '\n';
                return j;
            }
        }
        size_t k = space_at(s, n, i);
        if (k) {
            if (s[i] == '\n') (*line)++;
            i += k;
            continue;
        }
        char c = s[i];
        tok t = {0, 0, *line, NULL, 0, 0, 0};
        /* float: (?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+-]?(\d+_)*\d+|\.(\d+_)*\d+) */
        if (is_digit(c) && !(i > 0 && s[i - 1] == '.')) {
            size_t j = digits_us(s, n, i), fr = 0, e = 0;
            if (j < n && s[j] == '.') {
                size_t q = digits_us(s, n, j + 1);
                if (q > j + 1) fr = q;
            }
            size_t ex = fr ? exp_at(s, n, fr) : 0;
            if (fr && ex) e = ex;
            else if ((ex = exp_at(s, n, j))) e = ex;
            else if (fr) e = fr;
            if (e) {
                char buf[128];
                append_digits(buf, sizeof buf, s + i, e - i);
                t.type = TK_FLOAT;
                t.f = strtod(buf, NULL);
                push_tok(p, t);
                i = e;
                continue;
            }
            /* integer: 0b / 0o / 0x / decimal / zeros */
            size_t j2 = i;
            int base = 10;
            if (c == '0' && i + 1 < n && strchr("bBoOxX", s[i + 1]) && s[i + 1]) {
                base = (s[i + 1] | 32) == 'b' ? 2 : (s[i + 1] | 32) == 'o' ? 8 : 16;
                j2 = i + 2;
                size_t st = j2;
                for (;;) {
                    size_t q = j2;
                    if (q < n && s[q] == '_') q++;
                    char d = q < n ? (char)(s[q] | 32) : 0;
                    int ok = base == 2 ? (d == '0' || d == '1') : base == 8 ? (d >= '0' && d <= '7')
                             : (is_digit(d) || (d >= 'a' && d <= 'f'));
                    if (!ok) break;
                    j2 = q + 1;
                }
                if (j2 == st) { base = 10; j2 = i; }
            }
            if (base == 10) {
                if (c == '0') { /* 0(_?0)* */
                    j2 = i + 1;
                    while (j2 < n && (s[j2] == '0' || (s[j2] == '_' && j2 + 1 < n && s[j2 + 1] == '0'))) j2++;
                } else {
                    j2 = digits_us(s, n, i);
                }
            }
            char buf[128];
            append_digits(buf, sizeof buf, s + i + (base == 10 ? 0 : 2), j2 - i - (base == 10 ? 0 : 2));
            char *endp;
            unsigned long long v = strtoull(buf, &endp, base);
            if (v > INT64_MAX) pfail(p, KILN_ERR_UNSUPPORTED, *line, "unsupported construct: integer literal beyond 64 bits");
            t.type = TK_INT;
            t.i = (int64_t)v;
            push_tok(p, t);
            i = j2;
            continue;
        }
        /* name: \w+ that is an identifier (digits were taken above) */
        if (c == '_' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || ((unsigned char)c >= 0x80)) {
            size_t j = i;
            while (j < n) {
                char d = s[j];
                if (d == '_' || (d >= 'a' && d <= 'z') || (d >= 'A' && d <= 'Z') || is_digit(d)) { j++; continue; }
                if ((unsigned char)d >= 0x80) {
                    size_t q = j;
                    uint32_t cp = ct_u8_dec(s, n, &q);
                    if (u_isalnum((UChar32)cp) || u_hasBinaryProperty((UChar32)cp, UCHAR_XID_CONTINUE)) { j = q; continue; }
                }
                break;
            }
            if (j > i) {
                t.type = TK_NAME;
                t.s = s + i;
                t.n = j - i;
                push_tok(p, t);
                i = j;
                continue;
            }
        }
        /* string */
        if (c == '\'' || c == '"') {
            size_t j = i + 1;
            int nl = 0;
            while (j < n && s[j] != c) {
                if (s[j] == '\\' && j + 1 < n) { nl += s[j + 1] == '\n'; j += 2; continue; }
                nl += s[j] == '\n';
                j++;
            }
            if (j >= n) pfail(p, KILN_ERR_INVALID_ARG, *line, "unterminated string literal");
            t.type = TK_STRING;
            unescape(p, *line, s + i + 1, j - i - 1, &t.s, &t.n);
            push_tok(p, t);
            *line += nl;
            i = j + 1;
            continue;
        }
        /* operator */
        size_t o;
        for (o = 0; o < sizeof OPS / sizeof OPS[0]; o++) {
            size_t l = strlen(OPS[o].s);
            if (i + l <= n && memcmp(s + i, OPS[o].s, l) == 0) break;
        }
        if (o == sizeof OPS / sizeof OPS[0]) {
            size_t q = i;
            uint32_t cp = ct_u8_dec(s, n, &q);
            pfail(p, KILN_ERR_INVALID_ARG, *line, "unexpected character '%.*s' (U+%04X)", (int)(q - i), s + i, cp);
        }
        int op = OPS[o].op;
        if (op == O_LBRACE || op == O_LPAREN || op == O_LBRACKET) {
            if (sp >= (int)sizeof stack) pfail(p, KILN_ERR_UNSUPPORTED, *line, "brackets nested too deeply");
            stack[sp++] = op == O_LBRACE ? '}' : op == O_LPAREN ? ')' : ']';
        } else if (op == O_RBRACE || op == O_RPAREN || op == O_RBRACKET) {
            char want = op == O_RBRACE ? '}' : op == O_RPAREN ? ')' : ']';
            if (!sp) pfail(p, KILN_ERR_INVALID_ARG, *line, "unexpected '%c'", want);
            if (stack[sp - 1] != want) pfail(p, KILN_ERR_INVALID_ARG, *line, "unexpected '%c', expected '%c'", want, stack[sp - 1]);
            sp--;
        }
        t.type = TK_OP;
        t.op = (uint8_t)op;
        push_tok(p, t);
        i += strlen(OPS[o].s);
    }
}

static void push_data(parser *p, const char *s, size_t n, int line) {
    if (!n) return;
    tok t = {TK_DATA, 0, line, s, n, 0, 0};
    push_tok(p, t);
}

/* "{%[-+]?\s*raw\s*(-%}\s*|%})" at s[i]: returns its end, 0 if not a raw tag. */
static size_t match_raw(const char *s, size_t n, size_t i, const char *word, int *sign, int trim) {
    size_t j = i + 2;
    *sign = 0;
    if (j < n && (s[j] == '-' || s[j] == '+')) *sign = s[j++];
    while (j < n && space_at(s, n, j)) j += space_at(s, n, j);
    size_t wl = strlen(word);
    if (j + wl > n || memcmp(s + j, word, wl)) return 0;
    j += wl;
    while (j < n && space_at(s, n, j)) j += space_at(s, n, j);
    if (j + 2 < n + 1 && j + 3 <= n && s[j] == '-' && s[j + 1] == '%' && s[j + 2] == '}') {
        j += 3;
        while (j < n && space_at(s, n, j)) j += space_at(s, n, j);
        return j;
    }
    if (trim && j + 3 <= n && s[j] == '+' && s[j + 1] == '%' && s[j + 2] == '}') return j + 3;
    if (j + 2 <= n && s[j] == '%' && s[j + 1] == '}') {
        j += 2;
        if (trim && j < n && s[j] == '\n') j++;
        return j;
    }
    return 0;
}

static void lex(parser *p) {
    const char *s = p->src;
    size_t n = p->len, i = 0;
    int line = 1, line_starting = 1;
    while (i < n) {
        /* the next tag start */
        size_t k = i;
        while (k + 1 < n && !(s[k] == '{' && (s[k + 1] == '{' || s[k + 1] == '%' || s[k + 1] == '#'))) k++;
        if (k + 1 >= n) { /* plain text to the end */
            push_data(p, s + i, n - i, line);
            break;
        }
        char kind = s[k + 1];
        int sign = 0;
        size_t raw_end = 0;
        if (kind == '%') raw_end = match_raw(s, n, k, "raw", &sign, 0);
        if (!raw_end) sign = (k + 2 < n && (s[k + 2] == '-' || s[k + 2] == '+')) ? s[k + 2] : 0;
        size_t tl = k - i;
        if (sign == '-') tl = rstrip_len(s + i, tl);
        else if (sign != '+' && kind != '{') tl = lstrip_len(s + i, tl, line_starting);
        push_data(p, s + i, tl, line);
        line += count_nl(s + i, k - i);
        if (raw_end) { /* {% raw %} ... {% endraw %} */
            line += count_nl(s + k, raw_end - k);
            size_t j = raw_end, e = 0;
            int esign = 0;
            for (; j + 1 < n; j++)
                if (s[j] == '{' && s[j + 1] == '%' && (e = match_raw(s, n, j, "endraw", &esign, 1))) break;
            if (!e) pfail(p, KILN_ERR_INVALID_ARG, line, "missing end of raw directive");
            size_t bl = j - raw_end;
            if (esign == '-') bl = rstrip_len(s + raw_end, bl);
            else if (esign != '+') bl = lstrip_len(s + raw_end, bl, 0);
            push_data(p, s + raw_end, bl, line);
            line += count_nl(s + raw_end, e - raw_end);
            line_starting = s[e - 1] == '\n';
            i = e;
            continue;
        }
        i = k + 2 + (sign ? 1 : 0);
        if (kind == '#') { /* comment: up to the first #} */
            size_t j = i;
            while (j + 1 < n && !(s[j] == '#' && s[j + 1] == '}')) j++;
            if (j + 1 >= n) pfail(p, KILN_ERR_INVALID_ARG, line, "missing end of comment tag");
            int csign = j > i && (s[j - 1] == '-' || s[j - 1] == '+') ? s[j - 1] : 0;
            line += count_nl(s + i, j - i);
            j += 2;
            if (csign == '-') {
                while (j < n && space_at(s, n, j)) {
                    if (s[j] == '\n') line++;
                    j += space_at(s, n, j);
                }
            } else if (csign == 0 && j < n && s[j] == '\n') {
                j++;
                line++;
            }
            line_starting = s[j - 1] == '\n';
            i = j;
            continue;
        }
        tok t = {kind == '{' ? TK_VAR_BEGIN : TK_BLOCK_BEGIN, 0, line, NULL, 0, 0, 0};
        push_tok(p, t);
        i = lex_tag(p, i, &line, kind == '{' ? '}' : '%', &line_starting);
    }
    tok e = {TK_EOF, 0, line, NULL, 0, 0, 0};
    push_tok(p, e);
}

/* ---- parser -------------------------------------------------------------------------------------- */
typedef struct nvec {
    ct_node **v;
    int n, cap;
} nvec;

static void nv_push(parser *p, nvec *v, ct_node *x) {
    if (v->n == v->cap) {
        int nc = v->cap ? v->cap * 2 : 8;
        ct_node **nn = ct_alloc(p->a, (size_t)nc * sizeof *nn);
        if (v->n) memcpy(nn, v->v, (size_t)v->n * sizeof *nn);
        v->v = nn;
        v->cap = nc;
    }
    v->v[v->n++] = x;
}

static ct_node *node(parser *p, int kind, int line) {
    ct_node *x = ct_alloc(p->a, sizeof *x);
    x->kind = (uint8_t)kind;
    x->line = line;
    return x;
}

static tok *cur(parser *p) { return &p->t[p->pos]; }
static tok *peek(parser *p) { return &p->t[p->pos + 1 < p->nt ? p->pos + 1 : p->pos]; }
static tok *advance(parser *p) {
    tok *t = &p->t[p->pos];
    if (p->pos + 1 < p->nt) p->pos++;
    return t;
}
static int is_op(tok *t, int op) { return t->type == TK_OP && t->op == op; }
static int is_name(tok *t, const char *s) {
    return t->type == TK_NAME && t->n == strlen(s) && memcmp(t->s, s, t->n) == 0;
}

static const char *describe(tok *t, char *buf, size_t cap) {
    switch (t->type) {
    case TK_DATA: return "template data";
    case TK_VAR_BEGIN: return "begin of print statement";
    case TK_VAR_END: return "end of print statement";
    case TK_BLOCK_BEGIN: return "begin of statement block";
    case TK_BLOCK_END: return "end of statement block";
    case TK_NAME: snprintf(buf, cap, "'%.*s'", (int)(t->n > 60 ? 60 : t->n), t->s); return buf;
    case TK_STRING: return "string";
    case TK_INT: return "integer";
    case TK_FLOAT: return "float";
    case TK_EOF: return "end of template";
    default:
        for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++)
            if (OPS[i].op == t->op) { snprintf(buf, cap, "'%s'", OPS[i].s); return buf; }
        return "operator";
    }
}

_Noreturn static void unexpected(parser *p, const char *want) {
    char buf[96];
    tok *t = cur(p);
    pfail(p, KILN_ERR_INVALID_ARG, t->line, "expected %s, got %s", want, describe(t, buf, sizeof buf));
}

static void expect_op(parser *p, int op, const char *what) {
    if (!is_op(cur(p), op)) unexpected(p, what);
    advance(p);
}
static tok *expect_type(parser *p, int type, const char *what) {
    if (cur(p)->type != type) unexpected(p, what);
    return advance(p);
}
static void expect_name(parser *p, const char *s) {
    if (!is_name(cur(p), s)) {
        char w[64];
        snprintf(w, sizeof w, "'%s'", s);
        unexpected(p, w);
    }
    advance(p);
}

static void enter(parser *p) {
    if (++p->depth > 200) pfail(p, KILN_ERR_UNSUPPORTED, cur(p)->line, "template nested too deeply");
}

static ct_node *parse_expression(parser *p, int with_condexpr);
static ct_node *parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end, int explicit_parens);
static ct_node *parse_unary(parser *p, int with_filter);
static ct_node *parse_primary(parser *p);
static ct_node *parse_postfix(parser *p, ct_node *x);

/* (args, name=value, ...) into x->list / x->names + x->list2 */
static void parse_call_args(parser *p, ct_node *x) {
    int line = cur(p)->line;
    expect_op(p, O_LPAREN, "'('");
    nvec pos = {0}, kwv = {0};
    const char **kwn = NULL;
    int nkw = 0, capkw = 0;
    while (!is_op(cur(p), O_RPAREN)) {
        if (pos.n || nkw) {
            expect_op(p, O_COMMA, "','");
            if (is_op(cur(p), O_RPAREN)) break;
        }
        if (is_op(cur(p), O_MUL) || is_op(cur(p), O_POW))
            pfail(p, KILN_ERR_UNSUPPORTED, cur(p)->line, "unsupported construct '%s' (argument unpacking)",
                  is_op(cur(p), O_MUL) ? "*args" : "**kwargs");
        if (cur(p)->type == TK_NAME && is_op(peek(p), O_ASSIGN)) {
            tok *k = advance(p);
            advance(p);
            if (nkw == capkw) {
                capkw = capkw ? capkw * 2 : 4;
                const char **nn = ct_alloc(p->a, (size_t)capkw * sizeof *nn);
                if (nkw) memcpy(nn, kwn, (size_t)nkw * sizeof *nn);
                kwn = nn;
            }
            kwn[nkw++] = ct_strndup(p->a, k->s, k->n);
            nv_push(p, &kwv, parse_expression(p, 1));
        } else {
            if (nkw) pfail(p, KILN_ERR_INVALID_ARG, line, "invalid syntax for function call expression");
            nv_push(p, &pos, parse_expression(p, 1));
        }
    }
    expect_op(p, O_RPAREN, "')'");
    x->list = pos.v;
    x->n = pos.n;
    x->names = kwn;
    x->list2 = kwv.v;
    x->nnames = x->n2 = nkw;
}

/* The name of a filter or test (`what`) applied to x: an E_FILTER / E_TEST node (at `line`, or the
 * name's line when line < 0) whose fid is lookup(name); dotted and unknown names are rejected. */
static ct_node *filter_or_test(parser *p, int kind, const char *what, int (*lookup)(const char *, size_t), ct_node *x, int line) {
    char want[32];
    snprintf(want, sizeof want, "a %s name", what);
    tok *t = expect_type(p, TK_NAME, want);
    if (is_op(cur(p), O_DOT)) pfail(p, KILN_ERR_UNSUPPORTED, t->line, "unsupported construct '%s %.*s.'", what, (int)t->n, t->s);
    ct_node *f = node(p, kind, line < 0 ? t->line : line);
    f->a = x;
    f->name = ct_strndup(p->a, t->s, t->n);
    f->name_len = t->n;
    f->fid = lookup(t->s, t->n);
    if (f->fid < 0) pfail(p, KILN_ERR_UNSUPPORTED, t->line, "unsupported construct '%s %.*s'", what, (int)t->n, t->s);
    return f;
}

static ct_node *parse_filter(parser *p, ct_node *x, int start_inline) {
    while (is_op(cur(p), O_PIPE) || start_inline) {
        if (!start_inline) advance(p);
        ct_node *f = filter_or_test(p, E_FILTER, "filter", ct_filter_id, x, -1);
        if (is_op(cur(p), O_LPAREN)) parse_call_args(p, f);
        x = f;
        start_inline = 0;
    }
    return x;
}

static ct_node *parse_test(parser *p, ct_node *x) {
    tok *is = advance(p); /* 'is' */
    int negated = 0;
    if (is_name(cur(p), "not")) {
        advance(p);
        negated = 1;
    }
    ct_node *e = filter_or_test(p, E_TEST, "test", ct_test_id, x, is->line);
    tok *c = cur(p);
    if (is_op(c, O_LPAREN)) {
        parse_call_args(p, e);
    } else if ((c->type == TK_NAME || c->type == TK_STRING || c->type == TK_INT || c->type == TK_FLOAT ||
                is_op(c, O_LPAREN) || is_op(c, O_LBRACKET) || is_op(c, O_LBRACE)) &&
               !is_name(c, "else") && !is_name(c, "or") && !is_name(c, "and")) {
        if (is_name(c, "is")) pfail(p, KILN_ERR_INVALID_ARG, c->line, "you cannot chain multiple tests with is");
        ct_node *arg = parse_postfix(p, parse_primary(p));
        e->list = ct_alloc(p->a, sizeof *e->list);
        e->list[0] = arg;
        e->n = 1;
    }
    if (negated) {
        ct_node *nn = node(p, E_NOT, is->line);
        nn->a = e;
        return nn;
    }
    return e;
}

static ct_node *parse_subscribed(parser *p) {
    int line = cur(p)->line;
    ct_node *args[3] = {NULL, NULL, NULL};
    if (is_op(cur(p), O_COLON)) {
        advance(p);
    } else {
        ct_node *x = parse_expression(p, 1);
        if (!is_op(cur(p), O_COLON)) return x;
        advance(p);
        args[0] = x;
    }
    if (!is_op(cur(p), O_COLON) && !is_op(cur(p), O_RBRACKET) && !is_op(cur(p), O_COMMA))
        args[1] = parse_expression(p, 1);
    if (is_op(cur(p), O_COLON)) {
        advance(p);
        if (!is_op(cur(p), O_RBRACKET) && !is_op(cur(p), O_COMMA)) args[2] = parse_expression(p, 1);
    }
    ct_node *s = node(p, E_SLICE, line);
    s->a = args[0];
    s->b = args[1];
    s->c = args[2];
    return s;
}

static ct_node *parse_subscript(parser *p, ct_node *x) {
    tok *t = advance(p);
    if (t->type == TK_OP && t->op == O_DOT) {
        tok *at = advance(p);
        if (at->type == TK_NAME) {
            ct_node *g = node(p, E_GETATTR, t->line);
            g->a = x;
            g->name = ct_strndup(p->a, at->s, at->n);
            g->name_len = at->n;
            return g;
        }
        if (at->type != TK_INT) pfail(p, KILN_ERR_INVALID_ARG, at->line, "expected name or number after '.'");
        ct_node *k = node(p, E_CONST, at->line);
        k->cval = ct_int(at->i);
        ct_node *g = node(p, E_GETITEM, t->line);
        g->a = x;
        g->b = k;
        return g;
    }
    /* '[' */
    nvec args = {0};
    while (!is_op(cur(p), O_RBRACKET)) {
        if (args.n) expect_op(p, O_COMMA, "','");
        nv_push(p, &args, parse_subscribed(p));
    }
    expect_op(p, O_RBRACKET, "']'");
    ct_node *g = node(p, E_GETITEM, t->line);
    g->a = x;
    if (args.n == 1) {
        g->b = args.v[0];
    } else {
        ct_node *tu = node(p, E_TUPLE, t->line);
        tu->list = args.v;
        tu->n = args.n;
        g->b = tu;
    }
    return g;
}

/* fn(args...) at `line` (the current token is the '('). */
static ct_node *parse_call(parser *p, ct_node *fn, int line) {
    ct_node *c = node(p, E_CALL, line);
    c->a = fn;
    parse_call_args(p, c);
    return c;
}

static ct_node *parse_postfix(parser *p, ct_node *x) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, O_DOT) || is_op(t, O_LBRACKET)) {
            x = parse_subscript(p, x);
        } else if (is_op(t, O_LPAREN)) {
            x = parse_call(p, x, t->line);
        } else {
            return x;
        }
    }
}

static ct_node *parse_filter_expr(parser *p, ct_node *x) {
    for (;;) {
        tok *t = cur(p);
        if (is_op(t, O_PIPE)) {
            x = parse_filter(p, x, 0);
        } else if (is_name(t, "is")) {
            x = parse_test(p, x);
        } else if (is_op(t, O_LPAREN)) {
            x = parse_call(p, x, t->line);
        } else {
            return x;
        }
    }
}

static ct_node *parse_primary(parser *p) {
    tok *t = cur(p);
    ct_node *x;
    enter(p);
    if (t->type == TK_NAME) {
        advance(p);
        if (is_name(t, "true") || is_name(t, "True") || is_name(t, "false") || is_name(t, "False")) {
            x = node(p, E_CONST, t->line);
            x->cval = ct_bool(t->s[0] == 't' || t->s[0] == 'T');
        } else if (is_name(t, "none") || is_name(t, "None")) {
            x = node(p, E_CONST, t->line);
            x->cval = ct_none();
        } else {
            x = node(p, E_NAME, t->line);
            x->name = ct_strndup(p->a, t->s, t->n);
            x->name_len = t->n;
        }
    } else if (t->type == TK_STRING) {
        advance(p);
        x = node(p, E_CONST, t->line);
        if (cur(p)->type != TK_STRING) {
            x->cval = ct_str(t->s, t->n);
        } else { /* adjacent literals concatenate */
            ct_buf b = {p->a, NULL, 0, 0};
            ct_buf_put(&b, t->s, t->n);
            while (cur(p)->type == TK_STRING) {
                tok *u = advance(p);
                ct_buf_put(&b, u->s, u->n);
            }
            x->cval = ct_buf_val(&b);
        }
    } else if (t->type == TK_INT || t->type == TK_FLOAT) {
        advance(p);
        x = node(p, E_CONST, t->line);
        x->cval = t->type == TK_INT ? ct_int(t->i) : ct_float(t->f);
    } else if (is_op(t, O_LPAREN)) {
        advance(p);
        x = parse_tuple(p, 0, 1, NULL, 1);
        expect_op(p, O_RPAREN, "')'");
    } else if (is_op(t, O_LBRACKET)) {
        advance(p);
        nvec items = {0};
        while (!is_op(cur(p), O_RBRACKET)) {
            if (items.n) expect_op(p, O_COMMA, "','");
            if (is_op(cur(p), O_RBRACKET)) break;
            nv_push(p, &items, parse_expression(p, 1));
        }
        expect_op(p, O_RBRACKET, "']'");
        x = node(p, E_LIST, t->line);
        x->list = items.v;
        x->n = items.n;
    } else if (is_op(t, O_LBRACE)) {
        advance(p);
        nvec keys = {0}, vals = {0};
        while (!is_op(cur(p), O_RBRACE)) {
            if (keys.n) expect_op(p, O_COMMA, "','");
            if (is_op(cur(p), O_RBRACE)) break;
            nv_push(p, &keys, parse_expression(p, 1));
            expect_op(p, O_COLON, "':'");
            nv_push(p, &vals, parse_expression(p, 1));
        }
        expect_op(p, O_RBRACE, "'}'");
        x = node(p, E_DICT, t->line);
        x->list = keys.v;
        x->list2 = vals.v;
        x->n = x->n2 = keys.n;
    } else {
        char buf[96];
        pfail(p, KILN_ERR_INVALID_ARG, t->line, "unexpected %s", describe(t, buf, sizeof buf));
    }
    p->depth--;
    return x;
}

static ct_node *parse_unary(parser *p, int with_filter) {
    tok *t = cur(p);
    ct_node *x;
    enter(p);
    if (is_op(t, O_SUB) || is_op(t, O_ADD)) {
        advance(p);
        x = node(p, is_op(t, O_SUB) ? E_NEG : E_POS, t->line);
        x->a = parse_unary(p, 0);
    } else {
        x = parse_primary(p);
    }
    x = parse_postfix(p, x);
    if (with_filter) x = parse_filter_expr(p, x);
    p->depth--;
    return x;
}

static ct_node *binop(parser *p, int op, ct_node *l, ct_node *r, int line) {
    ct_node *x = node(p, E_BINOP, line);
    x->op = (uint8_t)op;
    x->a = l;
    x->b = r;
    return x;
}

/* One precedence level of binary operators, left-associative: operand (op operand)*, where the
 * token operators tok_ops[i] make E_BINOP nodes of node_ops[i]. */
static ct_node *parse_binops(parser *p, ct_node *(*operand)(parser *), const int *tok_ops, const int *node_ops, int n_ops) {
    ct_node *l = operand(p);
    for (;;) {
        tok *t = cur(p);
        int op = -1;
        for (int i = 0; i < n_ops && op < 0; i++)
            if (is_op(t, tok_ops[i])) op = node_ops[i];
        if (op < 0) return l;
        advance(p);
        l = binop(p, op, l, operand(p), t->line);
    }
}

static ct_node *parse_unary_filtered(parser *p) { return parse_unary(p, 1); }

static ct_node *parse_pow(parser *p) {
    static const int t[] = {O_POW}, o[] = {OP_POW};
    return parse_binops(p, parse_unary_filtered, t, o, 1);
}

static ct_node *parse_math2(parser *p) {
    static const int t[] = {O_MUL, O_DIV, O_FLOORDIV, O_MOD}, o[] = {OP_MUL, OP_DIV, OP_FLOORDIV, OP_MOD};
    return parse_binops(p, parse_pow, t, o, 4);
}

static ct_node *parse_concat(parser *p) {
    int line = cur(p)->line;
    ct_node *first = parse_math2(p);
    if (!is_op(cur(p), O_TILDE)) return first;
    nvec args = {0};
    nv_push(p, &args, first);
    while (is_op(cur(p), O_TILDE)) {
        advance(p);
        nv_push(p, &args, parse_math2(p));
    }
    ct_node *x = node(p, E_CONCAT, line);
    x->list = args.v;
    x->n = args.n;
    return x;
}

static ct_node *parse_math1(parser *p) {
    static const int t[] = {O_ADD, O_SUB}, o[] = {OP_ADD, OP_SUB};
    return parse_binops(p, parse_concat, t, o, 2);
}

static ct_node *parse_compare(parser *p) {
    int line = cur(p)->line;
    ct_node *x = parse_math1(p);
    nvec ops = {0};
    uint8_t opv[64];
    for (;;) {
        tok *t = cur(p);
        int op = is_op(t, O_EQ) ? OP_EQ : is_op(t, O_NE) ? OP_NE : is_op(t, O_LT) ? OP_LT : is_op(t, O_LTEQ) ? OP_LE
                 : is_op(t, O_GT) ? OP_GT : is_op(t, O_GTEQ) ? OP_GE : -1;
        if (op >= 0) {
            advance(p);
        } else if (is_name(t, "in")) {
            advance(p);
            op = OP_IN;
        } else if (is_name(t, "not") && is_name(peek(p), "in")) {
            advance(p);
            advance(p);
            op = OP_NOTIN;
        } else {
            break;
        }
        if (ops.n >= 64) pfail(p, KILN_ERR_UNSUPPORTED, t->line, "comparison chain too long");
        opv[ops.n] = (uint8_t)op;
        nv_push(p, &ops, parse_math1(p));
    }
    if (!ops.n) return x;
    ct_node *c = node(p, E_COMPARE, line);
    c->a = x;
    c->list = ops.v;
    c->n = ops.n;
    c->ops = ct_alloc(p->a, (size_t)ops.n);
    memcpy(c->ops, opv, (size_t)ops.n);
    return c;
}

static ct_node *parse_not(parser *p) {
    if (is_name(cur(p), "not")) {
        int line = advance(p)->line;
        enter(p);
        ct_node *x = node(p, E_NOT, line);
        x->a = parse_not(p);
        p->depth--;
        return x;
    }
    return parse_compare(p);
}

/* operand (keyword operand)*, left-associative: E_AND / E_OR nodes with a, b. */
static ct_node *parse_logic(parser *p, const char *keyword, int kind, ct_node *(*operand)(parser *)) {
    ct_node *l = operand(p);
    while (is_name(cur(p), keyword)) {
        int line = advance(p)->line;
        ct_node *x = node(p, kind, line);
        x->a = l;
        x->b = operand(p);
        l = x;
    }
    return l;
}

static ct_node *parse_and(parser *p) { return parse_logic(p, "and", E_AND, parse_not); }
static ct_node *parse_or(parser *p) { return parse_logic(p, "or", E_OR, parse_and); }

static ct_node *parse_condexpr(parser *p) {
    int line = cur(p)->line;
    ct_node *e1 = parse_or(p);
    while (is_name(cur(p), "if")) {
        advance(p);
        ct_node *x = node(p, E_COND, line);
        x->b = parse_or(p); /* the condition */
        x->a = e1;          /* value when true */
        if (is_name(cur(p), "else")) {
            advance(p);
            x->c = parse_condexpr(p);
        }
        e1 = x;
        line = cur(p)->line;
    }
    return e1;
}

static ct_node *parse_expression(parser *p, int with_condexpr) {
    enter(p);
    ct_node *x = with_condexpr ? parse_condexpr(p) : parse_or(p);
    p->depth--;
    return x;
}

static int is_tuple_end(parser *p, const char *extra_end) {
    tok *t = cur(p);
    if (t->type == TK_VAR_END || t->type == TK_BLOCK_END || is_op(t, O_RPAREN)) return 1;
    return extra_end && is_name(t, extra_end);
}

static ct_node *parse_tuple(parser *p, int simplified, int with_condexpr, const char *extra_end, int explicit_parens) {
    int line = cur(p)->line;
    nvec args = {0};
    int is_tuple = 0;
    for (;;) {
        if (args.n) expect_op(p, O_COMMA, "','");
        if (is_tuple_end(p, extra_end)) break;
        nv_push(p, &args, simplified ? parse_primary(p) : parse_expression(p, with_condexpr));
        if (is_op(cur(p), O_COMMA)) is_tuple = 1;
        else break;
    }
    if (!is_tuple) {
        if (args.n) return args.v[0];
        if (!explicit_parens) unexpected(p, "an expression");
    }
    ct_node *x = node(p, E_TUPLE, line);
    x->list = args.v;
    x->n = args.n;
    return x;
}

/* ---- statements --------------------------------------------------------------------------------- */
static nvec subparse(parser *p, const char *const *end_tokens);

/* Parses the statement body up to one of end_tokens (the current token is then that name). */
static nvec parse_statements(parser *p, const char *const *end_tokens, int drop_needle) {
    if (is_op(cur(p), O_COLON)) advance(p);
    expect_type(p, TK_BLOCK_END, "end of statement block");
    nvec body = subparse(p, end_tokens);
    if (cur(p)->type == TK_EOF) {
        char want[160] = "";
        for (int i = 0; end_tokens[i]; i++)
            snprintf(want + strlen(want), sizeof want - strlen(want), "%s'%s'", i ? " or " : "", end_tokens[i]);
        pfail(p, KILN_ERR_INVALID_ARG, cur(p)->line, "unexpected end of template: looking for %s", want);
    }
    if (drop_needle) advance(p);
    return body;
}

/* Statements up to one of end_tokens (dropped when drop_needle) into x->list / x->n. */
static void parse_body(parser *p, ct_node *x, const char *const *end_tokens, int drop_needle) {
    nvec body = parse_statements(p, end_tokens, drop_needle);
    x->list = body.v;
    x->n = body.n;
}

/* The same into x->list2 / x->n2 (an else branch). */
static void parse_else_body(parser *p, ct_node *x, const char *const *end_tokens) {
    nvec body = parse_statements(p, end_tokens, 1);
    x->list2 = body.v;
    x->n2 = body.n;
}

static ct_node *name_target(parser *p) {
    tok *t = expect_type(p, TK_NAME, "a name");
    ct_node *x = node(p, E_NAME, t->line);
    x->name = ct_strndup(p->a, t->s, t->n);
    x->name_len = t->n;
    return x;
}

/* A for / set target: a name, or names separated by commas (a tuple). */
static ct_node *parse_assign_target(parser *p, const char *extra_end) {
    ct_node *x = parse_tuple(p, 1, 0, extra_end, 0);
    if (x->kind == E_NAME) return x;
    if (x->kind == E_TUPLE) {
        for (int i = 0; i < x->n; i++)
            if (x->list[i]->kind != E_NAME)
                pfail(p, KILN_ERR_UNSUPPORTED, x->line, "unsupported construct: assignment to something other than names");
        return x;
    }
    pfail(p, KILN_ERR_INVALID_ARG, x->line, "can't assign to this expression");
}

static const char *const END_FOR[] = {"endfor", "else", NULL};
static const char *const END_FOR2[] = {"endfor", NULL};
static const char *const END_IF[] = {"elif", "else", "endif", NULL};
static const char *const END_IF2[] = {"endif", NULL};
static const char *const END_SET[] = {"endset", NULL};
static const char *const END_MACRO[] = {"endmacro", NULL};
static const char *const END_GEN[] = {"endgeneration", NULL};
static const char *const END_FILTER[] = {"endfilter", NULL};
static const char *const END_WITH[] = {"endwith", NULL};

static ct_node *parse_statement(parser *p) {
    tok *t = cur(p);
    if (t->type != TK_NAME) unexpected(p, "a tag name");
    int line = t->line;
    enter(p);
    ct_node *x = NULL;
    if (is_name(t, "for")) {
        advance(p);
        x = node(p, N_FOR, line);
        x->b = parse_assign_target(p, "in");
        expect_name(p, "in");
        x->a = parse_tuple(p, 0, 0, "recursive", 0);
        if (is_name(cur(p), "if")) {
            advance(p);
            x->c = parse_expression(p, 1);
        }
        if (is_name(cur(p), "recursive"))
            pfail(p, KILN_ERR_UNSUPPORTED, cur(p)->line, "unsupported construct '{%% for ... recursive %%}'");
        parse_body(p, x, END_FOR, 0);
        if (is_name(advance(p), "else")) parse_else_body(p, x, END_FOR2);
    } else if (is_name(t, "if")) {
        advance(p);
        x = node(p, N_IF, line);
        ct_node *cur_if = x;
        for (;;) {
            cur_if->a = parse_tuple(p, 0, 0, NULL, 0);
            parse_body(p, cur_if, END_IF, 0);
            tok *e = advance(p);
            if (is_name(e, "elif")) {
                ct_node *nx = node(p, N_IF, e->line);
                cur_if->list2 = ct_alloc(p->a, sizeof(ct_node *));
                cur_if->list2[0] = nx;
                cur_if->n2 = 1;
                cur_if = nx;
                continue;
            }
            if (is_name(e, "else")) parse_else_body(p, cur_if, END_IF2);
            break;
        }
    } else if (is_name(t, "set")) {
        advance(p);
        ct_node *target;
        if (cur(p)->type == TK_NAME && is_op(peek(p), O_DOT)) { /* ns.attr */
            tok *ns = advance(p);
            advance(p);
            tok *at = expect_type(p, TK_NAME, "an attribute name");
            target = node(p, E_NSREF, ns->line);
            target->ns = ct_strndup(p->a, ns->s, ns->n);
            target->name = ct_strndup(p->a, at->s, at->n);
            target->name_len = at->n;
        } else {
            target = parse_assign_target(p, NULL);
        }
        if (is_op(cur(p), O_ASSIGN)) {
            advance(p);
            x = node(p, N_SET, line);
            x->b = target;
            x->a = parse_tuple(p, 0, 1, NULL, 0);
        } else {
            x = node(p, N_SET_BLOCK, line);
            x->b = target;
            if (is_op(cur(p), O_PIPE)) x->a = parse_filter(p, NULL, 0);
            parse_body(p, x, END_SET, 1);
        }
    } else if (is_name(t, "macro")) {
        advance(p);
        x = node(p, N_MACRO, line);
        tok *nm = expect_type(p, TK_NAME, "a macro name");
        x->name = ct_strndup(p->a, nm->s, nm->n);
        x->name_len = nm->n;
        expect_op(p, O_LPAREN, "'('");
        nvec defs = {0};
        const char *params[64];
        int np = 0, ndef = 0;
        while (!is_op(cur(p), O_RPAREN)) {
            if (np) expect_op(p, O_COMMA, "','");
            tok *a = expect_type(p, TK_NAME, "a parameter name");
            if (np >= 64) pfail(p, KILN_ERR_UNSUPPORTED, a->line, "more than 64 macro parameters");
            params[np++] = ct_strndup(p->a, a->s, a->n);
            if (is_op(cur(p), O_ASSIGN)) {
                advance(p);
                nv_push(p, &defs, parse_expression(p, 1));
                ndef++;
            } else if (ndef) {
                pfail(p, KILN_ERR_INVALID_ARG, a->line, "non-default argument follows default argument");
            } else {
                nv_push(p, &defs, NULL);
            }
        }
        expect_op(p, O_RPAREN, "')'");
        x->names = ct_alloc(p->a, (size_t)(np ? np : 1) * sizeof *x->names);
        memcpy(x->names, params, (size_t)np * sizeof *params);
        x->nnames = np;
        x->list2 = defs.v;
        x->n2 = defs.n;
        parse_body(p, x, END_MACRO, 1);
    } else if (is_name(t, "break") || is_name(t, "continue")) {
        advance(p);
        x = node(p, is_name(t, "break") ? N_BREAK : N_CONTINUE, line);
    } else if (is_name(t, "generation")) {
        advance(p);
        x = node(p, N_BLOCK, line);
        parse_body(p, x, END_GEN, 1);
    } else if (is_name(t, "filter")) {
        advance(p);
        x = node(p, N_FILTER_BLOCK, line);
        x->a = parse_filter(p, NULL, 1);
        parse_body(p, x, END_FILTER, 1);
    } else if (is_name(t, "with")) {
        advance(p);
        x = node(p, N_WITH, line);
        nvec targets = {0}, vals = {0};
        while (cur(p)->type != TK_BLOCK_END) {
            if (targets.n) expect_op(p, O_COMMA, "','");
            nv_push(p, &targets, name_target(p));
            expect_op(p, O_ASSIGN, "'='");
            nv_push(p, &vals, parse_expression(p, 1));
        }
        x->list2 = vals.v;
        x->n2 = vals.n;
        x->names = ct_alloc(p->a, (size_t)(targets.n ? targets.n : 1) * sizeof *x->names);
        for (int i = 0; i < targets.n; i++) x->names[i] = targets.v[i]->name;
        x->nnames = targets.n;
        parse_body(p, x, END_WITH, 1);
    } else if (is_name(t, "print")) {
        advance(p);
        x = node(p, N_PRINT, line);
        nvec items = {0};
        while (cur(p)->type != TK_BLOCK_END) {
            if (items.n) expect_op(p, O_COMMA, "','");
            nv_push(p, &items, parse_expression(p, 1));
        }
        if (items.n == 1) {
            x->a = items.v[0];
        } else { /* several values print as a tuple would not: jinja prints each */
            x->list = items.v;
            x->n = items.n;
        }
    } else {
        static const char *const unsupported[] = {"include", "import", "from", "extends", "block", "call",
                                                  "autoescape", "do", "trans", NULL};
        static const char *const ends[] = {"endfor", "endif", "endmacro", "endset", "endfilter", "endwith",
                                           "endgeneration", "endraw", "else", "elif", NULL};
        for (int i = 0; unsupported[i]; i++)
            if (is_name(t, unsupported[i]))
                pfail(p, KILN_ERR_UNSUPPORTED, line, "unsupported construct '{%% %s %%}'", unsupported[i]);
        for (int i = 0; ends[i]; i++)
            if (is_name(t, ends[i]))
                pfail(p, KILN_ERR_INVALID_ARG, line, "unexpected '{%% %s %%}' (no open block it closes)", ends[i]);
        pfail(p, KILN_ERR_UNSUPPORTED, line, "unsupported construct '{%% %.*s %%}' (unknown tag)", (int)(t->n > 60 ? 60 : t->n), t->s);
    }
    p->depth--;
    return x;
}

static nvec subparse(parser *p, const char *const *end_tokens) {
    nvec body = {0};
    for (;;) {
        tok *t = cur(p);
        if (t->type == TK_EOF) return body;
        if (t->type == TK_DATA) {
            ct_node *x = node(p, N_DATA, t->line);
            x->cval = ct_str(t->s, t->n);
            nv_push(p, &body, x);
            advance(p);
        } else if (t->type == TK_VAR_BEGIN) {
            advance(p);
            ct_node *x = node(p, N_PRINT, t->line);
            x->a = parse_tuple(p, 0, 1, NULL, 0);
            expect_type(p, TK_VAR_END, "end of print statement");
            nv_push(p, &body, x);
        } else if (t->type == TK_BLOCK_BEGIN) {
            advance(p);
            if (end_tokens)
                for (int i = 0; end_tokens[i]; i++)
                    if (is_name(cur(p), end_tokens[i])) return body;
            nv_push(p, &body, parse_statement(p));
            expect_type(p, TK_BLOCK_END, "end of statement block");
        } else {
            char buf[96];
            pfail(p, KILN_ERR_INVALID_ARG, t->line, "unexpected %s", describe(t, buf, sizeof buf));
        }
    }
}

/* ---- API ------------------------------------------------------------------------------------------ */
/* Newline normalization (\r\n, \r -> \n, one trailing newline dropped, as jinja2), UTF-8 check,
 * lexing and parsing into p->tmpl. Errors longjmp to p->jb. */
static void parse_all(parser *p, const char *source, size_t len) {
    kiln_chat_template *t = p->tmpl;
    char *src = ct_alloc(&t->arena, len + 1);
    size_t k = 0;
    for (size_t i = 0; i < len; i++) {
        if (source[i] == '\r') {
            src[k++] = '\n';
            if (i + 1 < len && source[i + 1] == '\n') i++;
        } else {
            src[k++] = source[i];
        }
    }
    if (k && src[k - 1] == '\n') k--;
    src[k] = 0;
    for (size_t i = 0; i < k;) {
        size_t j = i;
        if (ct_u8_dec(src, k, &j) == 0xFFFFFFFFu) {
            p->st = KILN_ERR_INVALID_ARG;
            snprintf(p->err, 1024, "%s: invalid UTF-8 at byte %zu of the template", p->name, i);
            longjmp(p->jb, 1);
        }
        i = j;
    }
    p->src = src;
    p->len = k;
    lex(p);
    nvec body = subparse(p, NULL);
    if (cur(p)->type != TK_EOF) unexpected(p, "end of template");
    t->body = body.v;
    t->n = body.n;
}

static int parse_guarded(parser *p, const char *source, size_t len) {
    if (setjmp(p->jb)) return -1;
    parse_all(p, source, len);
    return 0;
}

kiln_status kiln_chat_template_parse(const char *source, size_t len, const char *name, kiln_chat_template **out) {
    *out = NULL;
    if (!name) name = "chat_template";
    if (!source && len) return kiln_fail(KILN_ERR_INVALID_ARG, "%s: NULL template source", name);
    kiln_chat_template *t = calloc(1, sizeof *t);
    char *err = malloc(1024);
    char *nm = strdup(name);
    if (!t || !err || !nm) {
        free(t);
        free(err);
        free(nm);
        return kiln_fail(KILN_ERR_NOMEM, "%s: out of memory", name);
    }
    t->name = nm;
    t->errbuf = err;
    parser p;
    memset(&p, 0, sizeof p);
    p.a = &t->arena;
    p.err = err;
    p.name = nm;
    p.tmpl = t;
    t->arena.oom = &p.jb;
    t->arena.oom_msg = err;
    t->arena.limit = (size_t)1 << 30;
    int rc = parse_guarded(&p, source ? source : "", len);
    t->arena.oom = NULL; /* p.jb dies with this frame; nothing is allocated in this arena after parsing */
    if (rc) {
        kiln_status r = kiln_fail(p.st ? p.st : KILN_ERR_NOMEM, "%s", err);
        kiln_chat_template_free(t);
        return r;
    }
    *out = t;
    return KILN_OK;
}

void kiln_chat_template_free(kiln_chat_template *t) {
    if (!t) return;
    ct_arena_free(&t->arena);
    free(t->name);
    free(t->errbuf);
    free(t);
}
