/* chat_template_eval.c — rendering a parsed chat template.
 *
 * Scopes follow jinja2 3.1: the template body has one scope (its parent holds the render
 * variables); every for-loop iteration, macro call, {% with %}, {% generation %} and block set
 * gets a fresh child scope, so a {% set %} inside them is not seen outside (nor by the next
 * iteration) — which is why templates use namespace(). {% if %} opens no scope. Name lookup walks
 * the chain, then the globals (range, namespace, dict, raise_exception, strftime_now).
 *
 * Attribute and item access follow jinja2's environment.getattr / getitem: `x.name` is a method of
 * x (dict.items, str.strip) before it is a key, `x["name"]` a key before a method; a missing key,
 * index or attribute is Undefined, which prints as "", is false, iterates as empty, and fails any
 * other use (attribute access, arithmetic, calls, tojson) with an UndefinedError-like message. */
#include "tokenizer/chat_template_internal.h"
#include "base/status.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct ct_scope {
    ct_scope *parent;
    size_t n, cap;
    const char **names;
    size_t *lens;
    ct_val *vals;
};

enum { X_NORMAL = 0, X_BREAK = 1, X_CONTINUE = 2 };

static ct_scope *scope_new(ct_ctx *c, ct_scope *parent) {
    ct_scope *s = ct_alloc(&c->arena, sizeof *s);
    s->parent = parent;
    return s;
}

static void scope_set(ct_ctx *c, ct_scope *s, const char *name, size_t len, ct_val v) {
    for (size_t i = 0; i < s->n; i++)
        if (s->lens[i] == len && memcmp(s->names[i], name, len) == 0) {
            s->vals[i] = v;
            return;
        }
    if (s->n == s->cap) {
        size_t nc = s->cap ? s->cap * 2 : 8;
        const char **nn = ct_alloc(&c->arena, nc * sizeof *nn);
        size_t *nl = ct_alloc(&c->arena, nc * sizeof *nl);
        ct_val *nv = ct_alloc(&c->arena, nc * sizeof *nv);
        if (s->n) {
            memcpy(nn, s->names, s->n * sizeof *nn);
            memcpy(nl, s->lens, s->n * sizeof *nl);
            memcpy(nv, s->vals, s->n * sizeof *nv);
        }
        s->names = nn;
        s->lens = nl;
        s->vals = nv;
        s->cap = nc;
    }
    s->names[s->n] = name;
    s->lens[s->n] = len;
    s->vals[s->n] = v;
    s->n++;
}

static ct_val *scope_find(ct_scope *s, const char *name, size_t len) {
    for (; s; s = s->parent)
        for (size_t i = 0; i < s->n; i++)
            if (s->lens[i] == len && memcmp(s->names[i], name, len) == 0) return &s->vals[i];
    return NULL;
}

static ct_val eval(ct_ctx *c, ct_scope *s, const ct_node *x);
static int exec_body(ct_ctx *c, ct_scope *s, ct_node *const *body, int n);

_Noreturn static void fail_undefined(ct_ctx *c, ct_val u) {
    if (u.view && u.u.s.p) ct_fail(c, KILN_ERR_INVALID_ARG, "%.*s", (int)u.u.s.n, u.u.s.p);
    if (u.u.s.p) ct_fail(c, KILN_ERR_INVALID_ARG, "'%.*s' is undefined", (int)(u.u.s.n > 200 ? 200 : u.u.s.n), u.u.s.p);
    ct_fail(c, KILN_ERR_INVALID_ARG, "a value is undefined");
}

/* ---- iteration ---------------------------------------------------------------------------------- */
ct_val ct_list_of(ct_ctx *c, ct_val v) {
    switch (v.t) {
    case CT_LIST:
        if (!v.tuple && !v.view) return v;
        {
            ct_val l = ct_list_new(&c->arena, v.u.l->n, 0);
            memcpy(l.u.l->v, v.u.l->v, v.u.l->n * sizeof(ct_val));
            return l;
        }
    case CT_DICT: {
        ct_val l = ct_list_new(&c->arena, v.u.d->n, 0);
        memcpy(l.u.l->v, v.u.d->k, v.u.d->n * sizeof(ct_val));
        return l;
    }
    case CT_STR: {
        size_t n = ct_u8_count(v.u.s.p, v.u.s.n), i = 0, k = 0;
        ct_val l = ct_list_new(&c->arena, n, 0);
        while (i < v.u.s.n) {
            size_t st = i;
            ct_u8_dec(v.u.s.p, v.u.s.n, &i);
            l.u.l->v[k++] = ct_str(v.u.s.p + st, i - st);
        }
        return l;
    }
    case CT_UNDEF: return ct_list_new(&c->arena, 0, 0);
    default: ct_fail(c, KILN_ERR_INVALID_ARG, "'%s' object is not iterable", ct_type_name(v));
    }
}

