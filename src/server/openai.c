/* openai.c — the OpenAI request schema: parsing and validation of /v1/chat/completions and
 * /v1/completions bodies into kiln_oai_params, and the error object. Every rejection names the
 * offending parameter (the `param` field) and gets the status OpenAI uses for it. */
#include "server/server_internal.h"
#include "base/status.h"
#include "engine/json_grammar.h"
#include <ctype.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int kiln_oai_fail(kiln_oai_error *e, int http, const char *type, const char *param, const char *code, const char *fmt, ...) {
    e->http = http;
    e->type = type;
    e->param = param;
    e->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->msg, sizeof e->msg, fmt, ap);
    va_end(ap);
    return 0;
}

json_t *kiln_oai_error_json(const kiln_oai_error *e) {
    json_t *o = json_object();
    json_object_set_new(o, "message", kiln_json_bytes_string(e->msg, strlen(e->msg)));
    json_object_set_new(o, "type", json_string(e->type ? e->type : "invalid_request_error"));
    json_object_set_new(o, "param", e->param ? json_string(e->param) : json_null());
    json_object_set_new(o, "code", e->code ? json_string(e->code) : json_null());
    json_t *r = json_object();
    json_object_set_new(r, "error", o);
    return r;
}

#define BAD(param, ...) kiln_oai_fail(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)
#define BADC(param, code, ...) kiln_oai_fail(err, 400, "invalid_request_error", param, code, __VA_ARGS__)

static const char *jtype(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

/* Optional fields: absent or null → 1 and *present = 0. Wrong type → 0 with err. */
static int opt_bool(json_t *o, const char *k, int *out, int *present, kiln_oai_error *err) {
    json_t *v = json_object_get(o, k);
    *present = 0;
    if (!v || json_is_null(v)) return 1;
    if (!json_is_boolean(v)) return BAD(k, "'%s' must be a boolean, got %s", k, jtype(v));
    *out = json_is_true(v);
    *present = 1;
    return 1;
}
static int opt_int(json_t *o, const char *k, long long lo, long long hi, long long *out, int *present, kiln_oai_error *err) {
    json_t *v = json_object_get(o, k);
    *present = 0;
    if (!v || json_is_null(v)) return 1;
    long long x;
    if (json_is_integer(v)) x = json_integer_value(v);
    else if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 9e15) x = (long long)json_real_value(v);
    else return BAD(k, "'%s' must be an integer, got %s", k, jtype(v));
    if (x < lo || x > hi) return BADC(k, "invalid_value", "'%s' is %lld; it must be in [%lld, %lld]", k, x, lo, hi);
    *out = x;
    *present = 1;
    return 1;
}
static int opt_num(json_t *o, const char *k, double lo, double hi, double *out, int *present, kiln_oai_error *err) {
    json_t *v = json_object_get(o, k);
    *present = 0;
    if (!v || json_is_null(v)) return 1;
    if (!json_is_number(v)) return BAD(k, "'%s' must be a number, got %s", k, jtype(v));
    double x = json_number_value(v);
    if (!(x >= lo && x <= hi)) return BADC(k, "invalid_value", "'%s' is %g; it must be in [%g, %g]", k, x, lo, hi);
    *out = x;
    *present = 1;
    return 1;
}

/* Parameters kiln does not implement: accepted only at their neutral value. */
static int neutral_only(json_t *o, kiln_oai_error *err, int chat) {
    static const char *absent[] = {"functions", "function_call", "suffix", "audio", "prediction", "tools", "tool_choice", NULL};
    json_t *v;
    for (int i = 0; absent[i]; i++) {
        if (chat && (strcmp(absent[i], "tools") == 0 || strcmp(absent[i], "tool_choice") == 0)) continue; /* parse_tools */
        v = json_object_get(o, absent[i]);
        if (v && !json_is_null(v) && !(json_is_array(v) && json_array_size(v) == 0) && !(json_is_string(v) && strcmp(json_string_value(v), "none") == 0))
            return BADC(absent[i], "unsupported_parameter", "'%s' is not supported by this server", absent[i]);
    }

    v = json_object_get(o, "response_format");
    if (!chat && v && !json_is_null(v))
        return BADC("response_format", "unsupported_parameter", "response_format is a chat completions parameter");
    if (!chat) {
        int present;
        long long bo;
        if (!opt_int(o, "best_of", 1, 1, &bo, &present, err)) return 0;
    }
    return 1;
}

/* Tokenizes text (BOS first when the model has one) into dst. templated: text rendered by the
 * model's chat template, which writes BOS and special tokens itself. */
