/* json_grammar.c — JSON documents of a response_format, recognised byte by byte (json_grammar.h).
 *
 * A schema compiles to a tree of nodes; the parser state is a stack of frames, one per open value
 * (an object in the middle of its properties, an array, a string, a number, a literal being
 * matched). Feeding a byte asks the top frame; a frame that cannot take the byte but may end there
 * (a number, a literal that is complete) is closed and the byte offered to its parent. Object
 * properties of a schema are literal runs ("\"name\":") matched like enum values. */
#include "engine/json_grammar.h"
#include "base/status.h"
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N_ANY, N_OBJ, N_ARR, N_STR, N_INT, N_NUM, N_LIT, N_UNION };
typedef struct kiln_jg_node {
    int type;
    /* N_OBJ: properties in order (n_props 0 and generic = 1: any object) */
    int n_props, generic;
    struct kiln_jg_node **keys, **props; /* keys: N_LIT nodes of "\"name\":" (",\"name\":" after the first) */
    /* N_ARR */
    struct kiln_jg_node *items;
    uint32_t min_items, max_items;
    /* N_STR */
    uint32_t min_len, max_len;
    /* N_LIT: the compact JSON texts it may be */
    int n_opts;
    char **opts;
    size_t *opt_len;
    /* N_UNION (tool_choice "required"): {"name":"N_i","arguments":A_i} — `keys` holds one N_LIT of
     * the alternatives' prefixes {"name":"N_i","arguments": (prefix-free: a name ends at its
     * quote), `props` the alternatives' argument schemas A_i, n_props their count */
} kiln_jg_node;

struct kiln_jg {
    kiln_jg_node *root;
    kiln_jg_node **all; /* every node, for freeing */
    int n_all, cap_all;
};

enum { K_VALUE, K_OBJ, K_GOBJ, K_ARR, K_STR, K_NUM, K_LIT, K_UNION };
enum { ACCEPT = 1, PASS = 2 };
#define MAX_DIGITS 15

/* ---- nodes ----------------------------------------------------------------------------------------- */
static kiln_jg_node *node_new(kiln_jg *g, int type) {
    if (g->n_all == g->cap_all) {
        int cap = g->cap_all ? g->cap_all * 2 : 32;
        kiln_jg_node **a = realloc(g->all, (size_t)cap * sizeof *a);
        if (!a) return NULL;
        g->all = a;
        g->cap_all = cap;
    }
    kiln_jg_node *n = calloc(1, sizeof *n);
    if (!n) return NULL;
    n->type = type;
    n->max_items = n->max_len = UINT32_MAX;
    g->all[g->n_all++] = n;
    return n;
}

static int lit_add(kiln_jg_node *n, const char *text, size_t len) {
    if (n->n_opts >= 64) return -1;
    char **o = realloc(n->opts, (size_t)(n->n_opts + 1) * sizeof *o);
    if (!o) return -1;
    n->opts = o;
    size_t *l = realloc(n->opt_len, (size_t)(n->n_opts + 1) * sizeof *l);
    if (!l) return -1;
    n->opt_len = l;
    if (!(n->opts[n->n_opts] = strndup(text, len))) return -1;
    n->opt_len[n->n_opts++] = len;
    return 0;
}

void kiln_jg_free(kiln_jg *g) {
    if (!g) return;
    for (int i = 0; i < g->n_all; i++) {
        kiln_jg_node *n = g->all[i];
        for (int k = 0; k < n->n_opts; k++) free(n->opts[k]);
        free(n->opts);
        free(n->opt_len);
        free(n->keys);
        free(n->props);
        free(n);
    }
    free(g->all);
    free(g);
}

/* ---- compiling a schema ------------------------------------------------------------------------------ */
static int get_u32(json_t *s, const char *k, uint32_t *out, const char *path) {
    json_t *v = json_object_get(s, k);
    if (!v) return 1;
    if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > 1000000) {
        kiln_fail(KILN_ERR_INVALID_ARG, "%s.%s must be an integer in [0, 1000000]", path, k);
        return 0;
    }
    *out = (uint32_t)json_integer_value(v);
    return 1;
}