/* ---- attribute / item access ----------------------------------------------------------------------- */
/* Undefined for a missing attribute / key, with jinja2's message for when it gets used */
static ct_val missing(ct_ctx *c, ct_val obj, const char *name, size_t n) {
    ct_buf b = {&c->arena, NULL, 0, 0};
    ct_buf_printf(&b, "'%s object' has no attribute '%.*s'", ct_type_name(obj), (int)(n > 200 ? 200 : n), name);
    ct_val u = ct_undef(b.p, b.n);
    u.view = 1;
    return u;
}

static ct_val method_val(ct_ctx *c, ct_val obj, int id) {
    ct_val m = {0};
    m.t = CT_METHOD;
    m.fn = (uint16_t)id;
    m.u.self = ct_alloc(&c->arena, sizeof(ct_val));
    *m.u.self = obj;
    return m;
}

static ct_val loop_attr(ct_ctx *c, ct_val obj, const char *name, size_t n, int *found) {
    const ct_loop *L = obj.u.loop;
    size_t len = L->items->n, i = L->index0;
    *found = 1;
#define IS(s) (n == sizeof(s) - 1 && memcmp(name, s, n) == 0)
    if (IS("index")) return ct_int((int64_t)i + 1);
    if (IS("index0")) return ct_int((int64_t)i);
    if (IS("revindex")) return ct_int((int64_t)(len - i));
    if (IS("revindex0")) return ct_int((int64_t)(len - i - 1));
    if (IS("first")) return ct_bool(i == 0);
    if (IS("last")) return ct_bool(i + 1 == len);
    if (IS("length")) return ct_int((int64_t)len);
    if (IS("depth")) return ct_int(L->depth);
    if (IS("depth0")) return ct_int(L->depth - 1);
    if (IS("previtem")) return i > 0 ? L->items->v[i - 1] : ct_undef("there is no previous item", 25);
    if (IS("nextitem")) return i + 1 < len ? L->items->v[i + 1] : ct_undef("there is no next item", 21);
#undef IS
    (void)c;
    *found = 0;
    return ct_none();
}

ct_val ct_getattr(ct_ctx *c, ct_val obj, const char *name, size_t n) {
    if (obj.t == CT_UNDEF) fail_undefined(c, obj);
    int unsafe = 0, id = ct_method_id(obj, name, n, &unsafe);
    if (unsafe == 2) ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct '%s.%.*s'", ct_type_name(obj), (int)n, name);
    if (unsafe || (n && name[0] == '_')) {
        /* the sandbox's unsafe_undefined: harmless until used (printing it gives "") */
        ct_buf b = {&c->arena, NULL, 0, 0};
        ct_buf_printf(&b, "access to attribute '%.*s' of '%s' object is unsafe (the template sandbox is immutable)",
                      (int)n, name, ct_type_name(obj));
        ct_val u = ct_undef(b.p, b.n);
        u.view = 1;
        return u;
    }
    if (id >= 0) return method_val(c, obj, id);
    if (obj.t == CT_DICT || obj.t == CT_NS) {
        ct_val *v = ct_dict_get_str(obj.u.d, name, n);
        if (v) return *v;
    }
    if (obj.t == CT_LOOP) {
        int found;
        ct_val v = loop_attr(c, obj, name, n, &found);
        if (found) return v;
    }
    return missing(c, obj, name, n);
}

/* Python's slice.indices(len) + the element count */
static size_t slice_indices(ct_ctx *c, const ct_val *sv, size_t len, int64_t *start, int64_t *stop, int64_t *step) {
    for (int i = 0; i < 3; i++)
        if (sv[i].t != CT_NONE && sv[i].t != CT_INT && sv[i].t != CT_BOOL)
            ct_fail(c, KILN_ERR_INVALID_ARG, "slice indices must be integers or None, not %s", ct_type_name(sv[i]));
    int64_t L = (int64_t)len;
    *step = sv[2].t == CT_NONE ? 1 : sv[2].u.i;
    if (*step == 0) ct_fail(c, KILN_ERR_INVALID_ARG, "slice step cannot be zero");
    int64_t lo = *step < 0 ? -1 : 0, hi = *step < 0 ? L - 1 : L;
    if (sv[0].t == CT_NONE) *start = *step < 0 ? hi : lo;
    else {
        *start = sv[0].u.i;
        if (*start < 0) { *start += L; if (*start < lo) *start = lo; }
        else if (*start > hi) *start = hi;
    }
    if (sv[1].t == CT_NONE) *stop = *step < 0 ? lo : hi;
    else {
        *stop = sv[1].u.i;
        if (*stop < 0) { *stop += L; if (*stop < lo) *stop = lo; }
        else if (*stop > hi) *stop = hi;
    }
    if (*step > 0) return *stop > *start ? (size_t)((*stop - *start - 1) / *step + 1) : 0;
    return *start > *stop ? (size_t)((*start - *stop - 1) / (-*step) + 1) : 0;
}

