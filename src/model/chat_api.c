/* chat_api.c — the public tokenizer and chat-template calls of kiln.h (issue 9): standalone
 * tokenizers (kiln_tokenizer_*), and rendering a model's chat template as Hugging Face
 * transformers' apply_chat_template does (template choice, the special-token variables). */
#include "model/model.h"
#include "base/status.h"
#include "format/gguf.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* ---- tokenizers ------------------------------------------------------------------------------- */
static int is_dir(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}
static int is_file(const char *p) {
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}
static int ends_with(const char *s, const char *suf) {
    size_t n = strlen(s), k = strlen(suf);
    return n >= k && strcmp(s + n - k, suf) == 0;
}

/* The tokenizer of a model kiln_model_load reads (taken from the model, which is then freed). */
static kiln_status tokenizer_of_model(const char *path, kiln_tokenizer **out) {
    kiln_options o;
    kiln_options_default(&o);
    o.quiet = 1;
    kiln_model *m;
    KILN_TRY(kiln_model_load(path, &o, &m));
    if (!m->tok) {
        kiln_model_free(m);
        return kiln_fail(KILN_ERR_FORMAT, "%s: the model has no tokenizer files", path);
    }
    *out = m->tok;
    m->tok = NULL;
    kiln_model_free(m);
    return KILN_OK;
}

kiln_status kiln_tokenizer_load(const char *path, kiln_tokenizer **out) {
    *out = NULL;
    if (!path) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_tokenizer_load: NULL path");
    /* a llama2.c checkpoint .bin is a model (its tokenizer*.bin lies beside it); a tokenizer .bin
     * is tried when it does not load as one */
    if (ends_with(path, ".bin") && !strstr(path, "tok")) {
        if (tokenizer_of_model(path, out) == KILN_OK) return KILN_OK;
        return kiln_tok_load_path(path, out);
    }
    kiln_status st = kiln_tok_load_path(path, out);
    if (st == KILN_OK) return st;
    char first[1024];
    snprintf(first, sizeof first, "%s", kiln_last_error());
    if (is_dir(path) || ends_with(path, ".gguf") || ends_with(path, ".bin")) {
        if (tokenizer_of_model(path, out) == KILN_OK) return KILN_OK;
    }
    return kiln_fail(st, "%s", first);
}

void kiln_tokenizer_free(kiln_tokenizer *t) { kiln_tok_free(t); }
int kiln_tokenizer_vocab_size(const kiln_tokenizer *t) { return kiln_tok_vocab_size(t); }
int kiln_tokenizer_bos(const kiln_tokenizer *t) { return kiln_tok_bos(t); }
int kiln_tokenizer_eos(const kiln_tokenizer *t) { return kiln_tok_eos(t); }
kiln_status kiln_tokenizer_encode(const kiln_tokenizer *t, const char *text, size_t len, int add_bos, int parse_special,
                                  int32_t **ids, size_t *n) {
    return kiln_tok_encode_ex(t, text, len, add_bos, parse_special, ids, n);
}
const char *kiln_tokenizer_piece(const kiln_tokenizer *t, int32_t prev, int32_t id, size_t *len) {
    return kiln_tok_piece(t, prev, id, len);
}
const char *kiln_tokenizer_token(const kiln_tokenizer *t, int32_t id) { return kiln_tok_raw_piece(t, id); }
int kiln_tokenizer_is_special(const kiln_tokenizer *t, int32_t id) { return kiln_tok_is_special(t, id); }
const kiln_tokenizer *kiln_model_tokenizer(const kiln_model *m) { return m ? m->tok : NULL; }

/* ---- chat templates ----------------------------------------------------------------------------- */
typedef struct chat_src {
    char *source;     /* the template text (malloc'ed) */
    char name[1100];  /* for messages: the file it came from */
    json_t *vars;     /* special-token variables */
} chat_src;