static kiln_jg_node *compile(kiln_jg *g, json_t *s, const char *path, int depth) {
    if (depth > KILN_JG_DEPTH - 2) { kiln_fail(KILN_ERR_INVALID_ARG, "%s: the schema nests deeper than %d levels", path, KILN_JG_DEPTH - 2); return NULL; }
    if (json_is_true(s)) return node_new(g, N_ANY);
    if (!json_is_object(s)) { kiln_fail(KILN_ERR_INVALID_ARG, "%s: a schema must be an object", path); return NULL; }
    static const char *const known[] = {"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "minLength",
                                        "maxLength", "enum", "const", "description", "title", "default", "$schema", "examples", "strict", NULL};
    const char *key;
    json_t *v;
    json_object_foreach(s, key, v) {
        int ok = 0;
        for (int i = 0; known[i]; i++) ok |= strcmp(key, known[i]) == 0;
        if (!ok) { kiln_fail(KILN_ERR_UNSUPPORTED, "%s: the keyword '%.60s' is not supported by kiln's structured output", path, key); return NULL; }
    }
    json_t *en = json_object_get(s, "enum"), *cn = json_object_get(s, "const");
    if (en || cn) {
        if (en && (!json_is_array(en) || json_array_size(en) == 0)) { kiln_fail(KILN_ERR_INVALID_ARG, "%s.enum must be a non-empty array", path); return NULL; }
        kiln_jg_node *n = node_new(g, N_LIT);
        if (!n) return NULL;
        size_t cnt = en ? json_array_size(en) : 1;
        for (size_t i = 0; i < cnt; i++) {
            char *t = json_dumps(en ? json_array_get(en, i) : cn, JSON_COMPACT | JSON_ENCODE_ANY);
            int bad = !t || lit_add(n, t, strlen(t)) != 0;
            free(t);
            if (bad) { kiln_fail(KILN_ERR_INVALID_ARG, "%s.enum: at most 64 values", path); return NULL; }
        }
        return n;
    }
    json_t *ty = json_object_get(s, "type");
    const char *t = json_string_value(ty);
    if (ty && !t) { kiln_fail(KILN_ERR_UNSUPPORTED, "%s.type: only a single type name is supported", path); return NULL; }
    if (!t) t = json_object_get(s, "properties") ? "object" : json_object_get(s, "items") ? "array" : NULL;
    if (!t) return node_new(g, N_ANY);
    char sub[512];
    if (strcmp(t, "object") == 0) {
        kiln_jg_node *n = node_new(g, N_OBJ);
        if (!n) return NULL;
        json_t *props = json_object_get(s, "properties");
        if (props && !json_is_object(props)) { kiln_fail(KILN_ERR_INVALID_ARG, "%s.properties must be an object", path); return NULL; }
        n->generic = !props;
        size_t np = props ? json_object_size(props) : 0;
        n->keys = calloc(np + 1, sizeof *n->keys);
        n->props = calloc(np + 1, sizeof *n->props);
        if (!n->keys || !n->props) return NULL;
        json_object_foreach(props, key, v) {
            kiln_jg_node *k = node_new(g, N_LIT);
            json_t *ks = json_string(key);
            char *kt = ks ? json_dumps(ks, JSON_ENCODE_ANY) : NULL;
            json_decref(ks);
            char buf[1100];
            int bad = !k || !kt || snprintf(buf, sizeof buf, "%s%s:", n->n_props ? "," : "", kt) >= (int)sizeof buf;
            if (!bad) bad = lit_add(k, buf, strlen(buf)) != 0;
            free(kt);
            if (bad) { kiln_fail(KILN_ERR_INVALID_ARG, "%s.properties: a property name is too long", path); return NULL; }
            snprintf(sub, sizeof sub, "%.400s.properties.%.80s", path, key);
            kiln_jg_node *c = compile(g, v, sub, depth + 1);
            if (!c) return NULL;
            n->keys[n->n_props] = k;
            n->props[n->n_props++] = c;
        }
        return n;
    }
    if (strcmp(t, "array") == 0) {
        kiln_jg_node *n = node_new(g, N_ARR);
        if (!n) return NULL;
        json_t *it = json_object_get(s, "items");
        snprintf(sub, sizeof sub, "%.480s.items", path);
        n->items = it ? compile(g, it, sub, depth + 1) : node_new(g, N_ANY);
        if (!n->items || !get_u32(s, "minItems", &n->min_items, path) || !get_u32(s, "maxItems", &n->max_items, path)) return NULL;
        if (n->min_items > n->max_items) { kiln_fail(KILN_ERR_INVALID_ARG, "%s: minItems > maxItems", path); return NULL; }
        return n;
    }
    if (strcmp(t, "string") == 0) {
        kiln_jg_node *n = node_new(g, N_STR);
        if (!n || !get_u32(s, "minLength", &n->min_len, path) || !get_u32(s, "maxLength", &n->max_len, path)) return NULL;
        if (n->min_len > n->max_len) { kiln_fail(KILN_ERR_INVALID_ARG, "%s: minLength > maxLength", path); return NULL; }
        return n;
    }
    if (strcmp(t, "integer") == 0) return node_new(g, N_INT);
    if (strcmp(t, "number") == 0) return node_new(g, N_NUM);
    if (strcmp(t, "boolean") == 0 || strcmp(t, "null") == 0) {
        kiln_jg_node *n = node_new(g, N_LIT);
        if (!n) return NULL;
        if (t[0] == 'b' ? lit_add(n, "true", 4) || lit_add(n, "false", 5) : lit_add(n, "null", 4)) return NULL;
        return n;
    }
    kiln_fail(KILN_ERR_INVALID_ARG, "%s.type '%.40s' is not one of object, array, string, integer, number, boolean, null", path, t);
    return NULL;
}