static ct_val do_slice(ct_ctx *c, ct_val obj, const ct_val *sv) {
    int64_t start, stop, step;
    if (obj.t == CT_LIST) {
        size_t k = slice_indices(c, sv, obj.u.l->n, &start, &stop, &step);
        ct_val r = ct_list_new(&c->arena, k, obj.tuple);
        for (size_t i = 0; i < k; i++) r.u.l->v[i] = obj.u.l->v[start + (int64_t)i * step];
        return r;
    }
    if (obj.t == CT_STR) {
        const char *p = obj.u.s.p;
        size_t n = obj.u.s.n, cps = ct_u8_count(p, n);
        size_t k = slice_indices(c, sv, cps, &start, &stop, &step);
        if (step == 1) { /* contiguous */
            size_t a = ct_u8_offset(p, n, (size_t)start), b = ct_u8_offset(p, n, (size_t)start + k);
            return ct_str(p + a, b - a);
        }
        /* offsets of every code point, then pick */
        size_t *off = ct_alloc(&c->arena, (cps + 1) * sizeof *off);
        for (size_t i = 0, j = 0; j <= cps; j++) {
            off[j] = i;
            if (i < n) ct_u8_dec(p, n, &i);
        }
        ct_buf b = {&c->arena, NULL, 0, 0};
        for (size_t i = 0; i < k; i++) {
            size_t cp = (size_t)(start + (int64_t)i * step);
            ct_buf_put(&b, p + off[cp], off[cp + 1] - off[cp]);
        }
        return ct_buf_val(&b);
    }
    if (obj.t == CT_UNDEF) fail_undefined(c, obj);
    return ct_undef("slice", 5);
}

ct_val ct_getitem(ct_ctx *c, ct_val obj, ct_val key) {
    if (obj.t == CT_UNDEF) fail_undefined(c, obj);
    switch (obj.t) {
    case CT_DICT: {
        ct_val *v = ct_dict_get(obj.u.d, key);
        if (v) return *v;
        break;
    }
    case CT_LIST:
    case CT_STR:
        if (key.t == CT_INT || key.t == CT_BOOL) {
            int64_t i = key.u.i;
            size_t len = obj.t == CT_LIST ? obj.u.l->n : ct_u8_count(obj.u.s.p, obj.u.s.n);
            if (i < 0) i += (int64_t)len;
            if (i < 0 || i >= (int64_t)len) {
                ct_buf b = {&c->arena, NULL, 0, 0};
                ct_buf_printf(&b, "%s object has no element %lld", ct_type_name(obj), (long long)key.u.i);
                ct_val u = ct_undef(b.p, b.n);
                u.view = 1;
                return u;
            }
            if (obj.t == CT_LIST) return obj.u.l->v[i];
            size_t a = ct_u8_offset(obj.u.s.p, obj.u.s.n, (size_t)i), e = a;
            ct_u8_dec(obj.u.s.p, obj.u.s.n, &e);
            return ct_str(obj.u.s.p + a, e - a);
        }
        break;
    default: break;
    }
    /* jinja2 falls back to an attribute of that name */
    if (key.t == CT_STR) return ct_getattr(c, obj, key.u.s.p, key.u.s.n);
    return ct_undef("item", 4);
}

/* ---- arithmetic ------------------------------------------------------------------------------------ */
static int is_int(ct_val v) { return v.t == CT_INT || v.t == CT_BOOL; }
static int is_num(ct_val v) { return is_int(v) || v.t == CT_FLOAT; }
static double num(ct_val v) { return v.t == CT_FLOAT ? v.u.f : (double)v.u.i; }

_Noreturn static void bad_operands(ct_ctx *c, const char *op, ct_val a, ct_val b) {
    if (a.t == CT_UNDEF) fail_undefined(c, a);
    if (b.t == CT_UNDEF) fail_undefined(c, b);
    ct_fail(c, KILN_ERR_INVALID_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op, ct_type_name(a),
            ct_type_name(b));
}

static ct_val repeat(ct_ctx *c, ct_val seq, int64_t k) {
    if (k < 0) k = 0;
    if (seq.t == CT_STR) {
        if (seq.u.s.n && (uint64_t)k > ((uint64_t)1 << 30) / seq.u.s.n)
            ct_fail(c, KILN_ERR_INVALID_ARG, "string repetition too large");
        ct_buf b = {&c->arena, NULL, 0, 0};
        for (int64_t i = 0; i < k; i++) ct_buf_put(&b, seq.u.s.p, seq.u.s.n);
        return ct_buf_val(&b);
    }
    size_t n = seq.u.l->n;
    if (n && (uint64_t)k > ((uint64_t)1 << 26) / n) ct_fail(c, KILN_ERR_INVALID_ARG, "list repetition too large");
    ct_val r = ct_list_new(&c->arena, n * (size_t)k, seq.tuple);
    for (int64_t i = 0; i < k; i++) memcpy(r.u.l->v + (size_t)i * n, seq.u.l->v, n * sizeof(ct_val));
    return r;
}