static char *read_file(const char *path, kiln_status *st) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        *st = kiln_fail(KILN_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
        n += got;
        if (n + 1 == cap) {
            char *nb = cap < ((size_t)64 << 20) ? realloc(buf, cap * 2) : NULL;
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (!buf) {
        *st = kiln_fail(KILN_ERR_NOMEM, "%s: out of memory (or larger than 64 MiB)", path);
        return NULL;
    }
    buf[n] = 0;
    return buf;
}

/* A special token in tokenizer_config.json: a string or {"content": ...}. */
static const char *config_token(json_t *v) {
    if (json_is_string(v)) return json_string_value(v);
    if (json_is_object(v)) return json_string_value(json_object_get(v, "content"));
    return NULL;
}

/* bos_token ... as transformers' special_tokens_map: set ones only */
static void vars_from_config(json_t *cfg, json_t *vars) {
    static const char *const keys[] = {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token",
                                       "mask_token", NULL};
    for (int i = 0; keys[i]; i++) {
        const char *s = config_token(json_object_get(cfg, keys[i]));
        if (s) json_object_set_new(vars, keys[i], json_string(s));
    }
    json_t *extra = json_object_get(cfg, "additional_special_tokens");
    if (json_is_array(extra) && json_array_size(extra)) {
        json_t *list = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(extra, i, v) {
            const char *s = config_token(v);
            if (s) json_array_append_new(list, json_string(s));
        }
        json_object_set_new(vars, "additional_special_tokens", list);
    }
}

/* tokenizer_config.json chat_template: a string, or [{"name", "template"}] of which transformers
 * takes "tool_use" when tools are given (and it exists), else "default". */
static kiln_status template_from_config(json_t *cfg, const char *cpath, int have_tools, chat_src *cs) {
    json_t *ct = json_object_get(cfg, "chat_template");
    const char *src = NULL;
    if (json_is_string(ct)) {
        src = json_string_value(ct);
    } else if (json_is_array(ct)) {
        const char *dflt = NULL, *tool = NULL;
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            const char *nm = json_string_value(json_object_get(e, "name"));
            const char *t = json_string_value(json_object_get(e, "template"));
            if (!nm || !t) return kiln_fail(KILN_ERR_FORMAT, "%s: chat_template[%zu]: needs a name and a template", cpath, i);
            if (!strcmp(nm, "default")) dflt = t;
            if (!strcmp(nm, "tool_use")) tool = t;
        }
        src = have_tools && tool ? tool : dflt;
        if (!src) return kiln_fail(KILN_ERR_FORMAT, "%s: chat_template: no \"default\" template in the list", cpath);
    } else if (ct && !json_is_null(ct)) {
        return kiln_fail(KILN_ERR_FORMAT, "%s: chat_template: expected a string or a list of named templates", cpath);
    }
    if (!src) return KILN_OK;
    cs->source = strdup(src);
    if (!cs->source) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    snprintf(cs->name, sizeof cs->name, "%s", cpath);
    return KILN_OK;
}

static json_t *load_json(const char *path, kiln_status *st) {
    json_error_t e;
    json_t *j = json_load_file(path, 0, &e);
    if (!j) *st = kiln_fail(KILN_ERR_FORMAT, "%s: invalid JSON at line %d column %d: %s", path, e.line, e.column, e.text);
    else if (!json_is_object(j)) {
        json_decref(j);
        j = NULL;
        *st = kiln_fail(KILN_ERR_FORMAT, "%s: expected a JSON object", path);
    }
    return j;
}