static int tokenize(kiln_server *s, const char *text, size_t len, kiln_oai_prompt *dst, const char *param, int templated, kiln_oai_error *err) {
    if (!s->info.has_tokenizer)
        return BADC(param, "unsupported_parameter", "this model has no tokenizer: send /v1/completions prompts as arrays of token ids");
    if (!kiln_utf8_valid(text, len)) return BAD(param, "'%s' is not valid UTF-8", param);
    size_t cap = len + 16, n = 0;
    if (templated) {
        int32_t *ids = NULL;
        if (kiln_tokenizer_encode(kiln_model_tokenizer(s->m), text, len, 0, 1, &ids, &n) != KILN_OK)
            return BAD(param, "cannot tokenize the rendered chat: %s", kiln_last_error());
        free(dst->ids);
        dst->ids = ids;
        if (n == 0) return BAD(param, "the chat template rendered an empty prompt");
        if (n > (size_t)1 << 30) return BADC(param, "context_length_exceeded", "'%s' is too long", param);
        dst->n = (int)n;
        return 1;
    }
    for (int tries = 0; tries < 2; tries++) {
        free(dst->ids);
        dst->ids = malloc(cap * sizeof *dst->ids);
        if (!dst->ids) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        if (kiln_tokenize(s->m, text, len, 1, dst->ids, cap, &n) != KILN_OK) return BAD(param, "cannot tokenize '%s': %s", param, kiln_last_error());
        if (n <= cap) break;
        cap = n;
    }
    if (n == 0) return BAD(param, "'%s' is empty and the model has no BOS token", param);
    if (n > (size_t)1 << 30) return BADC(param, "context_length_exceeded", "'%s' is too long", param);
    dst->n = (int)n;
    return 1;
}

/* An array of token ids: prompt k of the request (the error names its place when k >= 0). */
static int token_ids(kiln_server *s, json_t *a, int k, kiln_oai_prompt *dst, kiln_oai_error *err) {
    char at[32] = "";
    if (k >= 0) snprintf(at, sizeof at, "[%d]", k);
    size_t n = json_array_size(a);
    if (n == 0) return BAD("prompt", "'prompt'%s is an empty array of token ids", at);
    if (n > (size_t)1 << 24) return BADC("prompt", "context_length_exceeded", "'prompt'%s is too long", at);
    dst->ids = malloc(n * sizeof *dst->ids);
    if (!dst->ids) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    for (size_t i = 0; i < n; i++) {
        json_t *v = json_array_get(a, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->info.vocab_size)
            return BADC("prompt", "invalid_value", "'prompt'%s[%zu] must be a token id in [0, %d)", at, i, s->info.vocab_size);
        dst->ids[i] = (int32_t)json_integer_value(v);
    }
    dst->n = (int)n;
    return 1;
}

/* A string prompt: tokenized, and kept verbatim when echo wants it back. */
static int text_prompt(kiln_server *s, json_t *v, const kiln_oai_params *p, kiln_oai_prompt *dst, kiln_oai_error *err) {
    if (!tokenize(s, json_string_value(v), json_string_length(v), dst, "prompt", 0, err)) return 0;
    if (p->echo) {
        dst->echo_len = json_string_length(v);
        dst->echo_text = malloc(dst->echo_len + 1);
        if (!dst->echo_text) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        memcpy(dst->echo_text, json_string_value(v), dst->echo_len + 1);
    }
    return 1;
}

/* completions' prompt: a string, an array of token ids, or a list of either (several prompts, each
 * with its own n choices: vLLM's and OpenAI's batch form). */
static int parse_prompt(kiln_server *s, json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    json_t *v = json_object_get(o, "prompt");
    if (!v || json_is_null(v)) return BAD("prompt", "'prompt' is required");
    if (!json_is_string(v) && !json_is_array(v)) return BAD("prompt", "'prompt' must be a string or an array, got %s", jtype(v));
    json_t *first = json_is_array(v) ? json_array_get(v, 0) : NULL;
    const int list = first && (json_is_string(first) || json_is_array(first));
    const size_t n = list ? json_array_size(v) : 1;
    if (n > KILN_MAX_PROMPTS) return BADC("prompt", "invalid_value", "'prompt' has %zu prompts; at most %d are allowed in one request", n, KILN_MAX_PROMPTS);
    p->prompts = calloc(n, sizeof *p->prompts);
    if (!p->prompts) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    p->n_prompts = (int)n;
    if (!list) return json_is_string(v) ? text_prompt(s, v, p, &p->prompts[0], err) : token_ids(s, v, -1, &p->prompts[0], err);
    for (size_t k = 0; k < n; k++) {
        json_t *e = json_array_get(v, k);
        if (json_is_string(e)) {
            if (!text_prompt(s, e, p, &p->prompts[k], err)) return 0;
        } else if (json_is_array(e)) {
            if (!token_ids(s, e, (int)k, &p->prompts[k], err)) return 0;
        } else
            return BAD("prompt", "'prompt'[%zu] must be a string or an array of token ids, got %s (a list of prompts takes one kind of entry per item)", k, jtype(e));
    }
    return 1;
}

/* logit_bias: {"token id": bias, ...} (OpenAI): ids in [0, vocab), biases in [-100, 100], at most
 * KILN_MAX_LOGIT_BIAS entries; added to the logits before sampling (src/engine/sampler.c). */