static ct_val binop(ct_ctx *c, int op, ct_val a, ct_val b) {
    static const char *const names[] = {"+", "-", "*", "/", "//", "%", "**"};
    int64_t r;
    if (is_int(a) && is_int(b)) {
        int64_t x = a.u.i, y = b.u.i;
        switch (op) {
        case OP_ADD: if (__builtin_add_overflow(x, y, &r)) goto ovf; return ct_int(r);
        case OP_SUB: if (__builtin_sub_overflow(x, y, &r)) goto ovf; return ct_int(r);
        case OP_MUL: if (__builtin_mul_overflow(x, y, &r)) goto ovf; return ct_int(r);
        case OP_DIV:
            if (!y) ct_fail(c, KILN_ERR_INVALID_ARG, "division by zero");
            return ct_float((double)x / (double)y);
        case OP_FLOORDIV:
        case OP_MOD: {
            if (!y) ct_fail(c, KILN_ERR_INVALID_ARG, "integer division or modulo by zero");
            if (x == INT64_MIN && y == -1) goto ovf;
            int64_t q = x / y, m = x % y;
            if (m && ((m < 0) != (y < 0))) { q--; m += y; }
            return ct_int(op == OP_FLOORDIV ? q : m);
        }
        case OP_POW: {
            if (y < 0) return ct_float(pow((double)x, (double)y));
            int64_t base = x, e = y;
            r = 1;
            while (e) {
                if ((e & 1) && __builtin_mul_overflow(r, base, &r)) goto ovf;
                e >>= 1;
                if (e && __builtin_mul_overflow(base, base, &base)) goto ovf;
            }
            return ct_int(r);
        }
        }
    }
    if (is_num(a) && is_num(b)) {
        double x = num(a), y = num(b);
        switch (op) {
        case OP_ADD: return ct_float(x + y);
        case OP_SUB: return ct_float(x - y);
        case OP_MUL: return ct_float(x * y);
        case OP_DIV:
            if (y == 0) ct_fail(c, KILN_ERR_INVALID_ARG, "float division by zero");
            return ct_float(x / y);
        case OP_FLOORDIV:
        case OP_MOD: { /* CPython's float divmod */
            if (y == 0) ct_fail(c, KILN_ERR_INVALID_ARG, "float modulo by zero");
            double m = fmod(x, y), d = (x - m) / y;
            if (m != 0) {
                if ((y < 0) != (m < 0)) { m += y; d -= 1.0; }
            } else {
                m = copysign(0.0, y);
            }
            if (op == OP_MOD) return ct_float(m);
            double fd;
            if (d != 0) {
                fd = floor(d);
                if (d - fd > 0.5) fd += 1.0;
            } else {
                fd = copysign(0.0, x / y);
            }
            return ct_float(fd);
        }
        case OP_POW: return ct_float(pow(x, y));
        }
    }
    if (op == OP_ADD && a.t == CT_STR && b.t == CT_STR) {
        ct_buf bb = {&c->arena, NULL, 0, 0};
        ct_buf_put(&bb, a.u.s.p, a.u.s.n);
        ct_buf_put(&bb, b.u.s.p, b.u.s.n);
        return ct_buf_val(&bb);
    }
    if (op == OP_ADD && a.t == CT_LIST && b.t == CT_LIST && a.tuple == b.tuple) {
        ct_val l = ct_list_new(&c->arena, a.u.l->n + b.u.l->n, a.tuple);
        memcpy(l.u.l->v, a.u.l->v, a.u.l->n * sizeof(ct_val));
        memcpy(l.u.l->v + a.u.l->n, b.u.l->v, b.u.l->n * sizeof(ct_val));
        return l;
    }
    if (op == OP_MUL && (a.t == CT_STR || a.t == CT_LIST) && is_int(b)) return repeat(c, a, b.u.i);
    if (op == OP_MUL && (b.t == CT_STR || b.t == CT_LIST) && is_int(a)) return repeat(c, b, a.u.i);
    if (op == OP_MOD && a.t == CT_STR)
        ct_fail(c, KILN_ERR_UNSUPPORTED, "unsupported construct 'str %% values' (printf-style formatting; use the format filter)");
    bad_operands(c, names[op], a, b);
ovf:
    ct_fail(c, KILN_ERR_UNSUPPORTED, "integer overflow in '%s' (kiln integers are 64-bit)", names[op]);
}

static int contains(ct_ctx *c, ct_val container, ct_val item) {
    switch (container.t) {
    case CT_STR:
        if (item.t != CT_STR)
            ct_fail(c, KILN_ERR_INVALID_ARG, "'in <string>' requires string as left operand, not %s", ct_type_name(item));
        if (!item.u.s.n) return 1;
        return memmem(container.u.s.p, container.u.s.n, item.u.s.p, item.u.s.n) != NULL;
    case CT_LIST:
        for (size_t i = 0; i < container.u.l->n; i++)
            if (ct_equal(container.u.l->v[i], item)) return 1;
        return 0;
    case CT_DICT: return ct_dict_get(container.u.d, item) != NULL;
    case CT_UNDEF: return 0;
    default: ct_fail(c, KILN_ERR_INVALID_ARG, "argument of type '%s' is not iterable", ct_type_name(container));
    }
}

