/* anthropic.c — Anthropic Messages requests translated into chat completions (anthropic.h). The
 * validation follows the Messages API reference: model, max_tokens (≥ 1) and messages (roles user /
 * assistant; content a string or text / tool_use / tool_result / thinking blocks) are required;
 * system is a string or text blocks; stop_sequences strings; temperature 0–1; tools
 * {name, description?, input_schema}; tool_choice {type: auto | any | tool | none, name?,
 * disable_parallel_tool_use?}; thinking {type: enabled | disabled | adaptive}; a final assistant
 * message with text is a prefill the answer continues (continue_final_message). Errors name the
 * Anthropic parameter (messages.N.content.M …) the way Anthropic's own do. */
#include "server/anthropic.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BAD(...) kiln_oai_fail(err, 400, "invalid_request_error", NULL, NULL, __VA_ARGS__)

json_t *kiln_anthropic_error_json(const kiln_oai_error *e) {
    const char *t = "api_error";
    switch (e->http) {
    case 400: case 405: case 413: t = e->http == 413 ? "request_too_large" : "invalid_request_error"; break;
    case 401: t = "authentication_error"; break;
    case 403: t = "permission_error"; break;
    case 404: t = "not_found_error"; break;
    case 429: t = "rate_limit_error"; break;
    case 503: case 529: t = "overloaded_error"; break;
    case 504: t = "timeout_error"; break;
    default: t = "api_error"; break;
    }
    return json_pack("{s:s,s:{s:s,s:o}}", "type", "error", "error", "type", t, "message", kiln_json_bytes_string(e->msg, strlen(e->msg)));
}

char *kiln_anthropic_tool_id(const char *id) {
    const char *pre = "chatcmpl-tool-";
    size_t lp = strlen(pre);
    char *out = malloc(strlen(id) + 8);
    if (!out) return NULL;
    if (strncmp(id, pre, lp) == 0) sprintf(out, "toolu_%s", id + lp);
    else strcpy(out, id);
    return out;
}

json_t *kiln_anthropic_tool_input(const char *arguments) {
    json_t *v = arguments ? json_loads(arguments, JSON_DECODE_ANY, NULL) : NULL;
    if (json_is_object(v)) return v;
    json_decref(v);
    return json_object();
}

/* The text of a string or an array of text blocks (other block types → 0 with err). */
static int text_of(json_t *c, const char *where, kiln_sbuf *out, kiln_oai_error *err) {
    if (json_is_string(c)) { kiln_sbuf_put(out, json_string_value(c), json_string_length(c)); return 1; }
    if (!json_is_array(c)) return BAD("%s: expected a string or an array of text blocks", where);
    size_t i;
    json_t *b;
    json_array_foreach(c, i, b) {
        json_t *ty = json_object_get(b, "type"), *tx = json_object_get(b, "text");
        if (!json_is_string(ty) || strcmp(json_string_value(ty), "text") != 0 || !json_is_string(tx))
            return BAD("%s.%zu: only text blocks ({\"type\": \"text\", \"text\": ...}) are supported here", where, i);
        kiln_sbuf_put(out, json_string_value(tx), json_string_length(tx));
    }
    return 1;
}

static json_t *sbuf_string(const kiln_sbuf *b) { return json_stringn(b->p ? b->p : "", b->len); }