/* Nodes the generic (json_object / {}) grammar switches to. */
static kiln_jg_node G_STR = {.type = N_STR, .max_len = UINT32_MAX, .max_items = UINT32_MAX};
static kiln_jg_node G_NUM = {.type = N_NUM};
static char *g_true_opts[] = {"true", "false"}, *g_null_opts[] = {"null"};
static size_t g_true_len[] = {4, 5}, g_null_len[] = {4};
static kiln_jg_node G_BOOL = {.type = N_LIT, .n_opts = 2, .opts = g_true_opts, .opt_len = g_true_len};
static kiln_jg_node G_NULL = {.type = N_LIT, .n_opts = 1, .opts = g_null_opts, .opt_len = g_null_len};
static kiln_jg_node G_ANY = {.type = N_ANY};

kiln_status kiln_jg_compile(const char *schema_json, kiln_jg **out) {
    *out = NULL;
    kiln_jg *g = calloc(1, sizeof *g);
    if (!g) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    if (!schema_json) { /* json_object: any object */
        g->root = node_new(g, N_OBJ);
        if (!g->root) { kiln_jg_free(g); return kiln_fail(KILN_ERR_NOMEM, "out of memory"); }
        g->root->generic = 1;
        *out = g;
        return KILN_OK;
    }
    json_error_t je;
    json_t *s = json_loads(schema_json, JSON_DECODE_ANY, &je);
    if (!s) { kiln_jg_free(g); return kiln_fail(KILN_ERR_INVALID_ARG, "schema: invalid JSON: %s", je.text); }
    g->root = compile(g, s, "schema", 0);
    json_decref(s);
    if (!g->root) { kiln_jg_free(g); return KILN_ERR_INVALID_ARG; }
    *out = g;
    return KILN_OK;
}