static int compare_op(ct_ctx *c, int op, ct_val a, ct_val b) {
    switch (op) {
    case OP_EQ: return ct_equal(a, b);
    case OP_NE: return !ct_equal(a, b);
    case OP_IN: return contains(c, b, a);
    case OP_NOTIN: return !contains(c, b, a);
    default: break;
    }
    if (a.t == CT_UNDEF) fail_undefined(c, a);
    if (b.t == CT_UNDEF) fail_undefined(c, b);
    int r = ct_compare(c, a, b);
    switch (op) {
    case OP_LT: return r < 0;
    case OP_LE: return r <= 0;
    case OP_GT: return r > 0;
    default: return r >= 0;
    }
}

/* ---- calls ----------------------------------------------------------------------------------------- */
static void eval_args(ct_ctx *c, ct_scope *s, const ct_node *x, ct_args *a) {
    a->npos = x->n;
    a->nkw = x->n2;
    a->pos = ct_alloc(&c->arena, (size_t)(x->n ? x->n : 1) * sizeof(ct_val));
    a->kwv = ct_alloc(&c->arena, (size_t)(x->n2 ? x->n2 : 1) * sizeof(ct_val));
    a->kw = x->names;
    for (int i = 0; i < x->n; i++) a->pos[i] = eval(c, s, x->list[i]);
    for (int i = 0; i < x->n2; i++) a->kwv[i] = eval(c, s, x->list2[i]);
}

static ct_val call_macro(ct_ctx *c, const ct_macro *m, ct_args *a, int line) {
    const ct_node *x = m->node;
    if (a->npos > x->nnames)
        ct_fail(c, KILN_ERR_INVALID_ARG, "macro '%s' takes not more than %d argument(s)", m->name, x->nnames);
    if (++c->depth > 100) ct_fail(c, KILN_ERR_INVALID_ARG, "macro '%s': recursion too deep", m->name);
    ct_scope *ms = scope_new(c, m->scope);
    ct_val *bound = ct_alloc(&c->arena, (size_t)(x->nnames ? x->nnames : 1) * sizeof *bound);
    char *given = ct_alloc(&c->arena, (size_t)(x->nnames ? x->nnames : 1));
    for (int i = 0; i < a->npos; i++) { bound[i] = a->pos[i]; given[i] = 1; }
    for (int k = 0; k < a->nkw; k++) {
        int i;
        for (i = 0; i < x->nnames; i++)
            if (strcmp(x->names[i], a->kw[k]) == 0) break;
        if (i == x->nnames) ct_fail(c, KILN_ERR_INVALID_ARG, "macro '%s' takes no keyword argument '%s'", m->name, a->kw[k]);
        if (given[i]) ct_fail(c, KILN_ERR_INVALID_ARG, "macro '%s' got multiple values for argument '%s'", m->name, a->kw[k]);
        bound[i] = a->kwv[k];
        given[i] = 1;
    }
    for (int i = 0; i < x->nnames; i++) {
        if (!given[i]) {
            const ct_node *d = x->list2 ? x->list2[i] : NULL;
            bound[i] = d ? eval(c, ms, d) : ct_undef(x->names[i], strlen(x->names[i]));
        }
        scope_set(c, ms, x->names[i], strlen(x->names[i]), bound[i]);
    }
    ct_buf out = {&c->arena, NULL, 0, 0}, *saved = c->out;
    c->out = &out;
    int r = exec_body(c, ms, x->list, x->n);
    c->out = saved;
    c->line = line;
    if (r != X_NORMAL) ct_fail(c, KILN_ERR_INVALID_ARG, "'%s' outside a loop", r == X_BREAK ? "break" : "continue");
    c->depth--;
    return ct_buf_val(&out);
}

static ct_val call_value(ct_ctx *c, ct_val f, ct_args *a, int line) {
    switch (f.t) {
    case CT_MACRO: return call_macro(c, f.u.m, a, line);
    case CT_FUNC: return ct_call_global(c, f.fn, a);
    case CT_METHOD: return ct_call_method(c, f, a);
    case CT_UNDEF: fail_undefined(c, f);
    default: ct_fail(c, KILN_ERR_INVALID_ARG, "'%s' object is not callable", ct_type_name(f));
    }
}