/* Finds the template and special tokens for path (see kiln_chat_render_path). */
static kiln_status find_template(const char *path, int have_tools, chat_src *cs) {
    kiln_status st = KILN_OK;
    char dir[1024], p[1100];
    if (is_dir(path)) {
        snprintf(dir, sizeof dir, "%s", path);
    } else if (ends_with(path, ".gguf")) {
        struct kiln_gguf *g;
        KILN_TRY(kiln_gguf_open(path, NULL, &g));
        const char *s;
        size_t n;
        if (!kiln_gguf_get_str(g, "tokenizer.chat_template", &s, &n)) {
            cs->source = strndup(s, n);
            snprintf(cs->name, sizeof cs->name, "%s:tokenizer.chat_template", path);
        }
        static const char *const ids[][2] = {{"tokenizer.ggml.bos_token_id", "bos_token"},
                                             {"tokenizer.ggml.eos_token_id", "eos_token"},
                                             {"tokenizer.ggml.unknown_token_id", "unk_token"},
                                             {"tokenizer.ggml.padding_token_id", "pad_token"}};
        for (int i = 0; i < 4; i++) {
            uint64_t id;
            if (!kiln_gguf_get_u64(g, ids[i][0], &id) && !kiln_gguf_arr_str(g, "tokenizer.ggml.tokens", id, &s, &n))
                json_object_set_new(cs->vars, ids[i][1], json_stringn(s, n));
        }
        kiln_gguf_close(g);
        if (!cs->source) return kiln_fail(KILN_ERR_FORMAT, "%s: no tokenizer.chat_template in the GGUF metadata", path);
        return KILN_OK;
    } else if (ends_with(path, ".json")) {
        json_t *cfg = load_json(path, &st);
        if (!cfg) return st;
        vars_from_config(cfg, cs->vars);
        st = template_from_config(cfg, path, have_tools, cs);
        json_decref(cfg);
        if (st == KILN_OK && !cs->source) st = kiln_fail(KILN_ERR_FORMAT, "%s: no chat_template", path);
        return st;
    } else if (is_file(path) && !ends_with(path, ".bin") && !ends_with(path, ".safetensors")) {
        /* a template file */
        cs->source = read_file(path, &st);
        snprintf(cs->name, sizeof cs->name, "%s", path);
        return cs->source ? KILN_OK : st;
    } else {
        const char *slash = strrchr(path, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - path) : 1, slash ? path : ".");
    }
    /* a model / tokenizer directory */
    snprintf(p, sizeof p, "%s/tokenizer_config.json", dir);
    json_t *cfg = NULL;
    if (is_file(p)) {
        cfg = load_json(p, &st);
        if (!cfg) return st;
        vars_from_config(cfg, cs->vars);
    }
    char jp[1100];
    snprintf(jp, sizeof jp, "%s/chat_template.jinja", dir);
    if (is_file(jp)) {
        cs->source = read_file(jp, &st);
        snprintf(cs->name, sizeof cs->name, "%s", jp);
    } else if (cfg) {
        st = template_from_config(cfg, p, have_tools, cs);
    }
    json_decref(cfg);
    if (st == KILN_OK && !cs->source)
        st = kiln_fail(KILN_ERR_FORMAT, "%s: no chat template (no chat_template.jinja, no chat_template in "
                       "tokenizer_config.json)", dir);
    return st;
}

static json_t *parse_arg(const char *what, const char *text, kiln_status *st) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j) *st = kiln_fail(KILN_ERR_INVALID_ARG, "%s: invalid JSON at line %d column %d: %s", what, e.line, e.column, e.text);
    return j;
}

static kiln_status render(chat_src *cs, const char *template_path, const char *messages_json, const char *tools_json,
                          int add_generation_prompt, const char *extra_json, char **out) {
    kiln_status st = KILN_OK;
    if (template_path) {
        free(cs->source);
        cs->source = read_file(template_path, &st);
        if (!cs->source) return st;
        snprintf(cs->name, sizeof cs->name, "%s", template_path);
    }
    json_t *msgs = NULL, *tools = NULL, *extra = NULL;
    if (!messages_json) return kiln_fail(KILN_ERR_INVALID_ARG, "messages: missing");
    if (!(msgs = parse_arg("messages", messages_json, &st))) goto done;
    if (!json_is_array(msgs)) { st = kiln_fail(KILN_ERR_INVALID_ARG, "messages: expected a JSON array of messages"); goto done; }
    if (tools_json && !(tools = parse_arg("tools", tools_json, &st))) goto done;
    if (tools && !json_is_array(tools) && !json_is_null(tools)) {
        st = kiln_fail(KILN_ERR_INVALID_ARG, "tools: expected a JSON array of tool definitions");
        goto done;
    }
    if (extra_json) {
        if (!(extra = parse_arg("extra", extra_json, &st))) goto done;
        if (!json_is_object(extra)) { st = kiln_fail(KILN_ERR_INVALID_ARG, "extra: expected a JSON object"); goto done; }
        json_object_update(cs->vars, extra); /* caller variables win over the special tokens */
    }
    {
        kiln_chat_template *t;
        st = kiln_chat_template_parse(cs->source, strlen(cs->source), cs->name, &t);
        if (st == KILN_OK) {
            st = kiln_chat_template_render(t, msgs, tools, add_generation_prompt, cs->vars, out, NULL);
            kiln_chat_template_free(t);
        }
    }
done:
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
    return st;
}