kiln_status kiln_jg_compile_tools(const char *tools_json, int single, kiln_jg **out) {
    *out = NULL;
    json_error_t je;
    json_t *tools = json_loads(tools_json, 0, &je);
    if (!json_is_array(tools) || json_array_size(tools) == 0 || json_array_size(tools) > 64) {
        json_decref(tools);
        return kiln_fail(KILN_ERR_INVALID_ARG, "tools: %s", tools ? "1 to 64 functions are needed for a constrained choice" : je.text);
    }
    kiln_jg *g = calloc(1, sizeof *g);
    kiln_jg_node *arr = g ? node_new(g, N_ARR) : NULL, *un = arr ? node_new(g, N_UNION) : NULL, *lit = un ? node_new(g, N_LIT) : NULL;
    const size_t n = json_array_size(tools);
    if (lit) {
        un->keys = calloc(1, sizeof *un->keys);
        un->props = calloc(n, sizeof *un->props);
    }
    if (!lit || !un->keys || !un->props) {
        json_decref(tools);
        kiln_jg_free(g);
        return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    un->keys[0] = lit;
    un->n_props = (int)n;
    kiln_status st = KILN_OK;
    for (size_t i = 0; i < n && st == KILN_OK; i++) {
        json_t *f = json_object_get(json_array_get(tools, i), "function");
        const char *name = json_string_value(json_object_get(f, "name"));
        json_t *pa = json_object_get(f, "parameters");
        char path[96], *prefix = NULL;
        snprintf(path, sizeof path, "tools[%zu].function.parameters", i);
        json_t *nm = json_string(name ? name : "");
        char *q = json_dumps(nm, JSON_ENCODE_ANY | JSON_COMPACT);
        json_decref(nm);
        if (q && asprintf(&prefix, "{\"name\":%s,\"arguments\":", q) < 0) prefix = NULL;
        free(q);
        if (!prefix || lit_add(lit, prefix, strlen(prefix)) != 0) st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        free(prefix);
        if (st != KILN_OK) break;
        if (pa && json_is_object(pa) && json_object_size(pa) > 0) {
            un->props[i] = compile(g, pa, path, 2);
            if (!un->props[i]) st = KILN_ERR_INVALID_ARG;
        } else if ((un->props[i] = node_new(g, N_OBJ))) {
            un->props[i]->generic = 1; /* no parameters: any object */
        } else st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
    }
    json_decref(tools);
    if (st != KILN_OK) {
        kiln_jg_free(g);
        return st;
    }
    arr->items = un;
    arr->min_items = 1;
    if (single) arr->max_items = 1;
    g->root = arr;
    *out = g;
    return KILN_OK;
}

/* ---- the parser ------------------------------------------------------------------------------------------ */
static kiln_jg_frame *push(kiln_jg_state *st, int kind, const kiln_jg_node *n) {
    if (st->depth >= KILN_JG_DEPTH) return NULL;
    kiln_jg_frame *f = &st->f[st->depth++];
    memset(f, 0, sizeof *f);
    f->kind = (uint8_t)kind;
    f->node = n;
    if (kind == K_LIT) f->alive = n->n_opts >= 64 ? ~0ull : (1ull << n->n_opts) - 1;
    return f;
}

void kiln_jg_start(const kiln_jg *g, kiln_jg_state *st) {
    memset(st, 0, sizeof *st);
    push(st, K_VALUE, g->root);
}

/* The frame on top finished: pop it and advance its parent. 0 when the parent cannot go on. */
static int finish(kiln_jg_state *st) {
    st->depth--;
    if (st->depth == 0) { st->done = 1; return 1; }
    kiln_jg_frame *p = &st->f[st->depth - 1];
    switch (p->kind) {
    case K_OBJ:
        if (p->phase == 0) { p->phase = 1; return push(st, K_VALUE, p->node->props[p->count]) != NULL; } /* key done → its value */
        p->count++;
        p->phase = p->count < (uint32_t)p->node->n_props ? 0 : 2;
        return 1;
    case K_GOBJ:
        if (p->phase == 1) { p->phase = 2; return 1; }   /* key done → ':' */
        p->phase = 5;                                     /* value done → ',' or '}' */
        return 1;
    case K_ARR:
        p->count++;
        p->phase = 2;
        return 1;
    case K_UNION:
        if (p->phase == 0) { /* the prefix literal matched exactly one alternative (prefix-free) */
            const uint64_t alive = st->f[st->depth].alive; /* the popped literal frame */
            int k = 0;
            while (k < 63 && !(alive >> k & 1)) k++;
            p->count = (uint32_t)k;
            p->phase = 1;
            return push(st, K_VALUE, p->node->props[k]) != NULL;
        }
        p->phase = 2; /* its arguments done → '}' */
        return 1;
    default: return 0;
    }
}

static int num_can_end(const kiln_jg_frame *f) { return f->phase == 2 || f->phase == 3 || f->phase == 5 || f->phase == 8; }

/* One byte to the top frame: ACCEPT, PASS (the frame is complete; the byte is its parent's) or 0. */
static int step(kiln_jg_state *st, unsigned char c) {
    kiln_jg_frame *f = &st->f[st->depth - 1];
    const kiln_jg_node *n = f->node;
    switch (f->kind) {
    case K_VALUE: {
        const kiln_jg_node *t = n;
        if (t->type == N_ANY) t = c == '{' ? NULL : c == '[' ? NULL : c == '"' ? &G_STR : (c == '-' || (c >= '0' && c <= '9')) ? &G_NUM : c == 't' || c == 'f' ? &G_BOOL : c == 'n' ? &G_NULL : NULL;
        if (n->type == N_ANY && (c == '{' || c == '[')) {
            f->kind = c == '{' ? K_GOBJ : K_ARR;
            f->node = c == '{' ? n : &G_ANY;
            f->phase = 0;
            return ACCEPT;
        }
        if (!t) return 0;
        switch (t->type) {
        case N_OBJ:
            if (c != '{') return 0;
            f->kind = t->generic ? K_GOBJ : K_OBJ;
            f->phase = t->generic ? 0 : t->n_props ? 0 : 2;
            return ACCEPT;
        case N_ARR:
            if (c != '[') return 0;
            f->kind = K_ARR;
            f->phase = 0;
            return ACCEPT;
        case N_STR:
            if (c != '"') return 0;
            f->kind = K_STR;
            f->node = t;
            return ACCEPT;
        case N_INT: case N_NUM:
            f->kind = K_NUM;
            f->node = t;
            f->phase = 0;
            return step(st, c);
        case N_LIT:
            f->kind = K_LIT;
            f->node = t;
            f->pos = 0;
            f->alive = t->n_opts >= 64 ? ~0ull : (1ull << t->n_opts) - 1;
            return step(st, c);
        case N_UNION:
            f->kind = K_UNION;
            f->node = t;
            f->phase = 0;
            if (!push(st, K_LIT, t->keys[0])) return 0;
            return step(st, c);
        }
        return 0;
    }
    case K_UNION:
        if (f->phase == 2 && c == '}') return finish(st) ? ACCEPT : 0;
        return 0;
    case K_OBJ:
        if (f->phase == 0) { /* the next key literal (its leading ',' included) */
            if (!push(st, K_LIT, n->keys[f->count])) return 0;
            return step(st, c);
        }
        if (f->phase == 2 && c == '}') return finish(st) ? ACCEPT : 0;
        return 0;
    case K_GOBJ:
        switch (f->phase) {
        case 0: if (c == '}') return finish(st) ? ACCEPT : 0; /* fall through: a key */
            /* fallthrough */
        case 6:
            if (c != '"') return 0;
            f->phase = 1;
            return push(st, K_STR, &G_STR) ? ACCEPT : 0;
        case 2:
            if (c != ':') return 0;
            f->phase = 4;
            return push(st, K_VALUE, &G_ANY) ? ACCEPT : 0;
        case 5:
            if (c == ',') { f->phase = 6; return ACCEPT; }
            if (c == '}') return finish(st) ? ACCEPT : 0;
            return 0;
        }
        return 0;
    case K_ARR: {
        const kiln_jg_node *items = n->type == N_ARR ? n->items : &G_ANY;
        const uint32_t mn = n->type == N_ARR ? n->min_items : 0, mx = n->type == N_ARR ? n->max_items : UINT32_MAX;
        if (f->phase == 0) {
            if (c == ']') return mn == 0 ? (finish(st) ? ACCEPT : 0) : 0;
            if (mx == 0) return 0;
            f->phase = 1;
            if (!push(st, K_VALUE, items)) return 0;
            return step(st, c);
        }
        if (f->phase == 2) {
            if (c == ']') return f->count >= mn ? (finish(st) ? ACCEPT : 0) : 0;
            if (c == ',' && f->count < mx) { f->phase = 1; return push(st, K_VALUE, items) ? ACCEPT : 0; }
        }
        return 0;
    }
    case K_STR:
        if (f->pos == 1) { /* after a backslash */
            if (c == 'u') { f->pos = 2; return ACCEPT; }
            if (!strchr("\"\\/bfnrt", c) || c == 0) return 0;
            f->pos = 0;
            f->count++;
            return ACCEPT;
        }
        if (f->pos >= 2) { /* \u hex digits */
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'))) return 0;
            if (++f->pos == 6) { f->pos = 0; f->count++; }
            return ACCEPT;
        }
        if (f->phase) { /* inside a multi-byte character: only its continuation bytes (RFC 3629 ranges) */
            unsigned lo = 0x80, hi = 0xBF;
            if (f->alive == 0xE0) lo = 0xA0;
            if (f->alive == 0xED) hi = 0x9F;
            if (f->alive == 0xF0) lo = 0x90;
            if (f->alive == 0xF4) hi = 0x8F;
            if (c < lo || c > hi) return 0;
            f->alive = 0; /* the second-byte rule applies once */
            f->phase--;
            return ACCEPT;
        }
        if (c == '"') return f->count >= n->min_len ? (finish(st) ? ACCEPT : 0) : 0;
        if (c < 0x20) return 0;
        if (c >= 0x80) { /* a lead byte: the character counts here; its continuation bytes follow */
            if (c < 0xC2 || c > 0xF4 || f->count >= n->max_len) return 0;
            f->phase = c < 0xE0 ? 1 : c < 0xF0 ? 2 : 3;
            f->alive = c;
            f->count++;
            return ACCEPT;
        }
        if (f->count >= n->max_len) return 0;
        if (c == '\\') { f->pos = 1; return ACCEPT; }
        f->count++;
        return ACCEPT;
    case K_NUM: {
        const int integer = n->type == N_INT, digit = c >= '0' && c <= '9';
        switch (f->phase) {
        case 0: if (c == '-') { f->phase = 1; return ACCEPT; } /* fallthrough */
        case 1:
            if (c == '0') { f->phase = 2; return ACCEPT; }
            if (digit) { f->phase = 3; f->count = 1; return ACCEPT; }
            return 0;
        case 2: case 3:
            if (f->phase == 3 && digit && f->count < MAX_DIGITS) { f->count++; return ACCEPT; }
            if (!integer && c == '.') { f->phase = 4; f->count = 0; return ACCEPT; }
            if (!integer && (c == 'e' || c == 'E')) { f->phase = 6; f->count = 0; return ACCEPT; }
            return PASS;
        case 4: if (digit) { f->phase = 5; f->count = 1; return ACCEPT; } return 0;
        case 5:
            if (digit && f->count < MAX_DIGITS) { f->count++; return ACCEPT; }
            if (c == 'e' || c == 'E') { f->phase = 6; f->count = 0; return ACCEPT; }
            return PASS;
        case 6: if (c == '+' || c == '-') { f->phase = 7; return ACCEPT; } /* fallthrough */
        case 7: if (digit) { f->phase = 8; f->count = 1; return ACCEPT; } return 0;
        case 8: if (digit && f->count < 3) { f->count++; return ACCEPT; } return PASS;
        }
        return 0;
    }
    case K_LIT: {
        uint64_t keep = 0, complete = 0;
        for (int i = 0; i < n->n_opts && i < 64; i++) {
            if (!(f->alive >> i & 1)) continue;
            if (n->opt_len[i] == f->pos) complete = 1;
            else if ((unsigned char)n->opts[i][f->pos] == c) keep |= 1ull << i;
        }
        if (!keep) return complete ? PASS : 0;
        f->alive = keep;
        f->pos++;
        int all_done = 1;
        for (int i = 0; i < n->n_opts && i < 64; i++)
            if ((keep >> i & 1) && n->opt_len[i] != f->pos) all_done = 0;
        if (all_done) return finish(st) ? ACCEPT : 0;
        return ACCEPT;
    }
    }
    return 0;
}

int kiln_jg_feed(kiln_jg_state *st, const char *bytes, size_t n) {
    for (size_t i = 0; i < n && !st->dead; i++) {
        int r;
        for (;;) {
            if (st->done || st->depth == 0) { r = 0; break; }
            r = step(st, (unsigned char)bytes[i]);
            if (r != PASS) break;
            if (!finish(st)) { r = 0; break; } /* the complete frame is closed; the byte goes to its parent */
        }
        if (r != ACCEPT) st->dead = 1;
    }
    return !st->dead;
}

int kiln_jg_done(const kiln_jg_state *st) {
    if (st->dead) return 0;
    if (st->done) return 1;
    /* a document that is one number or literal, still open: complete if it may end here */
    if (st->depth != 1) return 0;
    const kiln_jg_frame *f = &st->f[0];
    if (f->kind == K_NUM) return num_can_end(f);
    if (f->kind == K_LIT)
        for (int i = 0; i < f->node->n_opts && i < 64; i++)
            if ((f->alive >> i & 1) && f->node->opt_len[i] == f->pos) return 1;
    return 0;
}

int kiln_jg_plain_room(const kiln_jg_state *st) {
    if (st->dead || st->done || st->depth < 1) return -1;
    const kiln_jg_frame *f = &st->f[st->depth - 1];
    if (f->kind != K_STR || f->pos != 0 || f->phase != 0) return -1;
    const uint32_t room = f->node->max_len - f->count;
    return room > INT32_MAX ? INT32_MAX : (int)room;
}