static int parse_logit_bias(kiln_server *s, json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    json_t *v = json_object_get(o, "logit_bias");
    if (!v || json_is_null(v)) return 1;
    if (!json_is_object(v)) return BAD("logit_bias", "'logit_bias' must be an object mapping token ids to numbers, got %s", jtype(v));
    size_t n = json_object_size(v);
    if (n == 0) return 1;
    if (n > KILN_MAX_LOGIT_BIAS)
        return BADC("logit_bias", "invalid_value", "'logit_bias' has %zu entries; at most %d are allowed", n, KILN_MAX_LOGIT_BIAS);
    p->bias_ids = malloc(n * sizeof *p->bias_ids);
    p->bias_vals = malloc(n * sizeof *p->bias_vals);
    if (!p->bias_ids || !p->bias_vals) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    const char *key;
    json_t *x;
    int k = 0;
    json_object_foreach(v, key, x) {
        /* the key: a decimal integer, nothing else (no sign, blanks or fraction) */
        const char *q = key;
        long long id = 0;
        int ok = *q != 0;
        for (; *q && ok; q++) {
            if (*q < '0' || *q > '9' || id > INT32_MAX) ok = 0;
            else id = id * 10 + (*q - '0');
        }
        if (!ok || id >= s->info.vocab_size)
            return BADC("logit_bias", "invalid_value", "'logit_bias' key '%.64s' is not a token id in [0, %d)", key, s->info.vocab_size);
        if (!json_is_number(x))
            return BAD("logit_bias", "'logit_bias'['%s'] must be a number, got %s", key, jtype(x));
        double b = json_number_value(x);
        if (!(b >= -100 && b <= 100))
            return BADC("logit_bias", "invalid_value", "'logit_bias'['%s'] is %g; it must be in [-100, 100]", key, b);
        p->bias_ids[k] = (int32_t)id;
        p->bias_vals[k] = (float)b;
        k++;
    }
    p->sp.n_logit_bias = k;
    p->sp.logit_bias_ids = p->bias_ids;
    p->sp.logit_bias = p->bias_vals;
    return 1;
}

static int parse_stop(json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    json_t *v = json_object_get(o, "stop");
    if (!v || json_is_null(v)) return 1;
    json_t *one[1] = {v};
    size_t n = 1;
    if (json_is_array(v)) n = json_array_size(v);
    else if (!json_is_string(v)) return BAD("stop", "'stop' must be a string or an array of strings, got %s", jtype(v));
    if (n > KILN_MAX_STOPS) return BADC("stop", "invalid_value", "'stop' has %zu entries; at most %d are allowed", n, KILN_MAX_STOPS);
    for (size_t i = 0; i < n; i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : one[0];
        if (!json_is_string(x)) return BAD("stop", "'stop'[%zu] must be a string, got %s", i, jtype(x));
        if (json_string_length(x) == 0) continue;
        if (json_string_length(x) > 1024) return BADC("stop", "invalid_value", "'stop'[%zu] is longer than 1024 bytes", i);
        p->stops[p->n_stops++] = strndup(json_string_value(x), json_string_length(x));
    }
    return 1;
}

/* stop_token_ids (vLLM's extension, as in its OpenAI server): up to KILN_MAX_STOP_IDS token ids, each
 * below the vocabulary, that end a choice like the model's end ids (the id is not part of the text). */
static int parse_stop_ids(kiln_server *s, json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    json_t *v = json_object_get(o, "stop_token_ids");
    if (!v || json_is_null(v)) return 1;
    if (!json_is_array(v)) return BAD("stop_token_ids", "'stop_token_ids' must be an array of token ids, got %s", jtype(v));
    if (json_array_size(v) > KILN_MAX_STOP_IDS)
        return BADC("stop_token_ids", "invalid_value", "'stop_token_ids' has %zu entries; at most %d are allowed", json_array_size(v), KILN_MAX_STOP_IDS);
    for (size_t i = 0; i < json_array_size(v); i++) {
        json_t *x = json_array_get(v, i);
        if (!json_is_integer(x)) return BAD("stop_token_ids", "'stop_token_ids'[%zu] must be an integer, got %s", i, jtype(x));
        const long long id = json_integer_value(x);
        if (id < 0 || id >= s->info.vocab_size)
            return BADC("stop_token_ids", "invalid_value", "'stop_token_ids'[%zu] is %lld; token ids are in [0, %d)", i, id, s->info.vocab_size);
        p->stop_ids[p->n_stop_ids++] = (int32_t)id;
    }
    return 1;
}

/* kiln's per-request speculative decoding (docs/SPECULATIVE.md, "In the server"): "speculative":
 * "off" | "ngram" | "mtp" | {"method": "ngram" | "mtp" | "off", "num_speculative_tokens": 1..16,
 * "prompt_lookup_max": 1..16} (vLLM's names for its speculative config; "deepseek_mtp", vLLM's
 * older name, means "mtp"). Absent: the server's --spec setting. Without a method ({"num_speculative_tokens": 2}):
 * prompt lookup. "mtp" needs a model that ships an MTP layer. */
