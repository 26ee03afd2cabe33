/* chat.c — chat messages → prompt text.
 *
 * A model that ships a chat template (chat_template.jinja, tokenizer_config.json "chat_template",
 * GGUF tokenizer.chat_template) is rendered with it through kiln_chat_render (kiln.h: Hugging Face
 * apply_chat_template semantics, add_generation_prompt as the request says (default true), the
 * request's chat_template_kwargs as extra variables; continue_final_message cuts the text after the
 * final message, as Hugging Face does). Checkpoints without one use the built-in plain template
 * (docs/SERVER.md):
 *     for each message:  "<role>: <content>\n"
 *     then:              "assistant:"       (add_generation_prompt)
 * Validation (roles, content types, tool calls) is the same either way and runs first. The
 * request's tools go to the template as `tools`; assistant tool calls' JSON-string arguments are
 * parsed into objects first (vLLM does the same: GLM's template iterates them).
 *
 * The parsers of the output (chat_output.h) are chosen at start from the template source:
 * kiln_server_choose_parsers. */
#include "server/server_internal.h"
#include "base/status.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *roles[] = {"system", "developer", "user", "assistant", "tool", NULL};

void kiln_server_probe_template(kiln_server *s) {
    s->has_template = 0;
    if (!s->info.has_tokenizer) { snprintf(s->template_note, sizeof s->template_note, "none (no tokenizer)"); return; }
    char *out = NULL;
    kiln_status st = kiln_chat_render(s->m, "[{\"role\":\"user\",\"content\":\"Hello\"}]", NULL, 1, NULL, &out);
    free(out);
    if (st == KILN_OK) {
        s->has_template = 1;
        snprintf(s->template_note, sizeof s->template_note, "the model's own");
    } else if (strstr(kiln_last_error(), "no chat template")) {
        snprintf(s->template_note, sizeof s->template_note, "built-in plain (the model has none)");
    } else {
        snprintf(s->template_note, sizeof s->template_note, "built-in plain (the model's does not render: %.200s)", kiln_last_error());
    }
}

/* Assistant tool calls as templates read them: each function.arguments JSON string parsed into
 * its object (GLM's template iterates arguments.items(); vLLM parses them the same way), an empty
 * or null one as {}. Returns 0 with err naming the message and call when one is not JSON. */
static int parse_call_arguments(json_t *norm, kiln_oai_error *err) {
    for (size_t i = 0; i < json_array_size(norm); i++) {
        json_t *calls = json_object_get(json_array_get(norm, i), "tool_calls");
        if (!json_is_array(calls)) continue;
        for (size_t j = 0; j < json_array_size(calls); j++) {
            json_t *f = json_object_get(json_array_get(calls, j), "function"), *a = json_object_get(f, "arguments");
            if (!json_is_object(f)) continue;
            if (!a || json_is_null(a) || (json_is_string(a) && json_string_length(a) == 0)) {
                json_object_set_new(f, "arguments", json_object());
            } else if (json_is_string(a)) {
                json_error_t je;
                json_t *v = json_loads(json_string_value(a), JSON_DECODE_ANY, &je);
                if (!v)
                    return kiln_oai_fail(err, 400, "invalid_request_error", "messages", "invalid_value",
                                         "messages[%zu].tool_calls[%zu].function.arguments is not valid JSON: %s", i, j, je.text);
                json_object_set_new(f, "arguments", v);
            }
        }
    }
    return 1;
}

