/* chat_output.c — splitting generated text into reasoning, content and tool calls (chat_output.h
 * says the formats and the rules). One state machine serves streaming and whole responses: the
 * whole response is one push with final = 1, so both give the same split.
 *
 * Phases: START (reasoning on, nothing seen: a leading "<think>" is dropped) → REASONING (until
 * "</think>") → CONTENT (until the tool-call marker) → TOOLS (each complete call parsed as its end
 * marker arrives). Text that may be the beginning of the next marker is held back until decided. */
#include "server/chat_output.h"
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { P_START, P_REASONING, P_CONTENT, P_TOOLS };

static const char THINK_OPEN[] = "<think>", THINK_CLOSE[] = "</think>";
static const char GLM_OPEN[] = "<tool_call>", GLM_CLOSE[] = "</tool_call>";
static const char GLM_KEY[] = "<arg_key>", GLM_KEY_END[] = "</arg_key>", GLM_VAL[] = "<arg_value>", GLM_VAL_END[] = "</arg_value>";
static const char KIMI_SECTION[] = "<|tool_calls_section_begin|>", KIMI_SECTION1[] = "<|tool_call_section_begin|>";
static const char KIMI_OPEN[] = "<|tool_call_begin|>", KIMI_ARGS[] = "<|tool_call_argument_begin|>", KIMI_CLOSE[] = "<|tool_call_end|>";
#define LIT(s) (s), (sizeof(s) - 1)

int kiln_tool_parser_from_name(const char *name, kiln_tool_parser *out) {
    if (strcmp(name, "none") == 0) *out = KILN_TOOLS_NONE;
    else if (strcmp(name, "glm45") == 0 || strcmp(name, "glm47") == 0 || strcmp(name, "glm4_moe") == 0) *out = KILN_TOOLS_GLM45;
    else if (strcmp(name, "kimi_k2") == 0) *out = KILN_TOOLS_KIMI_K2;
    else return -1;
    return 0;
}
const char *kiln_tool_parser_name(kiln_tool_parser p) {
    switch (p) {
    case KILN_TOOLS_GLM45: return "glm45";
    case KILN_TOOLS_KIMI_K2: return "kimi_k2";
    default: return "none";
    }
}
kiln_tool_parser kiln_tool_parser_for_template(const char *src) {
    if (!src) return KILN_TOOLS_NONE;
    if (strstr(src, "<arg_key>")) return KILN_TOOLS_GLM45;
    if (strstr(src, "<|tool_calls_section_begin|>") || strstr(src, "tool_declare")) return KILN_TOOLS_KIMI_K2;
    return KILN_TOOLS_NONE;
}
kiln_reasoning_parser kiln_reasoning_parser_for_template(const char *src) {
    return src && strstr(src, "<think>") ? KILN_REASONING_THINK : KILN_REASONING_NONE;
}

int kiln_prompt_opens_think(const char *prompt, size_t n) {
    while (n && isspace((unsigned char)prompt[n - 1])) n--;
    return n >= sizeof THINK_OPEN - 1 && memcmp(prompt + n - (sizeof THINK_OPEN - 1), LIT(THINK_OPEN)) == 0;
}

void kiln_chat_out_init(kiln_chat_out *o, kiln_tool_parser tools, kiln_reasoning_parser reasoning, int prompt_opened_think,
                        const json_t *tool_defs, const char *only_name, int single) {
    memset(o, 0, sizeof *o);
    o->tools = tools;
    o->reasoning = reasoning;
    o->tool_defs = tool_defs;
    o->only_name = only_name;
    o->single = single;
    o->phase = reasoning == KILN_REASONING_NONE ? P_CONTENT : P_START;
    if (reasoning == KILN_REASONING_THINK && prompt_opened_think) o->reasoning = KILN_REASONING_R1; /* reasoning from the start */
    o->calls = json_array();
}

void kiln_chat_out_free(kiln_chat_out *o) {
    kiln_sbuf_free(&o->buf);
    kiln_sbuf_free(&o->tools_text);
    kiln_sbuf_free(&o->content);
    kiln_sbuf_free(&o->thought);
    json_decref(o->calls);
    o->calls = NULL;
}

void kiln_chat_delta_free(kiln_chat_delta *d) {
    kiln_sbuf_free(&d->content);
    kiln_sbuf_free(&d->reasoning);
    json_decref(d->calls);
    d->calls = NULL;
}