static int parse_speculative(const kiln_server *s, json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    json_t *v = json_object_get(o, "speculative");
    if (!v || json_is_null(v)) return 1;
    const char *method = NULL;
    json_t *m = json_is_object(v) ? json_object_get(v, "method") : v;
    if (json_is_string(m)) method = json_string_value(m);
    else if (!(json_is_object(v) && !m)) return BAD("speculative", "'speculative' must be \"off\", \"ngram\", \"mtp\" or an object with a \"method\", got %s", jtype(m ? m : v));
    const int mtp = method && (!strcmp(method, "mtp") || !strcmp(method, "deepseek_mtp"));
    if (method && strcmp(method, "off") && strcmp(method, "ngram") && !mtp)
        return BADC("speculative", "invalid_value", "'speculative' method '%s' is not one of off, ngram, mtp", method);
    if (mtp && !kiln_engine_mtp_ok(s->eng))
        return BADC("speculative", "invalid_value", "'speculative' method '%s': this model ships no MTP layer (num_nextn_predict_layers)", method);
    p->spec_set = 1;
    p->spec_mtp = mtp;
    p->spec_k = method && !strcmp(method, "off") ? 0 : mtp ? 3 : 4;
    p->spec_ngram = 3;
    if (json_is_object(v)) {
        json_t *bad;
        const char *k;
        json_object_foreach(v, k, bad)
            if (strcmp(k, "method") && strcmp(k, "num_speculative_tokens") && strcmp(k, "prompt_lookup_max"))
                return BAD("speculative", "'speculative' has an unknown field '%s' (known: method, num_speculative_tokens, prompt_lookup_max)", k);
        static const char *const fields[2] = {"num_speculative_tokens", "prompt_lookup_max"};
        for (int i = 0; i < 2; i++) {
            json_t *x = json_object_get(v, fields[i]);
            if (!x || json_is_null(x)) continue;
            if (!json_is_integer(x)) return BAD("speculative", "'speculative.%s' must be an integer, got %s", fields[i], jtype(x));
            const long long n = json_integer_value(x);
            if (n < 1 || n > 16) return BADC("speculative", "invalid_value", "'speculative.%s' is %lld; it must be in [1, 16]", fields[i], n);
            if (i == 0 && p->spec_k) p->spec_k = (int)n;
            if (i == 1) p->spec_ngram = (int)n;
        }
    }
    return 1;
}

void kiln_oai_list_unknown(json_t *o, const char *const *known, char *out, size_t cap) {
    out[0] = 0;
    size_t at = 0;
    const char *k;
    json_t *v;
    json_object_foreach(o, k, v) {
        int ok = 0;
        for (int i = 0; known[i] && !ok; i++) ok = strcmp(k, known[i]) == 0;
        if (ok) continue;
        int w = snprintf(out + at, cap - at, "%s%.60s", at ? ", " : "", k);
        if (w < 0 || (size_t)w >= cap - at) { out[at] = 0; break; }
        at += (size_t)w;
    }
}

/* Body fields that change nothing here — unknown ones, and the OpenAI fields kiln accepts without
 * acting on them (user, metadata, store, service_tier, …) — listed for the X-Kiln-Ignored-Fields
 * header, so that a client learns a field it relies on was not applied rather than have it
 * silently mean nothing (vLLM warns in its log likewise). */
static void note_ignored(json_t *o, kiln_oai_params *p) {
    static const char *const known[] = {
        "model", "messages", "prompt", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stream",
        "stream_options", "stop", "stop_token_ids", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias",
        "logprobs", "top_logprobs", "ignore_eos", "skip_special_tokens", "chat_template_kwargs", "tools", "tool_choice",
        "parallel_tool_calls", "response_format", "echo", "best_of", "suffix", "functions", "function_call", "audio", "prediction",
        "speculative", "prompt_logprobs", "add_generation_prompt", "continue_final_message", NULL};
    kiln_oai_list_unknown(o, known, p->ignored, sizeof p->ignored);
}

/* tools, tool_choice, parallel_tool_calls (chat). OpenAI's rules: tools is an array of
 * {"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}} with names of
 * 1–64 characters from [a-zA-Z0-9_-]; tool_choice is "none", "auto", "required" or
 * {"type": "function", "function": {"name"}} naming one of them; "required" and a named function
 * need tools. */