kiln_status kiln_chat_render_path(const char *path, const char *template_path, const char *messages_json,
                                  const char *tools_json, int add_generation_prompt, const char *extra_json,
                                  char **out) {
    *out = NULL;
    chat_src cs;
    memset(&cs, 0, sizeof cs);
    cs.vars = json_object();
    if (!cs.vars) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status st = KILN_OK;
    int have_tools = tools_json && strcmp(tools_json, "null") != 0; /* transformers: tools is not None */
    if (path) st = find_template(path, have_tools, &cs);
    else if (!template_path) st = kiln_fail(KILN_ERR_INVALID_ARG, "chat template: no model path and no template file");
    if (st == KILN_OK && !cs.source && !template_path) st = kiln_fail(KILN_ERR_FORMAT, "%s: no chat template", path);
    if (st == KILN_OK) st = render(&cs, template_path, messages_json, tools_json, add_generation_prompt, extra_json, out);
    free(cs.source);
    json_decref(cs.vars);
    return st;
}

kiln_status kiln_chat_render(const kiln_model *m, const char *messages_json, const char *tools_json,
                             int add_generation_prompt, const char *extra_json, char **out) {
    *out = NULL;
    if (!m) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_chat_render: NULL model");
    return kiln_chat_render_path(m->path, NULL, messages_json, tools_json, add_generation_prompt, extra_json, out);
}

kiln_status kiln_chat_template_source(const kiln_model *m, int have_tools, char **out) {
    *out = NULL;
    if (!m) return kiln_fail(KILN_ERR_INVALID_ARG, "kiln_chat_template_source: NULL model");
    chat_src cs;
    memset(&cs, 0, sizeof cs);
    cs.vars = json_object();
    if (!cs.vars) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    kiln_status st = find_template(m->path, have_tools, &cs);
    if (st == KILN_OK && !cs.source) st = kiln_fail(KILN_ERR_FORMAT, "%s: no chat template", m->path);
    if (st == KILN_OK) *out = cs.source;
    else free(cs.source);
    json_decref(cs.vars);
    return st;
}

/* The end-of-turn markers of the families kiln serves, as llama.cpp's end-of-generation list and
 * the templates spell them: a token ending the assistant's turn, or opening another role's turn
 * (GLM's <|user|> / <|observation|>, Kimi's <|im_user|> / <|im_system|>), means the answer is over.
 * Only markers that are special tokens of the vocabulary AND appear in the model's chat template
 * count, so a model's own vocabulary decides (a plain-text "</s>" in a prompt never stops anything). */
static const char *const turn_markers[] = {
    "<|user|>", "<|observation|>", "<|system|>", "<|endoftext|>",               /* GLM-4.x / 5.x */
    "<|im_end|>", "<|im_user|>", "<|im_system|>",                               /* Kimi K2, ChatML */
    "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>",       /* DeepSeek-V3 <｜end▁of▁sentence｜> */
    "<\xef\xbd\x9c" "User\xef\xbd\x9c>",                                        /* DeepSeek-V3 <｜User｜> */
    "<|eot_id|>", "<|eom_id|>", "<end_of_turn>", "<|end|>", "<|return|>",      /* Llama 3, Gemma, Phi, gpt-oss */
};

int kiln_model_add_turn_ends(kiln_model *m, char *note, size_t cap) {
    if (cap) note[0] = 0;
    if (!m || !m->tok) return 0;
    char *src = NULL;
    if (kiln_chat_template_source(m, 0, &src) != KILN_OK || !src) {
        kiln_clear_error();
        return 0;
    }
    int added = 0;
    size_t used = 0;
    for (size_t i = 0; i < sizeof turn_markers / sizeof *turn_markers; i++) {
        const char *mk = turn_markers[i];
        if (!strstr(src, mk)) continue;
        int32_t *ids = NULL;
        size_t n = 0;
        if (kiln_tok_encode(m->tok, mk, strlen(mk), 0, &ids, &n) != KILN_OK) {
            kiln_clear_error();
            continue;
        }
        const int32_t id = n == 1 ? ids[0] : -1;
        free(ids);
        if (id < 0 || id >= m->hp.vocab || !kiln_tok_is_special(m->tok, id)) continue;
        int have = 0;
        for (int k = 0; k < m->hp.n_eos; k++) have |= m->hp.eos_ids[k] == id;
        if (have || m->hp.n_eos >= KILN_MAX_EOS) continue;
        m->hp.eos_ids[m->hp.n_eos++] = id;
        added++;
        if (cap && used < cap) used += (size_t)snprintf(note + used, cap - used, "%s%s (%d)", added > 1 ? ", " : "", mk, id);
    }
    free(src);
    return added;
}