static int render_model_template(kiln_server *s, json_t *messages, json_t *tools, json_t *kwargs, int add_gen, kiln_sbuf *out, kiln_oai_error *err) {
    /* text parts become one string (templates expect string content; parts are concatenated) */
    json_t *norm = json_deep_copy(messages);
    if (norm && !parse_call_arguments(norm, err)) { json_decref(norm); return 0; }
    for (size_t i = 0; norm && i < json_array_size(norm); i++) {
        json_t *m = json_array_get(norm, i), *c = json_object_get(m, "content");
        /* null content (an assistant turn of only tool calls) is "" as vLLM passes it: templates
         * that print the content would otherwise write "None" */
        if (!c || json_is_null(c)) { json_object_set_new(m, "content", json_string("")); continue; }
        if (!json_is_array(c)) continue;
        kiln_sbuf t = {0};
        for (size_t k = 0; k < json_array_size(c); k++) {
            json_t *tx = json_object_get(json_array_get(c, k), "text");
            kiln_sbuf_put(&t, json_string_value(tx), json_string_length(tx));
        }
        json_object_set_new(m, "content", json_stringn(t.p ? t.p : "", t.len));
        kiln_sbuf_free(&t);
    }
    char *msgs = norm ? json_dumps(norm, JSON_COMPACT) : NULL, *extra = kwargs ? json_dumps(kwargs, JSON_COMPACT) : NULL, *text = NULL;
    char *tl = tools ? json_dumps(tools, JSON_COMPACT) : NULL;
    if (!msgs || (kwargs && !extra) || (tools && !tl)) {
        json_decref(norm); free(msgs); free(extra); free(tl);
        return kiln_oai_fail(err, 500, "server_error", NULL, NULL, "out of memory");
    }
    kiln_status st = kiln_chat_render(s->m, msgs, tl, add_gen, extra, &text);
    json_decref(norm);
    free(msgs);
    free(extra);
    free(tl);
    if (st != KILN_OK) return kiln_oai_fail(err, 400, "invalid_request_error", "messages", "chat_template_error", "chat template: %s", kiln_last_error());
    kiln_sbuf_puts(out, text);
    free(text);
    return 1;
}

static int is_space(char ch) { return ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r' || ch == '\f' || ch == '\v'; }

/* continue_final_message: the rendered chat cut right after the final message's text, as Hugging
 * Face's apply_chat_template(continue_final_message=True) cuts it (and vLLM with it): at the last
 * occurrence of that text stripped of surrounding whitespace, keeping its trailing whitespace only
 * where the template kept it. The text is the message's content (its text parts concatenated). */
static int cut_after_final(json_t *messages, kiln_sbuf *out, kiln_oai_error *err) {
    json_t *c = json_object_get(json_array_get(messages, json_array_size(messages) - 1), "content");
    kiln_sbuf fin = {0};
    if (json_is_string(c)) kiln_sbuf_put(&fin, json_string_value(c), json_string_length(c));
    for (size_t k = 0; json_is_array(c) && k < json_array_size(c); k++) {
        json_t *tx = json_object_get(json_array_get(c, k), "text");
        kiln_sbuf_put(&fin, json_string_value(tx), json_string_length(tx));
    }
    const char *f = fin.p ? fin.p : "";
    size_t a = 0, b = fin.len;
    while (a < b && is_space(f[a])) a++;
    while (b > a && is_space(f[b - 1])) b--;
    const char *hay = out->p ? out->p : "";
    if (b == a) { /* (an empty text is found at the very end: nothing is cut) */
        kiln_sbuf_free(&fin);
        return 1;
    }
    const char *loc = NULL;
    for (const char *q = hay; (q = memmem(q, out->len - (size_t)(q - hay), f + a, b - a)) != NULL; q++) loc = q;
    if (!loc) {
        kiln_sbuf_free(&fin);
        return kiln_oai_fail(err, 400, "invalid_request_error", "continue_final_message", "invalid_value",
                             "continue_final_message: the final message's text does not appear in the rendered chat");
    }
    /* the whole text (no leading whitespace) where the template kept it, else the stripped one */
    const size_t at = (size_t)(loc - hay);
    out->len = a == 0 && at + fin.len <= out->len && memcmp(loc, f, fin.len) == 0 ? at + fin.len : at + (b - a);
    kiln_sbuf_free(&fin);
    return 1;
}

int kiln_server_render_chat(kiln_server *s, json_t *messages, json_t *tools, json_t *kwargs, int add_gen, int cont, kiln_sbuf *out, int *templated,
                            kiln_oai_error *err) {
    char param[64];
    *templated = 0;
    size_t n = json_array_size(messages);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(messages, i);
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(msg)) return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s must be an object", param);
        json_t *role = json_object_get(msg, "role");
        if (!role || !json_is_string(role))
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.role must be a string", param);
        int known = 0;
        for (int r = 0; roles[r]; r++) known |= strcmp(json_string_value(role), roles[r]) == 0;
        if (!known)
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", "invalid_value",
                                 "%s.role '%.64s' is not one of system, developer, user, assistant, tool", param, json_string_value(role));
        json_t *c = json_object_get(msg, "content");
        kiln_sbuf_puts(out, json_string_value(role));
        kiln_sbuf_puts(out, ": ");
        json_t *calls = json_object_get(msg, "tool_calls");
        if (calls && !json_is_null(calls) && (!json_is_array(calls) || strcmp(json_string_value(role), "assistant") != 0))
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.tool_calls must be an array, on an assistant message", param);
        for (size_t j = 0; json_is_array(calls) && j < json_array_size(calls); j++) {
            json_t *f = json_object_get(json_array_get(calls, j), "function");
            if (!json_is_object(f) || !json_is_string(json_object_get(f, "name")))
                return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.tool_calls[%zu].function.name must be a string", param, j);
        }
        if (!c || json_is_null(c)) {
            if (strcmp(json_string_value(role), "assistant") != 0)
                return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.content is required", param);
        } else if (json_is_string(c)) {
            kiln_sbuf_put(out, json_string_value(c), json_string_length(c));
        } else if (json_is_array(c)) {
            for (size_t k = 0; k < json_array_size(c); k++) {
                json_t *part = json_array_get(c, k), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text))
                    return kiln_oai_fail(err, 400, "invalid_request_error", "messages", "unsupported_parameter",
                                         "%s.content[%zu]: only {\"type\": \"text\", \"text\": \"...\"} parts are supported", param, k);
                kiln_sbuf_put(out, json_string_value(text), json_string_length(text));
            }
        } else {
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.content must be a string or an array of text parts", param);
        }
        kiln_sbuf_puts(out, "\n");
    }
    if (add_gen) kiln_sbuf_puts(out, "assistant:");
    if (s->has_template) {
        out->len = 0;
        *templated = 1;
        if (!render_model_template(s, messages, tools, kwargs, add_gen, out, err)) return 0;
    }
    return cont ? cut_after_final(messages, out, err) : 1;
}