static int parse_tools(kiln_server *s, json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    p->parallel_tools = 1;
    json_t *t = json_object_get(o, "tools");
    if (t && json_is_null(t)) t = NULL;
    if (t) {
        if (!json_is_array(t)) return BAD("tools", "'tools' must be an array, got %s", jtype(t));
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) {
            json_t *ty = json_object_get(e, "type"), *f = json_object_get(e, "function");
            if (!json_is_object(e)) return BAD("tools", "tools[%zu] must be an object, got %s", i, jtype(e));
            if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") != 0)
                return BAD("tools", "tools[%zu].type must be \"function\"", i);
            if (!json_is_object(f)) return BAD("tools", "tools[%zu].function must be an object", i);
            json_t *nm = json_object_get(f, "name"), *pa = json_object_get(f, "parameters"), *de = json_object_get(f, "description");
            if (!json_is_string(nm)) return BAD("tools", "tools[%zu].function.name must be a string", i);
            const char *n = json_string_value(nm);
            size_t nl = json_string_length(nm);
            int okname = nl >= 1 && nl <= 64;
            for (size_t k = 0; okname && k < nl; k++) okname = isalnum((unsigned char)n[k]) || n[k] == '_' || n[k] == '-';
            if (!okname) return BADC("tools", "invalid_value", "tools[%zu].function.name '%.80s' must be 1-64 characters of a-z, A-Z, 0-9, _ and -", i, n);
            if (pa && !json_is_null(pa) && !json_is_object(pa)) return BAD("tools", "tools[%zu].function.parameters must be an object (a JSON schema)", i);
            if (de && !json_is_null(de) && !json_is_string(de)) return BAD("tools", "tools[%zu].function.description must be a string", i);
        }
        if (json_array_size(t) == 0) t = NULL;
    }
    json_t *c = json_object_get(o, "tool_choice");
    if (c && json_is_null(c)) c = NULL;
    p->tool_choice = KILN_TOOL_CHOICE_AUTO;
    if (c && json_is_string(c)) {
        const char *v = json_string_value(c);
        if (strcmp(v, "none") == 0) p->tool_choice = KILN_TOOL_CHOICE_NONE;
        else if (strcmp(v, "auto") == 0) p->tool_choice = KILN_TOOL_CHOICE_AUTO;
        else if (strcmp(v, "required") == 0) p->tool_choice = KILN_TOOL_CHOICE_REQUIRED;
        else return BADC("tool_choice", "invalid_value", "'tool_choice' '%.64s' is not one of none, auto, required, or {\"type\": \"function\", ...}", v);
    } else if (c && json_is_object(c)) {
        json_t *ty = json_object_get(c, "type"), *nm = json_object_get(json_object_get(c, "function"), "name");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "function") != 0 || !json_is_string(nm))
            return BAD("tool_choice", "'tool_choice' as an object must be {\"type\": \"function\", \"function\": {\"name\": \"...\"}}");
        p->tool_choice = KILN_TOOL_CHOICE_NAMED;
        p->tool_name = strdup(json_string_value(nm));
        if (!p->tool_name) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        int found = 0;
        size_t i;
        json_t *e;
        json_array_foreach(t, i, e) found |= strcmp(json_string_value(json_object_get(json_object_get(e, "function"), "name")), p->tool_name) == 0;
        if (!found) return BADC("tool_choice", "invalid_value", "'tool_choice' names function '%.80s', which is not in 'tools'", p->tool_name);
        /* as vLLM: the named function's arguments are decoded under its parameters schema (any JSON
         * object when it has none) and returned as the call, whatever the model's native format */
        json_array_foreach(t, i, e) {
            json_t *f = json_object_get(e, "function");
            if (strcmp(json_string_value(json_object_get(f, "name")), p->tool_name) != 0) continue;
            json_t *pa = json_object_get(f, "parameters");
            p->tool_json = 1;
            p->json_mode = 1;
            if (pa && json_is_object(pa) && json_object_size(pa) > 0) {
                p->schema = json_dumps(pa, JSON_COMPACT | JSON_PRESERVE_ORDER);
                if (!p->schema) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
                kiln_jg *g = NULL;
                if (kiln_jg_compile(p->schema, &g) != KILN_OK)
                    return BADC("tool_choice", "invalid_value", "'tool_choice' names '%.80s', whose tools[%zu].function.parameters kiln cannot decode under: %s",
                                p->tool_name, i, kiln_last_error());
                kiln_jg_free(g);
                p->json_mode = 2;
            }
            break;
        }
    } else if (c) {
        return BAD("tool_choice", "'tool_choice' must be a string or an object, got %s", jtype(c));
    }
    if (!t && (p->tool_choice == KILN_TOOL_CHOICE_REQUIRED || p->tool_choice == KILN_TOOL_CHOICE_NAMED))
        return BAD("tool_choice", "'tool_choice' %s needs 'tools'", p->tool_choice == KILN_TOOL_CHOICE_REQUIRED ? "\"required\"" : "naming a function");
    int b, present;
    if (!opt_bool(o, "parallel_tool_calls", &b, &present, err)) return 0;
    if (present) p->parallel_tools = b;
    if (t && p->tool_choice == KILN_TOOL_CHOICE_REQUIRED) { /* vLLM's form: a JSON list of calls, decoded under the tools' schemas */
        char *tj = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
        kiln_jg *g = NULL;
        kiln_status gst = tj ? kiln_jg_compile_tools(tj, !p->parallel_tools, &g) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
        free(tj);
        kiln_jg_free(g);
        if (gst != KILN_OK) return BADC("tool_choice", "invalid_value", "'tool_choice' \"required\": %s", kiln_last_error());
        p->tool_json = 2;
    }
    if (t && !s->has_template && p->tool_choice != KILN_TOOL_CHOICE_NONE)
        return BADC("tools", "unsupported_parameter", "this model has no chat template, so 'tools' cannot be shown to it");
    p->tools = t ? json_incref(t) : NULL;
    p->tool_parser = t && p->tool_choice != KILN_TOOL_CHOICE_NONE && s->has_template && !p->tool_json ? s->tool_parser : KILN_TOOLS_NONE;
    if (p->tool_json == 2) p->json_mode = 0; /* its own grammar (server.c), not response_format's */
    return 1;
}

/* response_format: {"type": "text"}, {"type": "json_object"} or {"type": "json_schema",
 * "json_schema": {"name", "schema", "strict"?}}; the schema is compiled here once so that a
 * schema kiln cannot follow is a 400 naming it (engine/json_grammar.h lists what it takes). */