int kiln_chat_marker(const char *piece, size_t n) {
    static const char *const m[] = {THINK_OPEN, THINK_CLOSE, GLM_OPEN, GLM_CLOSE, GLM_KEY, GLM_KEY_END, GLM_VAL, GLM_VAL_END, KIMI_SECTION, KIMI_SECTION1,
                                    "<|tool_calls_section_end|>", "<|tool_call_section_end|>", KIMI_OPEN, KIMI_ARGS, KIMI_CLOSE, NULL};
    for (int i = 0; m[i]; i++)
        if (strlen(m[i]) == n && memcmp(m[i], piece, n) == 0) return 1;
    return 0;
}

/* ---- small string helpers ---------------------------------------------------------------------------- */
static const char *find(const char *s, size_t n, const char *pat, size_t m) { return m <= n ? memmem(s, n, pat, m) : NULL; }

/* The length of the longest proper suffix of s[0..n) that is a prefix of pat (held back: it may be
 * the start of pat). */
static size_t partial_suffix(const char *s, size_t n, const char *pat, size_t m) {
    for (size_t k = m - 1 < n ? m - 1 : n; k > 0; k--)
        if (memcmp(s + n - k, pat, k) == 0) return k;
    return 0;
}

static void drop_front(kiln_sbuf *b, size_t k) {
    memmove(b->p, b->p + k, b->len - k);
    b->len -= k;
}

static void trim(const char **s, size_t *n) {
    while (*n && isspace((unsigned char)**s)) { (*s)++; (*n)--; }
    while (*n && isspace((unsigned char)(*s)[*n - 1])) (*n)--;
}

static void emit_text(kiln_sbuf *whole, kiln_sbuf *delta, const char *s, size_t n) {
    if (!n) return;
    kiln_sbuf_put(whole, s, n);
    kiln_sbuf_put(delta, s, n);
}

/* Generated text reaches the splitter valid from the detokenizer; repairing keeps every input answerable. */
json_t *kiln_json_bytes_string(const char *s, size_t n) {
    if (kiln_utf8_valid(s, n)) return json_stringn(s, n);
    kiln_sbuf b = {0};
    kiln_utf8_repair(s, n, &b);
    json_t *j = json_stringn(b.p ? b.p : "", b.len);
    kiln_sbuf_free(&b);
    return j;
}

static json_t *new_call(const char *id, const char *name, size_t name_len, const char *args, size_t args_len) {
    return json_pack("{s:o,s:s,s:{s:o,s:o}}", "id", kiln_json_bytes_string(id, strlen(id)), "type", "function", "function", "name", kiln_json_bytes_string(name, name_len),
                     "arguments", kiln_json_bytes_string(args, args_len));
}

static void add_call(kiln_chat_out *o, kiln_chat_delta *d, json_t *call) {
    if (!call) return;
    const char *name = json_string_value(json_object_get(json_object_get(call, "function"), "name"));
    if ((o->only_name && (!name || strcmp(name, o->only_name) != 0)) || (o->single && json_array_size(o->calls) > 0)) {
        json_decref(call);
        return;
    }
    json_t *delta = json_deep_copy(call);
    json_object_set_new(delta, "index", json_integer((json_int_t)json_array_size(o->calls)));
    json_array_append_new(o->calls, call);
    if (!d->calls) d->calls = json_array();
    json_array_append_new(d->calls, delta);
}

/* "chatcmpl-tool-" + 32 hex digits of the OS CSPRNG (vLLM's id shape). */
static void random_id(char out[48]) {
    memcpy(out, "chatcmpl-tool-", 14);
    kiln_random_hex(out + 14, 16);
}

/* ---- GLM ----------------------------------------------------------------------------------------- */
/* The declared JSON-schema type of parameter key of function name in the request's tools, or NULL. */
static const char *param_type(const json_t *tools, const char *name, size_t name_len, const char *key) {
    size_t i;
    json_t *t;
    json_array_foreach(tools, i, t) {
        json_t *f = json_object_get(t, "function"), *fn = json_object_get(f, "name");
        if (!json_is_string(fn) || json_string_length(fn) != name_len || memcmp(json_string_value(fn), name, name_len) != 0) continue;
        json_t *ty = json_object_get(json_object_get(json_object_get(json_object_get(f, "parameters"), "properties"), key), "type");
        return json_is_string(ty) ? json_string_value(ty) : NULL;
    }
    return NULL;
}

/* A value that is not declared a string: JSON, else the Python literals the model may write
 * (True / False / None, a single- or double-quoted string), else the text as a string. */
static json_t *convert_value(const char *v, size_t n) {
    char *z = strndup(v, n);
    if (!z) return NULL;
    n = strlen(z); /* a NUL in the value ends it */
    json_t *j = json_loads(z, JSON_DECODE_ANY, NULL);
    if (!j) {
        if (strcmp(z, "True") == 0) j = json_true();
        else if (strcmp(z, "False") == 0) j = json_false();
        else if (strcmp(z, "None") == 0) j = json_null();
        else if (n >= 2 && (z[0] == '\'' || z[0] == '"') && z[n - 1] == z[0] && !memchr(z + 1, z[0], n - 2)) j = kiln_json_bytes_string(z + 1, n - 2);
        else j = kiln_json_bytes_string(z, n);
    }
    free(z);
    return j;
}