/* One Anthropic message → chat messages appended to msgs. */
static int convert_message(json_t *m, size_t i, json_t *msgs, kiln_oai_error *err) {
    char where[64];
    snprintf(where, sizeof where, "messages.%zu", i);
    if (!json_is_object(m)) return BAD("%s: expected an object", where);
    json_t *role = json_object_get(m, "role"), *c = json_object_get(m, "content");
    if (!json_is_string(role) || (strcmp(json_string_value(role), "user") != 0 && strcmp(json_string_value(role), "assistant") != 0))
        return BAD("%s.role: expected \"user\" or \"assistant\"", where);
    const int user = strcmp(json_string_value(role), "user") == 0;
    if (json_is_string(c)) {
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", user ? "user" : "assistant", "content", c));
        return 1;
    }
    if (!json_is_array(c)) return BAD("%s.content: expected a string or an array of content blocks", where);
    kiln_sbuf text = {0}, thinking = {0};
    json_t *calls = json_array();
    int ok = 1, any_text = 0;
    size_t k;
    json_t *b;
    json_array_foreach(c, k, b) {
        char bw[96];
        snprintf(bw, sizeof bw, "%s.content.%zu", where, k);
        const char *ty = json_string_value(json_object_get(b, "type"));
        if (!json_is_object(b) || !ty) { ok = BAD("%s: expected a content block with a type", bw); break; }
        if (strcmp(ty, "text") == 0) {
            json_t *tx = json_object_get(b, "text");
            if (!json_is_string(tx)) { ok = BAD("%s.text: expected a string", bw); break; }
            kiln_sbuf_put(&text, json_string_value(tx), json_string_length(tx));
            any_text = 1;
        } else if (strcmp(ty, "tool_result") == 0 && user) {
            json_t *id = json_object_get(b, "tool_use_id"), *rc = json_object_get(b, "content");
            if (!json_is_string(id)) { ok = BAD("%s.tool_use_id: expected a string", bw); break; }
            kiln_sbuf r = {0};
            char cw[112];
            snprintf(cw, sizeof cw, "%s.content", bw);
            if (rc && !json_is_null(rc) && !(ok = text_of(rc, cw, &r, err))) { kiln_sbuf_free(&r); break; }
            json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", sbuf_string(&r)));
            kiln_sbuf_free(&r);
        } else if (strcmp(ty, "tool_use") == 0 && !user) {
            json_t *id = json_object_get(b, "id"), *nm = json_object_get(b, "name"), *in = json_object_get(b, "input");
            if (!json_is_string(id) || !json_is_string(nm)) { ok = BAD("%s: tool_use blocks need string id and name", bw); break; }
            if (in && !json_is_object(in)) { ok = BAD("%s.input: expected an object", bw); break; }
            char *args = in ? json_dumps(in, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
            json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:s}}", "id", id, "type", "function", "function", "name", nm, "arguments", args ? args : "{}"));
            free(args);
        } else if (strcmp(ty, "thinking") == 0 && !user) {
            json_t *th = json_object_get(b, "thinking");
            if (!json_is_string(th)) { ok = BAD("%s.thinking: expected a string", bw); break; }
            kiln_sbuf_put(&thinking, json_string_value(th), json_string_length(th));
        } else if (strcmp(ty, "redacted_thinking") == 0 && !user) {
            /* nothing kiln can show the model */
        } else {
            ok = BAD("%s: content blocks of type '%.40s' are not supported in %s messages (text, %s)", bw, ty, user ? "user" : "assistant",
                     user ? "tool_result" : "tool_use, thinking");
            break;
        }
    }
    if (ok && (any_text || !user || json_array_size(calls) == 0)) {
        if (user) {
            if (any_text) json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "user", "content", sbuf_string(&text)));
        } else {
            json_t *a = json_pack("{s:s,s:o}", "role", "assistant", "content", any_text ? sbuf_string(&text) : json_null());
            if (thinking.len) json_object_set_new(a, "reasoning_content", sbuf_string(&thinking));
            if (json_array_size(calls)) json_object_set(a, "tool_calls", calls);
            json_array_append_new(msgs, a);
        }
    }
    kiln_sbuf_free(&text);
    kiln_sbuf_free(&thinking);
    json_decref(calls);
    return ok;
}