static int parse_response_format(json_t *o, kiln_oai_params *p, kiln_oai_error *err) {
    json_t *v = json_object_get(o, "response_format");
    if (!v || json_is_null(v)) return 1;
    json_t *t = json_is_object(v) ? json_object_get(v, "type") : NULL;
    if (p->tool_json && !(json_is_string(t) && strcmp(json_string_value(t), "text") == 0))
        return BADC("response_format", "invalid_value", "'response_format' cannot be combined with 'tool_choice' %s (the calls are the output)",
                    p->tool_json == 1 ? "naming a function" : "\"required\"");
    const char *ty = json_string_value(t);
    if (!ty) return BAD("response_format", "'response_format' must be an object with a type");
    if (strcmp(ty, "text") == 0) return 1;
    if (strcmp(ty, "json_object") == 0) { p->json_mode = 1; return 1; }
    if (strcmp(ty, "json_schema") != 0)
        return BADC("response_format", "invalid_value", "response_format.type '%.40s' is not one of text, json_object, json_schema", ty);
    json_t *js = json_object_get(v, "json_schema"), *sc = json_object_get(js, "schema");
    if (!json_is_object(js) || !json_is_object(sc)) return BAD("response_format", "response_format.json_schema.schema must be an object (a JSON Schema)");
    p->schema = json_dumps(sc, JSON_COMPACT | JSON_PRESERVE_ORDER);
    if (!p->schema) return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    kiln_jg *g = NULL;
    if (kiln_jg_compile(p->schema, &g) != KILN_OK) return BADC("response_format", "invalid_value", "response_format.json_schema.%s", kiln_last_error());
    kiln_jg_free(g);
    p->json_mode = 2;
    return 1;
}

/* The reasoning split of this request: the server's parser unless chat_template_kwargs turns
 * thinking off ("enable_thinking": false, GLM; "thinking": false, DeepSeek / Kimi), as vLLM's
 * parsers do. */
static void choose_reasoning(kiln_server *s, json_t *kw, kiln_oai_params *p) {
    p->reasoning = s->has_template ? s->reasoning_parser : KILN_REASONING_NONE;
    json_t *et = json_object_get(kw, "enable_thinking"), *th = json_object_get(kw, "thinking");
    if ((json_is_boolean(et) && !json_is_true(et)) || (json_is_boolean(th) && !json_is_true(th))) p->reasoning = KILN_REASONING_NONE;
}