/* ---- expressions ------------------------------------------------------------------------------------- */
static ct_val eval(ct_ctx *c, ct_scope *s, const ct_node *x) {
    if (++c->depth > 400) ct_fail(c, KILN_ERR_UNSUPPORTED, "expression nested too deeply");
    c->line = x->line;
    ct_val r;
    switch (x->kind) {
    case E_CONST: r = x->cval; break;
    case E_NAME: {
        ct_val *v = scope_find(s, x->name, x->name_len);
        if (v) { r = *v; break; }
        int g = ct_global_id(x->name, x->name_len);
        r = g >= 0 ? ct_global_val(g) : ct_undef(x->name, x->name_len);
        break;
    }
    case E_GETATTR: r = ct_getattr(c, eval(c, s, x->a), x->name, x->name_len); break;
    case E_GETITEM: {
        ct_val obj = eval(c, s, x->a);
        if (x->b->kind == E_SLICE) {
            ct_val sv[3];
            const ct_node *parts[3] = {x->b->a, x->b->b, x->b->c};
            for (int i = 0; i < 3; i++) sv[i] = parts[i] ? eval(c, s, parts[i]) : ct_none();
            c->line = x->line;
            r = do_slice(c, obj, sv);
        } else {
            ct_val key = eval(c, s, x->b);
            c->line = x->line;
            r = ct_getitem(c, obj, key);
        }
        break;
    }
    case E_CALL: {
        ct_val f = eval(c, s, x->a);
        ct_args a;
        eval_args(c, s, x, &a);
        c->line = x->line;
        r = call_value(c, f, &a, x->line);
        break;
    }
    case E_FILTER: {
        ct_val v = x->a ? eval(c, s, x->a) : ct_none();
        ct_args a;
        eval_args(c, s, x, &a);
        c->line = x->line;
        r = ct_call_filter(c, x->fid, v, &a);
        break;
    }
    case E_TEST: {
        ct_val v = eval(c, s, x->a);
        ct_args a;
        eval_args(c, s, x, &a);
        c->line = x->line;
        r = ct_bool(ct_call_test(c, x->fid, v, &a));
        break;
    }
    case E_LIST:
    case E_TUPLE:
        r = ct_list_new(&c->arena, (size_t)x->n, x->kind == E_TUPLE);
        for (int i = 0; i < x->n; i++) r.u.l->v[i] = eval(c, s, x->list[i]);
        break;
    case E_DICT:
        r = ct_dict_new(&c->arena, (size_t)x->n);
        for (int i = 0; i < x->n; i++) {
            ct_val k = eval(c, s, x->list[i]), v = eval(c, s, x->list2[i]);
            if (k.t == CT_LIST && !k.tuple) ct_fail(c, KILN_ERR_INVALID_ARG, "unhashable type: 'list'");
            if (k.t == CT_DICT) ct_fail(c, KILN_ERR_INVALID_ARG, "unhashable type: 'dict'");
            ct_dict_set(&c->arena, r.u.d, k, v);
        }
        break;
    case E_BINOP: {
        ct_val a = eval(c, s, x->a), b = eval(c, s, x->b);
        c->line = x->line;
        r = binop(c, x->op, a, b);
        break;
    }
    case E_CONCAT: {
        ct_buf b = {&c->arena, NULL, 0, 0};
        for (int i = 0; i < x->n; i++) ct_str_of(c, &b, eval(c, s, x->list[i]));
        r = ct_buf_val(&b);
        break;
    }
    case E_COMPARE: {
        ct_val left = eval(c, s, x->a);
        r = ct_bool(1);
        for (int i = 0; i < x->n; i++) {
            ct_val right = eval(c, s, x->list[i]);
            c->line = x->line;
            if (!compare_op(c, x->ops[i], left, right)) {
                r = ct_bool(0);
                break;
            }
            left = right;
        }
        break;
    }
    case E_AND: {
        ct_val a = eval(c, s, x->a);
        r = ct_truthy(c, a) ? eval(c, s, x->b) : a;
        break;
    }
    case E_OR: {
        ct_val a = eval(c, s, x->a);
        r = ct_truthy(c, a) ? a : eval(c, s, x->b);
        break;
    }
    case E_NOT: r = ct_bool(!ct_truthy(c, eval(c, s, x->a))); break;
    case E_NEG:
    case E_POS: {
        ct_val a = eval(c, s, x->a);
        c->line = x->line;
        if (a.t == CT_UNDEF) fail_undefined(c, a);
        if (!is_num(a)) ct_fail(c, KILN_ERR_INVALID_ARG, "bad operand type for unary %c: '%s'", x->kind == E_NEG ? '-' : '+',
                                ct_type_name(a));
        if (x->kind == E_POS) r = a.t == CT_BOOL ? ct_int(a.u.i) : a;
        else if (a.t == CT_FLOAT) r = ct_float(-a.u.f);
        else if (a.u.i == INT64_MIN) ct_fail(c, KILN_ERR_UNSUPPORTED, "integer overflow in unary '-'");
        else r = ct_int(-a.u.i);
        break;
    }
    case E_COND:
        if (ct_truthy(c, eval(c, s, x->b))) r = eval(c, s, x->a);
        else r = x->c ? eval(c, s, x->c) : ct_undef("the inline if-expression had no else", 37);
        break;
    default: ct_fail(c, KILN_ERR_INTERNAL, "internal error: node kind %d in an expression", x->kind);
    }
    c->depth--;
    return r;
}

/* ---- statements ---------------------------------------------------------------------------------------- */
/* Binds a for / set target (a name or a tuple of names) in scope s. */
static void assign(ct_ctx *c, ct_scope *s, const ct_node *target, ct_val v) {
    if (target->kind == E_NAME) {
        scope_set(c, s, target->name, target->name_len, v);
        return;
    }
    /* unpacking */
    ct_val l = ct_list_of(c, v);
    if (l.u.l->n != (size_t)target->n)
        ct_fail(c, KILN_ERR_INVALID_ARG, "%s values to unpack (expected %d, got %zu)",
                l.u.l->n > (size_t)target->n ? "too many" : "not enough", target->n, l.u.l->n);
    for (int i = 0; i < target->n; i++) scope_set(c, s, target->list[i]->name, target->list[i]->name_len, l.u.l->v[i]);
}