/* Skips whitespace and literal "\n" sequences (GLM-4.7 sometimes writes them between key and value). */
static const char *skip_sep(const char *p, const char *end) {
    for (;;) {
        if (p < end && isspace((unsigned char)*p)) p++;
        else if (end - p >= 2 && p[0] == '\\' && p[1] == 'n') p += 2;
        else return p;
    }
}

/* The inside of "<tool_call>…</tool_call>" → a call, or NULL when it has no name. */
static json_t *parse_glm(const kiln_chat_out *o, const char *s, size_t n) {
    const char *p = s, *end = s + n;
    while (p < end && isspace((unsigned char)*p)) p++;
    const char *name = p;
    while (p < end && !isspace((unsigned char)*p) && *p != '<') p++;
    const size_t name_len = (size_t)(p - name);
    if (!name_len) return NULL;
    json_t *args = json_object();
    for (;;) {
        const char *k = find(p, (size_t)(end - p), LIT(GLM_KEY));
        if (!k) break;
        k += sizeof GLM_KEY - 1;
        const char *ke = find(k, (size_t)(end - k), LIT(GLM_KEY_END));
        if (!ke) break;
        const char *v = skip_sep(ke + sizeof GLM_KEY_END - 1, end);
        if ((size_t)(end - v) < sizeof GLM_VAL - 1 || memcmp(v, GLM_VAL, sizeof GLM_VAL - 1) != 0) { p = ke; continue; }
        v += sizeof GLM_VAL - 1;
        const char *ve = find(v, (size_t)(end - v), LIT(GLM_VAL_END));
        if (!ve) break;
        size_t kl = (size_t)(ke - k), vl = (size_t)(ve - v);
        trim(&k, &kl);
        trim(&v, &vl);
        char *key = strndup(k, kl);
        if (!key) break;
        const char *ty = param_type(o->tool_defs, name, name_len, key);
        if (kiln_utf8_valid(key, strlen(key))) json_object_set_new(args, key, ty && strcmp(ty, "string") == 0 ? kiln_json_bytes_string(v, vl) : convert_value(v, vl));
        free(key);
        p = ve + sizeof GLM_VAL_END - 1;
    }
    char *a = json_dumps(args, JSON_PRESERVE_ORDER); /* {"k": v, ...}: Python's json.dumps separators */
    json_decref(args);
    char id[48];
    random_id(id);
    json_t *call = a ? new_call(id, name, name_len, a, strlen(a)) : NULL;
    free(a);
    return call;
}

/* ---- Kimi K2 -------------------------------------------------------------------------------------- */
/* The inside of "<|tool_call_begin|>…<|tool_call_end|>" → a call, or NULL when it is not
 * "ID <|tool_call_argument_begin|> ARGS" with ID = "…:digits" free of '<'. */
static json_t *parse_kimi(const char *s, size_t n) {
    const char *a = find(s, n, LIT(KIMI_ARGS));
    if (!a) return NULL;
    const char *id = s, *args = a + sizeof KIMI_ARGS - 1;
    size_t id_len = (size_t)(a - s), args_len = (size_t)(s + n - args);
    trim(&id, &id_len);
    trim(&args, &args_len);
    const char *colon = id_len ? memrchr(id, ':', id_len) : NULL;
    if (!colon || colon + 1 == id + id_len || memchr(id, '<', id_len)) return NULL;
    for (const char *q = colon + 1; q < id + id_len; q++)
        if (!isdigit((unsigned char)*q)) return NULL;
    const char *first_colon = memchr(id, ':', id_len);
    const char *name = id;
    const char *dot = memrchr(id, '.', (size_t)(first_colon - id));
    if (dot) name = dot + 1;
    char *ids = strndup(id, id_len);
    json_t *call = ids ? new_call(ids, name, (size_t)(first_colon - name), args, args_len) : NULL;
    free(ids);
    return call;
}

/* ---- the state machine ------------------------------------------------------------------------------ */
/* Parses the complete calls at the front of o->buf (TOOLS phase); leaves an incomplete one. */
static void take_calls(kiln_chat_out *o, kiln_chat_delta *d) {
    const int glm = o->tools == KILN_TOOLS_GLM45;
    const char *open = glm ? GLM_OPEN : KIMI_OPEN, *close = glm ? GLM_CLOSE : KIMI_CLOSE;
    const size_t lo = strlen(open), lc = strlen(close);
    for (;;) {
        const char *s = find(o->buf.p, o->buf.len, open, lo);
        if (!s) return;
        const char *in = s + lo;
        const char *e = find(in, (size_t)(o->buf.p + o->buf.len - in), close, lc);
        if (!e) return;
        add_call(o, d, glm ? parse_glm(o, in, (size_t)(e - in)) : parse_kimi(in, (size_t)(e - in)));
        drop_front(&o->buf, (size_t)(e + lc - o->buf.p));
    }
}