int kiln_oai_parse(kiln_server *s, const char *body, size_t len, int chat, kiln_oai_params *p, kiln_oai_error *err) {
    memset(p, 0, sizeof *p);
    p->chat = chat;
    kiln_model_default_sampling(s->m, &p->sp); /* generation_config.json's defaults, then the request's fields */
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return BAD(NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    int ok = 0, present, b;
    long long iv;
    double dv;
    if (!json_is_object(o)) { BAD(NULL, "the request body must be a JSON object, got %s", jtype(o)); goto out; }
    /* model */
    json_t *mv = json_object_get(o, "model");
    if (!mv || json_is_null(mv)) { BAD("model", "'model' is required"); goto out; }
    if (!json_is_string(mv)) { BAD("model", "'model' must be a string, got %s", jtype(mv)); goto out; }
    if (strcmp(json_string_value(mv), s->model_name) != 0) {
        kiln_oai_fail(err, 404, "invalid_request_error", "model", "model_not_found", "The model '%.200s' does not exist (this server serves '%s')",
                      json_string_value(mv), s->model_name);
        goto out;
    }
    note_ignored(o, p);
    if (!neutral_only(o, err, chat)) goto out;
    /* n */
    if (!opt_int(o, "n", 1, KILN_MAX_N, &iv, &present, err)) goto out;
    p->n = present ? (int)iv : 1;
    /* stream, stream_options */
    if (!opt_bool(o, "stream", &p->stream, &present, err)) goto out;
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) { BAD("stream_options", "'stream_options' must be an object, got %s", jtype(so)); goto out; }
        if (!p->stream) { BAD("stream_options", "'stream_options' is only allowed when 'stream' is true"); goto out; }
        if (!opt_bool(so, "include_usage", &p->include_usage, &present, err)) { err->param = "stream_options.include_usage"; goto out; }
    }
    /* sampling */
    if (!opt_num(o, "temperature", 0, 2, &dv, &present, err)) goto out;
    if (present) p->sp.temperature = (float)dv;
    if (!opt_int(o, "top_k", -1, 1 << 24, &iv, &present, err)) goto out; /* vLLM's extension; -1 and 0: off */
    if (present) p->sp.top_k = iv > 0 ? (int)iv : 0;
    if (!opt_num(o, "top_p", 0, 1, &dv, &present, err)) goto out;
    if (present) {
        if (dv == 0) p->sp.temperature = 0; /* nothing but the most likely token */
        else p->sp.top_p = (float)dv;
    }
    if (!opt_num(o, "min_p", 0, 1, &dv, &present, err)) goto out; /* vLLM's / llama.cpp's extension; 0: off */
    if (present) p->sp.min_p = (float)dv;
    if (!opt_int(o, "seed", INT64_MIN, INT64_MAX, &iv, &present, err)) goto out;
    if (present) p->sp.seed = (uint64_t)iv;
    else p->sp.seed = (uint64_t)atomic_fetch_add(&s->id_counter, 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t)time(NULL);
    /* penalties (OpenAI ranges; repetition_penalty is vLLM's extension) */
    if (!opt_num(o, "presence_penalty", -2, 2, &dv, &present, err)) goto out;
    if (present) p->sp.presence_penalty = (float)dv;
    if (!opt_num(o, "frequency_penalty", -2, 2, &dv, &present, err)) goto out;
    if (present) p->sp.frequency_penalty = (float)dv;
    if (!opt_num(o, "repetition_penalty", 0, 1e6, &dv, &present, err)) goto out;
    if (present && !(dv > 0)) { BADC("repetition_penalty", "invalid_value", "'repetition_penalty' is %g; it must be > 0", dv); goto out; }
    if (present) p->sp.repetition_penalty = (float)dv;
    if (!parse_logit_bias(s, o, p, err)) goto out;
    if (!opt_bool(o, "ignore_eos", &p->ignore_eos, &present, err)) goto out;
    p->skip_special = 1; /* vLLM's skip_special_tokens: special tokens never reach the text */
    if (!opt_bool(o, "skip_special_tokens", &b, &present, err)) goto out;
    if (present) p->skip_special = b;
    if (!parse_stop(o, p, err)) goto out;
    if (!parse_stop_ids(s, o, p, err)) goto out;
    if (!parse_speculative(s, o, p, err)) goto out;
    /* logprobs */
    if (chat) {
        if (!opt_bool(o, "logprobs", &b, &present, err)) goto out;
        p->logprobs = present && b;
        if (!opt_int(o, "top_logprobs", 0, KILN_MAX_TOP_LOGPROBS, &iv, &present, err)) goto out;
        if (present && !p->logprobs) { BAD("top_logprobs", "'top_logprobs' requires 'logprobs' to be true"); goto out; }
        if (present) p->top_logprobs = (int)iv;
    } else {
        if (!opt_int(o, "logprobs", 0, 5, &iv, &present, err)) goto out;
        p->logprobs = present;
        if (present) p->top_logprobs = (int)iv;
        /* echo (OpenAI's legacy completions, vLLM): the prompt comes back before the completion,
         * with its tokens' log-probabilities when logprobs is given (what lm-evaluation-harness's
         * loglikelihood requests read: echo, logprobs 1, max_tokens 0 or 1) */
        if (!opt_bool(o, "echo", &p->echo, &present, err)) goto out;
        if (p->echo && p->logprobs && kiln_engine_ranks(s->eng) > 1) {
            BADC("echo", "unsupported_parameter", "'echo' with 'logprobs' (the prompt's log-probabilities) is not supported under --tp");
            goto out;
        }
    }
    /* prompt_logprobs (vLLM's): each prompt token's log-probability, rank and that many alternatives */
    p->prompt_logprobs = -1;
    if (!opt_int(o, "prompt_logprobs", 0, KILN_MAX_TOP_LOGPROBS, &iv, &present, err)) goto out;
    if (present) {
        if (p->stream) { BADC("prompt_logprobs", "unsupported_parameter", "'prompt_logprobs' is not available with 'stream': true (as in vLLM)"); goto out; }
        if (kiln_engine_ranks(s->eng) > 1) { BADC("prompt_logprobs", "unsupported_parameter", "'prompt_logprobs' is not supported under --tp"); goto out; }
        p->prompt_logprobs = (int)iv;
    }
    /* max_tokens (max_completion_tokens wins when both are given) */
    int ctx = kiln_engine_context(s->eng);
    long long mt = 0;
    int mt_given = 0;
    if (!opt_int(o, "max_tokens", LLONG_MIN, LLONG_MAX, &iv, &present, err)) goto out;
    if (present) { mt = iv; mt_given = 1; }
    const char *mt_name = "max_tokens";
    if (chat) {
        if (!opt_int(o, "max_completion_tokens", LLONG_MIN, LLONG_MAX, &iv, &present, err)) goto out;
        if (present) { mt = iv; mt_given = 1; mt_name = "max_completion_tokens"; }
    }
    if (mt_given && mt < (p->echo ? 0 : 1)) { /* (0 with echo: the prompt alone, as OpenAI / vLLM) */
        BADC(mt_name, "invalid_value", "'%s' is %lld; it must be at least %d", mt_name, mt, p->echo ? 0 : 1);
        goto out;
    }
    if (mt > ctx) { BADC(mt_name, "invalid_value", "'%s' is %lld, more than this model's context of %d tokens", mt_name, mt, ctx); goto out; }
    /* the prompt */
    if (chat) {
        json_t *msgs = json_object_get(o, "messages");
        if (!msgs || json_is_null(msgs)) { BAD("messages", "'messages' is required"); goto out; }
        if (!json_is_array(msgs)) { BAD("messages", "'messages' must be an array, got %s", jtype(msgs)); goto out; }
        if (json_array_size(msgs) == 0) { BAD("messages", "'messages' must not be empty"); goto out; }
        json_t *kw = json_object_get(o, "chat_template_kwargs");
        if (kw && json_is_null(kw)) kw = NULL;
        if (kw && !json_is_object(kw)) { BAD("chat_template_kwargs", "'chat_template_kwargs' must be an object, got %s", jtype(kw)); goto out; }
        if (!parse_tools(s, o, p, err)) goto out;
        if (!parse_response_format(o, p, err)) goto out;
        choose_reasoning(s, kw, p);
        if (p->tool_json) p->reasoning = KILN_REASONING_NONE; /* the arguments start at the first token */
        kiln_sbuf text = {0};
        int templated = 0;
        /* vLLM's add_generation_prompt (default true) and continue_final_message (default false):
         * the assistant's turn opened for the answer, or the final message continued (a prefill) */
        int add_gen = 1, cont = 0;
        if (!opt_bool(o, "add_generation_prompt", &add_gen, &present, err)) goto out;
        if (!present) add_gen = 1;
        if (!opt_bool(o, "continue_final_message", &cont, &present, err)) goto out;
        if (cont && add_gen && present && json_is_true(json_object_get(o, "add_generation_prompt"))) {
            BADC("continue_final_message", "invalid_value", "'continue_final_message' and 'add_generation_prompt' cannot both be true");
            goto out;
        }
        if (cont) add_gen = 0;
        /* echo (vLLM's chat echo): a final assistant message's text goes before the answer's
         * content (with continue_final_message: the whole assistant turn comes back) */
        int echo = 0;
        if (!opt_bool(o, "echo", &echo, &present, err)) goto out;
        json_t *fin = json_array_get(msgs, json_array_size(msgs) - 1);
        if (echo && json_is_object(fin) && json_is_string(json_object_get(fin, "role")) && strcmp(json_string_value(json_object_get(fin, "role")), "assistant") == 0) {
            json_t *fc = json_object_get(fin, "content");
            kiln_sbuf e = {0};
            if (json_is_string(fc)) kiln_sbuf_put(&e, json_string_value(fc), json_string_length(fc));
            for (size_t k = 0; json_is_array(fc) && k < json_array_size(fc); k++) { /* (vLLM joins text parts with newlines here) */
                json_t *tx = json_object_get(json_array_get(fc, k), "text");
                if (k) kiln_sbuf_put(&e, "\n", 1);
                kiln_sbuf_put(&e, json_string_value(tx), json_string_length(tx));
            }
            if (e.oom) { kiln_sbuf_free(&e); kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory"); goto out; }
            p->chat_echo = e.p ? e.p : strdup("");
            p->chat_echo_len = e.len;
        }
        int rok = kiln_server_render_chat(s, msgs, p->tools, kw, add_gen, cont, &text, &templated, err);
        if (rok && text.oom) rok = kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        p->think_opened = templated && kiln_prompt_opens_think(text.p ? text.p : "", text.len);
        if (rok && !(p->prompts = calloc(1, sizeof *p->prompts))) rok = kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
        if (rok) {
            p->n_prompts = 1;
            rok = tokenize(s, text.p ? text.p : "", text.len, &p->prompts[0], "messages", templated, err);
        }
        kiln_sbuf_free(&text);
        if (!rok) goto out;
    } else if (!parse_prompt(s, o, p, err)) goto out;
    for (int k = 0; k < p->n_prompts; k++) {
        kiln_oai_prompt *q = &p->prompts[k];
        char at[32] = "";
        if (p->n_prompts > 1) snprintf(at, sizeof at, "'prompt'[%d]: ", k);
        if (q->n >= ctx) {
            BADC(chat ? "messages" : "prompt", "context_length_exceeded", "%sthis model's context is %d tokens, but the prompt has %d tokens", at, ctx, q->n);
            goto out;
        }
        const long long want = mt_given ? mt : ctx - q->n; /* by default: the rest of the context */
        if (q->n + want > ctx) {
            BADC(mt_name, "context_length_exceeded", "%sthis model's context is %d tokens, but %d prompt tokens + %s %lld = %lld", at, ctx, q->n, mt_name, want,
                 q->n + want);
            goto out;
        }
        q->max_tokens = (int)want;
    }
    ok = 1;
out:
    json_decref(o);
    if (!ok) kiln_oai_params_free(p);
    return ok;
}

void kiln_oai_params_free(kiln_oai_params *p) {
    for (int i = 0; i < p->n_stops; i++) free(p->stops[i]);
    json_decref(p->tools);
    free(p->tool_name);
    free(p->schema);
    p->schema = NULL;
    p->tools = NULL;
    p->tool_name = NULL;
    for (int k = 0; k < p->n_prompts; k++) {
        free(p->prompts[k].ids);
        free(p->prompts[k].echo_text);
    }
    free(p->prompts);
    p->prompts = NULL;
    free(p->chat_echo);
    p->chat_echo = NULL;
    p->n_prompts = 0;
    free(p->bias_ids);
    free(p->bias_vals);
    p->bias_ids = NULL;
    p->bias_vals = NULL;
    p->sp.n_logit_bias = 0;
    p->n_stops = 0;
}