/* The target of {% set %} (either form): ns.attr on a namespace(), or what assign binds. */
static void assign_set(ct_ctx *c, ct_scope *s, const ct_node *target, ct_val v) {
    if (target->kind != E_NSREF) {
        assign(c, s, target, v);
        return;
    }
    ct_val *ns = scope_find(s, target->ns, strlen(target->ns));
    if (!ns || ns->t != CT_NS) ct_fail(c, KILN_ERR_INVALID_ARG, "cannot assign attribute on non-namespace object '%s'", target->ns);
    ct_dict_set(&c->arena, ns->u.d, ct_str(target->name, target->name_len), v);
}

/* Renders body into a string in a child scope (block set, filter block). */
static ct_val render_to_string(ct_ctx *c, ct_scope *s, ct_node *const *body, int n) {
    ct_buf out = {&c->arena, NULL, 0, 0}, *saved = c->out;
    c->out = &out;
    int r = exec_body(c, scope_new(c, s), body, n);
    c->out = saved;
    if (r != X_NORMAL) ct_fail(c, KILN_ERR_INVALID_ARG, "'%s' outside a loop", r == X_BREAK ? "break" : "continue");
    return ct_buf_val(&out);
}

/* Applies a filter chain parsed with no input (x->a == NULL at its innermost filter) to v. */
static ct_val apply_filters(ct_ctx *c, ct_scope *s, const ct_node *f, ct_val v) {
    if (!f) return v;
    if (f->a) v = apply_filters(c, s, f->a, v);
    ct_args a;
    eval_args(c, s, f, &a);
    c->line = f->line;
    return ct_call_filter(c, f->fid, v, &a);
}

static int exec_for(ct_ctx *c, ct_scope *s, const ct_node *x) {
    ct_val it = eval(c, s, x->a);
    c->line = x->line;
    if (it.t == CT_NONE || it.t == CT_BOOL || it.t == CT_INT || it.t == CT_FLOAT)
        ct_fail(c, KILN_ERR_INVALID_ARG, "'%s' object is not iterable", ct_type_name(it));
    ct_val items = ct_list_of(c, it);
    if (x->c) { /* {% for x in xs if cond %}: filtered before the loop (loop.length counts the kept ones) */
        ct_val kept = ct_list_new(&c->arena, items.u.l->n, 0);
        size_t k = 0;
        for (size_t i = 0; i < items.u.l->n; i++) {
            ct_scope *ts = scope_new(c, s);
            assign(c, ts, x->b, items.u.l->v[i]);
            if (ct_truthy(c, eval(c, ts, x->c))) kept.u.l->v[k++] = items.u.l->v[i];
        }
        kept.u.l->n = k;
        items = kept;
    }
    ct_loop *L = ct_alloc(&c->arena, sizeof *L);
    L->items = items.u.l;
    ct_scope *parent_loop_scope = s;
    L->depth = 1; /* loop.depth counts recursive loops, which are not supported */
    ct_val lv = {0};
    lv.t = CT_LOOP;
    lv.u.loop = L;
    for (size_t i = 0; i < items.u.l->n; i++) {
        ct_loop *Li = ct_alloc(&c->arena, sizeof *Li); /* each iteration's loop object keeps its index */
        *Li = *L;
        Li->index0 = i;
        lv.u.loop = Li;
        ct_scope *is = scope_new(c, parent_loop_scope);
        scope_set(c, is, "loop", 4, lv);
        assign(c, is, x->b, items.u.l->v[i]);
        int r = exec_body(c, is, x->list, x->n);
        if (r == X_BREAK) break;
    }
    if (!items.u.l->n && x->n2) {
        int r = exec_body(c, scope_new(c, s), x->list2, x->n2);
        if (r != X_NORMAL) return r;
    }
    return X_NORMAL;
}