void kiln_chat_out_push(kiln_chat_out *o, const char *text, size_t n, int final, kiln_chat_delta *d) {
    kiln_chat_delta_free(d);
    memset(d, 0, sizeof *d);
    kiln_sbuf_put(&o->buf, text, n);
    if (o->phase == P_TOOLS) kiln_sbuf_put(&o->tools_text, text, n);
    for (;;) {
        char *b = o->buf.p ? o->buf.p : "";
        const size_t len = o->buf.len;
        if (o->phase == P_START) {
            const int opens = len >= sizeof THINK_OPEN - 1 && memcmp(b, LIT(THINK_OPEN)) == 0;
            if (!opens && !final && memcmp(b, THINK_OPEN, len) == 0) return; /* may still become "<think>" */
            if (opens) drop_front(&o->buf, sizeof THINK_OPEN - 1);
            if (opens || o->reasoning == KILN_REASONING_R1) {
                o->phase = P_REASONING;
                o->saw_reasoning = 1;
            } else {
                o->phase = P_CONTENT; /* THINK: the output did not open a thinking block */
            }
            continue;
        }
        if (o->phase == P_REASONING) {
            const char *e = find(b, len, LIT(THINK_CLOSE));
            if (e) {
                emit_text(&o->thought, &d->reasoning, b, (size_t)(e - b));
                drop_front(&o->buf, (size_t)(e - b) + sizeof THINK_CLOSE - 1);
                o->phase = P_CONTENT;
                continue;
            }
            const size_t keep = final ? 0 : partial_suffix(b, len, LIT(THINK_CLOSE));
            emit_text(&o->thought, &d->reasoning, b, len - keep);
            drop_front(&o->buf, len - keep);
            return;
        }
        if (o->phase == P_CONTENT) {
            if (o->tools == KILN_TOOLS_NONE) {
                emit_text(&o->content, &d->content, b, len);
                o->buf.len = 0;
                return;
            }
            const char *m = NULL; /* the marker stays in buf: the calls are read after it, and without one it is content */
            size_t keep = 0;
            if (o->tools == KILN_TOOLS_GLM45) {
                m = find(b, len, LIT(GLM_OPEN));
                if (!m && !final) keep = partial_suffix(b, len, LIT(GLM_OPEN));
            } else {
                const char *m1 = find(b, len, LIT(KIMI_SECTION)), *m2 = find(b, len, LIT(KIMI_SECTION1));
                m = m1 && (!m2 || m1 < m2) ? m1 : m2;
                if (!m && !final) {
                    keep = partial_suffix(b, len, LIT(KIMI_SECTION));
                    const size_t k1 = partial_suffix(b, len, LIT(KIMI_SECTION1));
                    if (k1 > keep) keep = k1;
                }
            }
            if (m) {
                emit_text(&o->content, &d->content, b, (size_t)(m - b));
                drop_front(&o->buf, (size_t)(m - b));
                kiln_sbuf_put(&o->tools_text, o->buf.p, o->buf.len);
                o->phase = P_TOOLS;
                continue;
            }
            emit_text(&o->content, &d->content, b, len - keep);
            drop_front(&o->buf, len - keep);
            return;
        }
        /* P_TOOLS */
        take_calls(o, d);
        if (final) {
            if (json_array_size(o->calls) == 0) /* no call could be read: the text is content (vLLM) */
                emit_text(&o->content, &d->content, o->tools_text.p ? o->tools_text.p : "", o->tools_text.len);
            o->buf.len = 0;
        }
        return;
    }
}

json_t *kiln_chat_out_content(const kiln_chat_out *o) {
    const char *s = o->content.p ? o->content.p : "";
    size_t n = o->content.len;
    if (json_array_size(o->calls) > 0) {
        const char *t = s;
        size_t k = n;
        trim(&t, &k);
        if (k == 0) return json_null();
    } else if (o->saw_reasoning && n == 0) {
        return json_null();
    }
    return kiln_json_bytes_string(s, n);
}

json_t *kiln_chat_out_reasoning(const kiln_chat_out *o) {
    if (!o->saw_reasoning) return NULL;
    return kiln_json_bytes_string(o->thought.p ? o->thought.p : "", o->thought.len);
}