int kiln_anthropic_request(kiln_server *s, const char *body, size_t len, int count_only, json_t **out, kiln_oai_error *err) {
    (void)s;
    *out = NULL;
    json_error_t je;
    json_t *o = json_loadb(body, len, 0, &je);
    if (!o) return BAD("the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    json_t *r = json_object();
    int ok = 0;
    if (!json_is_object(o)) { BAD("the request body must be a JSON object"); goto done; }
    json_t *model = json_object_get(o, "model");
    if (!json_is_string(model)) { BAD("model: Field required (a string)"); goto done; }
    json_object_set(r, "model", model);
    json_t *mt = json_object_get(o, "max_tokens");
    if (!count_only) {
        if (!json_is_integer(mt)) { BAD("max_tokens: Field required (an integer)"); goto done; }
        if (json_integer_value(mt) < 1) { BAD("max_tokens: must be at least 1, got %lld", (long long)json_integer_value(mt)); goto done; }
        json_object_set(r, "max_tokens", mt);
    } else {
        json_object_set_new(r, "max_tokens", json_integer(1));
    }
    json_t *msgs = json_array();
    json_object_set_new(r, "messages", msgs);
    json_t *sys = json_object_get(o, "system");
    if (sys && !json_is_null(sys)) {
        kiln_sbuf t = {0};
        if (!text_of(sys, "system", &t, err)) { kiln_sbuf_free(&t); goto done; }
        json_array_append_new(msgs, json_pack("{s:s,s:o}", "role", "system", "content", sbuf_string(&t)));
        kiln_sbuf_free(&t);
    }
    json_t *am = json_object_get(o, "messages");
    if (!json_is_array(am) || json_array_size(am) == 0) { BAD("messages: Field required (a non-empty array)"); goto done; }
    size_t i;
    json_t *m;
    json_array_foreach(am, i, m) if (!convert_message(m, i, msgs, err)) goto done;
    /* a final assistant message with text is a prefill: the answer continues it (Anthropic's
     * semantics; the chat completion's continue_final_message) */
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    json_t *lc = json_object_get(last, "content");
    const char *lr = json_string_value(json_object_get(last, "role"));
    if (lr && strcmp(lr, "assistant") == 0 && json_is_string(lc) && json_string_length(lc) &&
        !json_object_get(last, "tool_calls"))
        json_object_set_new(r, "continue_final_message", json_true());
    /* sampling */
    json_t *v;
    if ((v = json_object_get(o, "temperature")) && !json_is_null(v)) {
        if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1) { BAD("temperature: must be a number in [0, 1]"); goto done; }
        json_object_set(r, "temperature", v);
    }
    if ((v = json_object_get(o, "top_p")) && !json_is_null(v)) json_object_set(r, "top_p", v);
    if ((v = json_object_get(o, "top_k")) && !json_is_null(v)) json_object_set(r, "top_k", v);
    if ((v = json_object_get(o, "stream")) && !json_is_null(v)) {
        if (!json_is_boolean(v)) { BAD("stream: must be a boolean"); goto done; }
        if (!count_only) json_object_set(r, "stream", v);
    }
    if ((v = json_object_get(o, "stop_sequences")) && !json_is_null(v)) {
        if (!json_is_array(v)) { BAD("stop_sequences: must be an array of strings"); goto done; }
        json_t *e;
        json_array_foreach(v, i, e) if (!json_is_string(e)) { BAD("stop_sequences.%zu: must be a string", i); goto done; }
        if (json_array_size(v)) json_object_set(r, "stop", v);
    }
    /* tools */
    json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) { BAD("tools: must be an array"); goto done; }
        json_t *ot = json_array(), *t;
        json_object_set_new(r, "tools", ot);
        json_array_foreach(tools, i, t) {
            json_t *ty = json_object_get(t, "type"), *nm = json_object_get(t, "name"), *sc = json_object_get(t, "input_schema"),
                   *de = json_object_get(t, "description");
            if (ty && !json_is_null(ty) && !(json_is_string(ty) && strcmp(json_string_value(ty), "custom") == 0)) {
                BAD("tools.%zu.type: server tools ('%.60s') are not supported; give custom tools {name, description, input_schema}", i,
                    json_is_string(ty) ? json_string_value(ty) : "?");
                goto done;
            }
            if (!json_is_string(nm)) { BAD("tools.%zu.name: Field required", i); goto done; }
            if (!json_is_object(sc)) { BAD("tools.%zu.input_schema: Field required (an object)", i); goto done; }
            json_t *f = json_pack("{s:O,s:O}", "name", nm, "parameters", sc);
            if (json_is_string(de)) json_object_set(f, "description", de);
            json_array_append_new(ot, json_pack("{s:s,s:o}", "type", "function", "function", f));
        }
    }
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc)) {
        const char *ty = json_string_value(json_object_get(tc, "type"));
        if (!json_is_object(tc) || !ty) { BAD("tool_choice: must be an object with a type"); goto done; }
        if (strcmp(ty, "auto") == 0) json_object_set_new(r, "tool_choice", json_string("auto"));
        else if (strcmp(ty, "any") == 0) json_object_set_new(r, "tool_choice", json_string("required"));
        else if (strcmp(ty, "none") == 0) json_object_set_new(r, "tool_choice", json_string("none"));
        else if (strcmp(ty, "tool") == 0) {
            json_t *nm = json_object_get(tc, "name");
            if (!json_is_string(nm)) { BAD("tool_choice.name: Field required for type 'tool'"); goto done; }
            json_object_set_new(r, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", nm));
        } else { BAD("tool_choice.type: '%.40s' is not one of auto, any, tool, none", ty); goto done; }
        json_t *dp = json_object_get(tc, "disable_parallel_tool_use");
        if (json_is_true(dp)) json_object_set_new(r, "parallel_tool_calls", json_false());
    }
    /* extended thinking → the templates' switches (GLM: enable_thinking; DeepSeek / Kimi: thinking) */
    json_t *th = json_object_get(o, "thinking");
    if (th && !json_is_null(th)) {
        const char *ty = json_string_value(json_object_get(th, "type"));
        if (!ty || (strcmp(ty, "enabled") != 0 && strcmp(ty, "disabled") != 0 && strcmp(ty, "adaptive") != 0)) {
            BAD("thinking.type: expected 'enabled', 'disabled' or 'adaptive'");
            goto done;
        }
        const int on = strcmp(ty, "disabled") != 0;
        json_object_set_new(r, "chat_template_kwargs", json_pack("{s:b,s:b}", "enable_thinking", on, "thinking", on));
    }
    ok = 1;
done:
    json_decref(o);
    if (ok) *out = r;
    else json_decref(r);
    return ok;
}