kiln_status kiln_server_choose_parsers(kiln_server *s, const kiln_server_options *so) {
    char *src = NULL;
    if (s->has_template && kiln_chat_template_source(s->m, 1, &src) != KILN_OK) src = NULL;
    const char *tp = so->tool_parser && *so->tool_parser ? so->tool_parser : "auto";
    const char *rp = so->reasoning_parser && *so->reasoning_parser ? so->reasoning_parser : "auto";
    kiln_status st = KILN_OK;
    if (strcmp(tp, "auto") == 0) s->tool_parser = kiln_tool_parser_for_template(src);
    else if (kiln_tool_parser_from_name(tp, &s->tool_parser) != 0)
        st = kiln_fail(KILN_ERR_INVALID_ARG, "--tool-parser '%s' is not one of auto, glm45, glm47, glm4_moe, kimi_k2, none", tp);
    if (strcmp(rp, "auto") == 0) s->reasoning_parser = kiln_reasoning_parser_for_template(src);
    else if (strcmp(rp, "none") == 0) s->reasoning_parser = KILN_REASONING_NONE;
    else if (strcmp(rp, "think") == 0 || strcmp(rp, "glm45") == 0 || strcmp(rp, "qwen3") == 0) s->reasoning_parser = KILN_REASONING_THINK;
    else if (strcmp(rp, "deepseek_r1") == 0 || strcmp(rp, "kimi_k2") == 0) s->reasoning_parser = KILN_REASONING_R1;
    else if (st == KILN_OK)
        st = kiln_fail(KILN_ERR_INVALID_ARG, "--reasoning-parser '%s' is not one of auto, think, glm45, qwen3, deepseek_r1, kimi_k2, none", rp);
    free(src);
    snprintf(s->parsers_note, sizeof s->parsers_note, "tool calls %s, reasoning %s%s", kiln_tool_parser_name(s->tool_parser),
 s->reasoning_parser == KILN_REASONING_THINK ? "<think>" : s->reasoning_parser == KILN_REASONING_R1 ? "deepseek_r1" : "none", s->has_template ? "" : " (no chat template: both off)");
    return st;
}