static int exec_stmt(ct_ctx *c, ct_scope *s, const ct_node *x) {
    c->line = x->line;
    switch (x->kind) {
    case N_DATA: ct_buf_put(c->out, x->cval.u.s.p, x->cval.u.s.n); return X_NORMAL;
    case N_PRINT:
        if (x->a) ct_str_of(c, c->out, eval(c, s, x->a));
        for (int i = 0; i < x->n; i++) ct_str_of(c, c->out, eval(c, s, x->list[i]));
        return X_NORMAL;
    case N_IF:
        if (ct_truthy(c, eval(c, s, x->a))) return exec_body(c, s, x->list, x->n);
        return exec_body(c, s, x->list2, x->n2);
    case N_FOR: return exec_for(c, s, x);
    case N_SET: {
        ct_val v = eval(c, s, x->a);
        c->line = x->line;
        assign_set(c, s, x->b, v);
        return X_NORMAL;
    }
    case N_SET_BLOCK: {
        ct_val v = apply_filters(c, s, x->a, render_to_string(c, s, x->list, x->n));
        c->line = x->line;
        assign_set(c, s, x->b, v);
        return X_NORMAL;
    }
    case N_MACRO: {
        ct_macro *m = ct_alloc(&c->arena, sizeof *m);
        m->name = x->name;
        m->node = (ct_node *)x;
        m->scope = s;
        ct_val v = {0};
        v.t = CT_MACRO;
        v.u.m = m;
        scope_set(c, s, x->name, x->name_len, v);
        return X_NORMAL;
    }
    case N_BREAK: return X_BREAK;
    case N_CONTINUE: return X_CONTINUE;
    case N_BLOCK: return exec_body(c, scope_new(c, s), x->list, x->n);
    case N_FILTER_BLOCK: {
        ct_val v = apply_filters(c, s, x->a, render_to_string(c, s, x->list, x->n));
        ct_str_of(c, c->out, v);
        return X_NORMAL;
    }
    case N_WITH: {
        ct_scope *ws = scope_new(c, s);
        ct_val *vals = ct_alloc(&c->arena, (size_t)(x->n2 ? x->n2 : 1) * sizeof *vals);
        for (int i = 0; i < x->n2; i++) vals[i] = eval(c, s, x->list2[i]);
        for (int i = 0; i < x->nnames; i++) scope_set(c, ws, x->names[i], strlen(x->names[i]), vals[i]);
        return exec_body(c, ws, x->list, x->n);
    }
    default: ct_fail(c, KILN_ERR_INTERNAL, "internal error: node kind %d as a statement", x->kind);
    }
}

static int exec_body(ct_ctx *c, ct_scope *s, ct_node *const *body, int n) {
    if (++c->depth > 400) ct_fail(c, KILN_ERR_UNSUPPORTED, "statements nested too deeply");
    for (int i = 0; i < n; i++) {
        int r = exec_stmt(c, s, body[i]);
        if (r != X_NORMAL) {
            c->depth--;
            return r;
        }
    }
    c->depth--;
    return X_NORMAL;
}

/* ---- API --------------------------------------------------------------------------------------------- */
kiln_status kiln_chat_template_render(const kiln_chat_template *t, const json_t *messages, const json_t *tools,
                                      int add_generation_prompt, const json_t *extra, char **out, size_t *len) {
    *out = NULL;
    if (len) *len = 0;
    if (!t) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_chat_template_render: NULL template");
    if (extra && !json_is_object(extra))
        return kiln_fail(KILN_ERR_INVALID_ARG, "%s: extra variables must be a JSON object", t->name);
    ct_ctx *c = calloc(1, sizeof *c);
    if (!c) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    c->name = t->name;
    c->arena.oom = &c->jb;
    c->arena.oom_msg = c->err;
    c->arena.limit = (size_t)256 << 20; /* 256 MiB: a template cannot exhaust the machine */
    if (setjmp(c->jb)) {
        kiln_status st = c->err_status ? c->err_status : KILN_ERR_NOMEM;
        kiln_status r = kiln_fail(st, "%s", c->err);
        ct_arena_free(&c->arena);
        free(c);
        return r;
    }
    /* the variables transformers passes: messages, tools, documents, add_generation_prompt, then
     * the special tokens and caller kwargs (extra) */
    ct_scope *g = scope_new(c, NULL);
    g->parent = NULL;
    scope_set(c, g, "messages", 8, messages ? ct_from_json(c, messages) : ct_undef("messages", 8));
    scope_set(c, g, "tools", 5, tools && !json_is_null(tools) ? ct_from_json(c, tools) : ct_none());
    scope_set(c, g, "documents", 9, ct_none());
    scope_set(c, g, "add_generation_prompt", 21, ct_bool(add_generation_prompt));
    if (extra) {
        const char *key;
        json_t *val;
        json_object_foreach((json_t *)extra, key, val) {
            size_t kl = strlen(key);
            scope_set(c, g, ct_strndup(&c->arena, key, kl), kl, ct_from_json(c, val));
        }
    }
    c->globals = g;
    ct_buf o = {&c->arena, NULL, 0, 0};
    c->out = &o;
    int r = exec_body(c, scope_new(c, g), t->body, t->n);
    if (r != X_NORMAL) {
        c->line = 0;
        ct_fail(c, KILN_ERR_INVALID_ARG, "'%s' outside a loop", r == X_BREAK ? "break" : "continue");
    }
    char *res = malloc(o.n + 1);
    if (!res) {
        ct_arena_free(&c->arena);
        free(c);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    if (o.n) memcpy(res, o.p, o.n);
    res[o.n] = 0;
    *out = res;
    if (len) *len = o.n;
    ct_arena_free(&c->arena);
    free(c);
    return KILN_OK;
}

kiln_status kiln_chat_template_apply(const char *source, const json_t *messages, const json_t *tools,
                                     int add_generation_prompt, const json_t *extra, char **out, size_t *len) {
    kiln_chat_template *t;
    *out = NULL;
    KILN_TRY(kiln_chat_template_parse(source, source ? strlen(source) : 0, NULL, &t));
    kiln_status st = kiln_chat_template_render(t, messages, tools, add_generation_prompt, extra, out, len);
    kiln_chat_template_free(t);
    return st;
}
