/* responses.c — OpenAI Responses requests translated into chat completions, and the response
 * objects and stream events made from the split output (responses.h). The request follows the
 * Responses API reference: model and input are required; input is a string or a list of items —
 * messages {role: user | system | developer | assistant, content: a string or input_text /
 * output_text parts}, function_call {call_id, name, arguments}, function_call_output {call_id,
 * output}, reasoning {content: reasoning_text parts | summary: summary_text parts}; instructions a
 * string; tools function tools {type: "function", name, description?, parameters?, strict?};
 * tool_choice "auto" | "none" | "required" | {type: "function", name}; text.format text |
 * json_object | json_schema {name, schema, strict?}; reasoning.effort (none / minimal turn the
 * template's thinking off). Errors name the top-level parameter; the message says where inside. */
#include "server/responses.h"
#include "server/chat_output.h"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BAD(param, ...) kiln_oai_fail(err, 400, "invalid_request_error", param, NULL, __VA_ARGS__)

static int is(const json_t *v, const char *s) { return json_is_string(v) && strcmp(json_string_value(v), s) == 0; }

void kiln_resp_init(kiln_resp *x, const char *model) {
    memset(x, 0, sizeof *x);
    memcpy(x->id, "resp_", 5);
    kiln_random_hex(x->id + 5, 16);
    x->created_at = (long long)time(NULL);
    x->model = model;
    x->output = json_array();
}

void kiln_resp_free(kiln_resp *x) {
    json_decref(x->req);
    json_decref(x->output);
    kiln_sbuf_free(&x->open_text);
    x->req = x->output = NULL;
}

/* The text of a message's content: a string, or parts of the given types (input_text / output_text
 * carry "text"); other part types are refused. */
static int content_text(json_t *c, size_t i, kiln_sbuf *out, kiln_oai_error *err) {
    if (json_is_string(c)) { kiln_sbuf_put(out, json_string_value(c), json_string_length(c)); return 1; }
    if (!json_is_array(c)) return BAD("input", "input[%zu].content: expected a string or an array of content parts", i);
    size_t k;
    json_t *p;
    json_array_foreach(c, k, p) {
        json_t *ty = json_object_get(p, "type"), *tx = json_object_get(p, "text");
        if (!(is(ty, "input_text") || is(ty, "output_text") || is(ty, "text")) || !json_is_string(tx))
            return BAD("input", "input[%zu].content[%zu]: only text parts ({\"type\": \"input_text\" or \"output_text\", \"text\": ...}) are supported, got '%.40s'",
                       i, k, json_is_string(ty) ? json_string_value(ty) : "?");
        kiln_sbuf_put(out, json_string_value(tx), json_string_length(tx));
    }
    return 1;
}

static json_t *sbuf_string(const kiln_sbuf *b) { return json_stringn(b->p ? b->p : "", b->len); }

/* The assistant message that function_call items and reasoning attach to: the last message when it
 * is the assistant's, else a new one (content null). */
static json_t *assistant_tail(json_t *msgs) {
    json_t *last = json_array_get(msgs, json_array_size(msgs) - 1);
    if (last && is(json_object_get(last, "role"), "assistant")) return last;
    json_t *a = json_pack("{s:s,s:n}", "role", "assistant", "content");
    json_array_append_new(msgs, a);
    return a;
}

/* One input item → chat messages appended to msgs. pending_reasoning: a reasoning item's text,
 * given to the next assistant message. */
static int convert_item(json_t *it, size_t i, json_t *msgs, kiln_sbuf *pending_reasoning, kiln_oai_error *err) {
    if (!json_is_object(it)) return BAD("input", "input[%zu]: expected an object", i);
    json_t *ty = json_object_get(it, "type"), *role = json_object_get(it, "role");
    if ((!ty || is(ty, "message")) && role) {
        const char *r = json_string_value(role);
        if (!r || (strcmp(r, "user") && strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "assistant")))
            return BAD("input", "input[%zu].role: expected \"user\", \"system\", \"developer\" or \"assistant\"", i);
        kiln_sbuf t = {0};
        if (!content_text(json_object_get(it, "content"), i, &t, err)) { kiln_sbuf_free(&t); return 0; }
        json_t *m = json_pack("{s:s,s:o}", "role", strcmp(r, "developer") == 0 ? "system" : r, "content", sbuf_string(&t));
        kiln_sbuf_free(&t);
        if (strcmp(r, "assistant") == 0 && pending_reasoning->len) {
            json_object_set_new(m, "reasoning_content", sbuf_string(pending_reasoning));
            pending_reasoning->len = 0;
        }
        json_array_append_new(msgs, m);
        return 1;
    }
    if (is(ty, "function_call")) {
        json_t *id = json_object_get(it, "call_id"), *nm = json_object_get(it, "name"), *args = json_object_get(it, "arguments");
        if (!json_is_string(id) || !json_is_string(nm) || !json_is_string(args))
            return BAD("input", "input[%zu]: a function_call item needs string call_id, name and arguments", i);
        json_t *a = assistant_tail(msgs);
        if (pending_reasoning->len) {
            json_object_set_new(a, "reasoning_content", sbuf_string(pending_reasoning));
            pending_reasoning->len = 0;
        }
        json_t *calls = json_object_get(a, "tool_calls");
        if (!calls) {
            calls = json_array();
            json_object_set_new(a, "tool_calls", calls);
        }
        json_array_append_new(calls, json_pack("{s:O,s:s,s:{s:O,s:O}}", "id", id, "type", "function", "function", "name", nm, "arguments", args));
        return 1;
    }
    if (is(ty, "function_call_output")) {
        json_t *id = json_object_get(it, "call_id"), *out = json_object_get(it, "output");
        if (!json_is_string(id)) return BAD("input", "input[%zu].call_id: expected a string", i);
        kiln_sbuf t = {0};
        if (!content_text(out, i, &t, err)) { kiln_sbuf_free(&t); return 0; }
        json_array_append_new(msgs, json_pack("{s:s,s:O,s:o}", "role", "tool", "tool_call_id", id, "content", sbuf_string(&t)));
        kiln_sbuf_free(&t);
        return 1;
    }
    if (is(ty, "reasoning")) { /* its text (content, else the summary) goes to the next assistant turn */
        json_t *parts = json_object_get(it, "content");
        if (!json_is_array(parts) || json_array_size(parts) == 0) parts = json_object_get(it, "summary");
        size_t k;
        json_t *p;
        json_array_foreach(parts, k, p) {
            json_t *tx = json_object_get(p, "text");
            if (json_is_string(tx)) kiln_sbuf_put(pending_reasoning, json_string_value(tx), json_string_length(tx));
        }
        return 1;
    }
    return BAD("input", "input[%zu]: items of type '%.40s' are not supported (message, function_call, function_call_output, reasoning)", i,
               json_is_string(ty) ? json_string_value(ty) : "?");
}

/* Function tools → chat tools. */
static int convert_tools(json_t *tools, json_t *r, kiln_oai_error *err) {
    if (!json_is_array(tools)) return BAD("tools", "'tools' must be an array");
    json_t *ot = json_array(), *t;
    json_object_set_new(r, "tools", ot);
    size_t i;
    json_array_foreach(tools, i, t) {
        json_t *ty = json_object_get(t, "type"), *nm = json_object_get(t, "name"), *pa = json_object_get(t, "parameters"), *de = json_object_get(t, "description");
        if (!is(ty, "function"))
            return BAD("tools", "tools[%zu].type: only function tools are supported, got '%.40s' (built-in tools such as web_search run on OpenAI's servers)", i,
                       json_is_string(ty) ? json_string_value(ty) : "?");
        if (!json_is_string(nm)) return BAD("tools", "tools[%zu].name: a string is required", i);
        if (pa && !json_is_null(pa) && !json_is_object(pa)) return BAD("tools", "tools[%zu].parameters: expected an object", i);
        json_t *f = json_pack("{s:O}", "name", nm);
        if (json_is_object(pa)) json_object_set(f, "parameters", pa);
        if (json_is_string(de)) json_object_set(f, "description", de);
        json_array_append_new(ot, json_pack("{s:s,s:o}", "type", "function", "function", f));
    }
    return 1;
}

/* The body's fields that change nothing here — unknown ones, and those the API defines that kiln
 * accepts without acting on (store, include, truncation, metadata, ...) — into x->ignored, as
 * chat completions list theirs. */
static void note_ignored(json_t *o, kiln_resp *x) {
    static const char *const acted[] = {"model", "input", "instructions", "max_output_tokens", "temperature", "top_p", "stream", "parallel_tool_calls",
                                        "tools", "tool_choice", "text", "reasoning", "previous_response_id", "conversation", "background", "prompt",
                                        "top_k", "min_p", "seed", "presence_penalty", "frequency_penalty", "repetition_penalty", "stop", NULL};
    kiln_oai_list_unknown(o, acted, x->ignored, sizeof x->ignored);
}

int kiln_responses_request(const char *body, size_t len, kiln_resp *x, json_t **out, kiln_oai_error *err) {
    *out = NULL;
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) return BAD(NULL, "the request body is not valid JSON: %s (line %d, column %d)", je.text, je.line, je.column);
    json_t *r = json_object(), *v;
    kiln_sbuf reasoning = {0};
    int ok = 0;
    if (!json_is_object(o)) { BAD(NULL, "the request body must be a JSON object"); goto done; }
    note_ignored(o, x);
    if ((v = json_object_get(o, "model"))) json_object_set(r, "model", v); /* (checked as chat's is) */
    if ((v = json_object_get(o, "previous_response_id")) && !json_is_null(v)) {
        kiln_oai_fail(err, 400, "invalid_request_error", "previous_response_id", "unsupported_parameter",
                      "'previous_response_id' is not supported: this server stores no responses; send the whole conversation in 'input'");
        goto done;
    }
    static const char *const refused[] = {"conversation", "background", "prompt", NULL};
    for (int i = 0; refused[i]; i++)
        if ((v = json_object_get(o, refused[i])) && !json_is_null(v) && !json_is_false(v)) {
            kiln_oai_fail(err, 400, "invalid_request_error", refused[i], "unsupported_parameter", "'%s' is not supported by this server", refused[i]);
            goto done;
        }
    json_t *msgs = json_array();
    json_object_set_new(r, "messages", msgs);
    json_t *ins = json_object_get(o, "instructions");
    if (ins && !json_is_null(ins)) {
        if (!json_is_string(ins)) { BAD("instructions", "'instructions' must be a string"); goto done; }
        json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "system", "content", ins));
    }
    json_t *in = json_object_get(o, "input");
    if (json_is_string(in)) json_array_append_new(msgs, json_pack("{s:s,s:O}", "role", "user", "content", in));
    else if (json_is_array(in)) {
        size_t i;
        json_t *it;
        json_array_foreach(in, i, it) if (!convert_item(it, i, msgs, &reasoning, err)) goto done;
    } else { BAD("input", "'input' is required: a string or an array of input items"); goto done; }
    if (json_array_size(msgs) == 0) { BAD("input", "'input' has no messages"); goto done; }
    /* sampling and length */
    if ((v = json_object_get(o, "max_output_tokens")) && !json_is_null(v)) {
        if (!json_is_integer(v) || json_integer_value(v) < 1) { BAD("max_output_tokens", "'max_output_tokens' must be an integer >= 1"); goto done; }
        json_object_set(r, "max_tokens", v);
    }
    static const char *const same[] = {"temperature", "top_p", "stream", "parallel_tool_calls", "top_k", "min_p", "seed", "presence_penalty",
                                       "frequency_penalty", "repetition_penalty", "stop", NULL};
    for (int i = 0; same[i]; i++)
        if ((v = json_object_get(o, same[i])) && !json_is_null(v)) json_object_set(r, same[i], v);
    if ((v = json_object_get(o, "tools")) && !json_is_null(v) && !convert_tools(v, r, err)) goto done;
    json_t *tc = json_object_get(o, "tool_choice");
    if (tc && !json_is_null(tc)) {
        if (is(tc, "auto") || is(tc, "none") || is(tc, "required")) json_object_set(r, "tool_choice", tc);
        else if (json_is_object(tc) && is(json_object_get(tc, "type"), "function") && json_is_string(json_object_get(tc, "name")))
            json_object_set_new(r, "tool_choice", json_pack("{s:s,s:{s:O}}", "type", "function", "function", "name", json_object_get(tc, "name")));
        else { BAD("tool_choice", "'tool_choice' must be \"auto\", \"none\", \"required\" or {\"type\": \"function\", \"name\": ...}"); goto done; }
    }
    json_t *text = json_object_get(o, "text"), *fmt = json_object_get(text, "format");
    if (fmt && !json_is_null(fmt)) {
        json_t *ft = json_object_get(fmt, "type");
        if (is(ft, "json_schema")) {
            json_t *js = json_pack("{s:O}", "schema", json_object_get(fmt, "schema") ? json_object_get(fmt, "schema") : json_null());
            if (json_object_get(fmt, "name")) json_object_set(js, "name", json_object_get(fmt, "name"));
            if (json_object_get(fmt, "strict")) json_object_set(js, "strict", json_object_get(fmt, "strict"));
            json_object_set_new(r, "response_format", json_pack("{s:s,s:o}", "type", "json_schema", "json_schema", js));
        } else if (is(ft, "json_object") || is(ft, "text"))
            json_object_set_new(r, "response_format", json_pack("{s:O}", "type", ft));
        else { BAD("text", "text.format.type must be \"text\", \"json_object\" or \"json_schema\""); goto done; }
    }
    /* reasoning.effort none / minimal: the template's thinking off (GLM: enable_thinking; DeepSeek / Kimi: thinking) */
    json_t *re = json_object_get(json_object_get(o, "reasoning"), "effort");
    if (json_is_string(re)) {
        const int on = !is(re, "none") && !is(re, "minimal");
        json_object_set_new(r, "chat_template_kwargs", json_pack("{s:b,s:b}", "enable_thinking", on, "thinking", on));
    }
    /* what the response object repeats */
    json_decref(x->req);
    x->req = json_object();
    static const char *const repeated[] = {"instructions", "max_output_tokens", "temperature", "top_p", "tools", "tool_choice", "parallel_tool_calls",
                                           "text", "reasoning", "metadata", "user", NULL};
    for (int i = 0; repeated[i]; i++)
        if ((v = json_object_get(o, repeated[i]))) json_object_set(x->req, repeated[i], v);
    ok = 1;
done:
    json_decref(o);
    kiln_sbuf_free(&reasoning);
    if (ok) *out = r;
    else json_decref(r);
    return ok;
}

/* ---- output ------------------------------------------------------------------------------------------- */
static json_t *new_id(const char *prefix) {
    char id[48];
    const size_t n = strlen(prefix);
    memcpy(id, prefix, n);
    kiln_random_hex(id + n, 16);
    return json_string(id);
}

static json_t *reasoning_item(json_t *id, json_t *text) {
    return json_pack("{s:o,s:s,s:[],s:[{s:s,s:o}]}", "id", id, "type", "reasoning", "summary", "content", "type", "reasoning_text", "text", text);
}

static json_t *message_item(json_t *id, json_t *text, const char *status) {
    return json_pack("{s:o,s:s,s:s,s:s,s:[{s:s,s:o,s:[],s:[]}]}", "id", id, "type", "message", "status", status, "role", "assistant", "content", "type",
                     "output_text", "text", text, "annotations", "logprobs");
}

json_t *kiln_resp_call_item(json_t *call) {
    json_t *f = json_object_get(call, "function");
    const char *cid = json_string_value(json_object_get(call, "id"));
    const char *pre = "chatcmpl-tool-";
    char buf[96];
    /* GLM's parser ids re-prefixed as OpenAI's call ids; Kimi's "functions.NAME:IDX" kept (its
     * template reads it back) */
    if (cid && strncmp(cid, pre, strlen(pre)) == 0) snprintf(buf, sizeof buf, "call_%s", cid + strlen(pre));
    else snprintf(buf, sizeof buf, "%s", cid ? cid : "call_0");
    return json_pack("{s:o,s:s,s:s,s:O,s:O,s:s}", "id", new_id("fc_"), "type", "function_call", "call_id", buf, "name", json_object_get(f, "name"),
                     "arguments", json_object_get(f, "arguments"), "status", "completed");
}

json_t *kiln_resp_items(json_t *reasoning, json_t *content, json_t *calls) {
    json_t *items = json_array();
    if (json_is_string(reasoning) && json_string_length(reasoning)) json_array_append_new(items, reasoning_item(new_id("rs_"), json_incref(reasoning)));
    if ((json_is_string(content) && json_string_length(content)) || json_array_size(calls) == 0)
        json_array_append_new(items, message_item(new_id("msg_"), json_is_string(content) ? json_incref(content) : json_string(""), "completed"));
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) json_array_append_new(items, kiln_resp_call_item(call));
    return items;
}

json_t *kiln_resp_object(const kiln_resp *x, const char *incomplete_reason, json_t *output, json_t *usage) {
    json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:n,s:n,s:s,s:o,s:n,s:b,s:s}", "id", x->id, "object", "response", "created_at", (json_int_t)x->created_at,
                          "status", incomplete_reason ? "incomplete" : "completed", "error", "incomplete_details", "model", x->model, "output", output,
                          "previous_response_id", "store", 0, "truncation", "disabled");
    if (incomplete_reason) json_object_set_new(o, "incomplete_details", json_pack("{s:s}", "reason", incomplete_reason));
    json_object_set_new(o, "usage", usage ? usage : json_null());
    /* the request's own values, with the API's defaults where it gave none */
    json_object_set_new(o, "instructions", json_null());
    json_object_set_new(o, "max_output_tokens", json_null());
    json_object_set_new(o, "temperature", json_real(1));
    json_object_set_new(o, "top_p", json_real(1));
    json_object_set_new(o, "tools", json_array());
    json_object_set_new(o, "tool_choice", json_string("auto"));
    json_object_set_new(o, "parallel_tool_calls", json_true());
    json_object_set_new(o, "text", json_pack("{s:{s:s}}", "format", "type", "text"));
    json_object_set_new(o, "reasoning", json_pack("{s:n,s:n}", "effort", "summary"));
    json_object_set_new(o, "metadata", json_object());
    if (x->req) json_object_update(o, x->req);
    return o;
}

/* ---- streaming ---------------------------------------------------------------------------------------- */
/* One event: "event: TYPE" and its data, with the next sequence_number. */
static void event(kiln_resp *x, const char *type, json_t *j, kiln_sbuf *out) {
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "sequence_number", json_integer((json_int_t)x->seq++));
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    kiln_sbuf_printf(out, "event: %s\ndata: %s\n\n", type, txt ? txt : "{}");
    free(txt);
}

static json_t *in_progress(const kiln_resp *x) {
    json_t *o = kiln_resp_object(x, NULL, json_array(), NULL);
    json_object_set_new(o, "status", json_string("in_progress"));
    return o;
}

void kiln_resp_stream_begin(kiln_resp *x, kiln_sbuf *out) {
    event(x, "response.created", json_pack("{s:o}", "response", in_progress(x)), out);
    event(x, "response.in_progress", json_pack("{s:o}", "response", in_progress(x)), out);
}

static int out_index(const kiln_resp *x) { return (int)json_array_size(x->output); }

/* The open item's text, its done events, and the item into x->output. */
static void close_item(kiln_resp *x, kiln_sbuf *out) {
    if (!x->open_kind) return;
    const int oi = out_index(x);
    json_t *text = json_stringn(x->open_text.p ? x->open_text.p : "", x->open_text.len);
    json_t *item;
    if (x->open_kind == 1) {
        event(x, "response.reasoning_text.done", json_pack("{s:s,s:i,s:i,s:O}", "item_id", x->open_id, "output_index", oi, "content_index", 0, "text", text), out);
        event(x, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:{s:s,s:O}}", "item_id", x->open_id, "output_index", oi, "content_index", 0, "part",
                                                         "type", "reasoning_text", "text", text), out);
        item = reasoning_item(json_string(x->open_id), text);
    } else {
        event(x, "response.output_text.done", json_pack("{s:s,s:i,s:i,s:O,s:[]}", "item_id", x->open_id, "output_index", oi, "content_index", 0, "text", text,
                                                        "logprobs"), out);
        event(x, "response.content_part.done", json_pack("{s:s,s:i,s:i,s:{s:s,s:O,s:[],s:[]}}", "item_id", x->open_id, "output_index", oi, "content_index", 0,
                                                         "part", "type", "output_text", "text", text, "annotations", "logprobs"), out);
        item = message_item(json_string(x->open_id), text, "completed");
    }
    event(x, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", oi, "item", item), out);
    json_array_append_new(x->output, item);
    x->open_kind = 0;
    x->open_text.len = 0;
}

void kiln_resp_stream_text(kiln_resp *x, int kind, const char *p, size_t n, kiln_sbuf *out) {
    if (!n) return;
    if (x->open_kind != kind) close_item(x, out);
    const int oi = out_index(x); /* (the open item joins x->output when it closes) */
    if (x->open_kind != kind) {
        json_t *id = new_id(kind == 1 ? "rs_" : "msg_");
        snprintf(x->open_id, sizeof x->open_id, "%s", json_string_value(id));
        json_t *item = kind == 1 ? json_pack("{s:o,s:s,s:[],s:[]}", "id", id, "type", "reasoning", "summary", "content")
                                 : json_pack("{s:o,s:s,s:s,s:s,s:[]}", "id", id, "type", "message", "status", "in_progress", "role", "assistant", "content");
        event(x, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", oi, "item", item), out);
        json_t *part = kind == 1 ? json_pack("{s:s,s:s}", "type", "reasoning_text", "text", "")
                                 : json_pack("{s:s,s:s,s:[],s:[]}", "type", "output_text", "text", "", "annotations", "logprobs");
        event(x, "response.content_part.added", json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->open_id, "output_index", oi, "content_index", 0, "part", part), out);
        x->open_kind = kind;
    }
    kiln_sbuf_put(&x->open_text, p, n);
    json_t *d = json_pack("{s:s,s:i,s:i,s:o}", "item_id", x->open_id, "output_index", oi, "content_index", 0, "delta", kiln_json_bytes_string(p, n));
    if (kind == 2) json_object_set_new(d, "logprobs", json_array());
    event(x, kind == 1 ? "response.reasoning_text.delta" : "response.output_text.delta", d, out);
}

void kiln_resp_stream_call(kiln_resp *x, json_t *call, kiln_sbuf *out) {
    close_item(x, out);
    const int oi = out_index(x);
    json_t *item = kiln_resp_call_item(call);
    const char *id = json_string_value(json_object_get(item, "id"));
    json_t *added = json_deep_copy(item);
    json_object_set_new(added, "arguments", json_string(""));
    json_object_set_new(added, "status", json_string("in_progress"));
    event(x, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", oi, "item", added), out);
    json_t *args = json_object_get(item, "arguments");
    event(x, "response.function_call_arguments.delta", json_pack("{s:s,s:i,s:O}", "item_id", id, "output_index", oi, "delta", args), out);
    event(x, "response.function_call_arguments.done", json_pack("{s:s,s:i,s:O,s:O}", "item_id", id, "output_index", oi, "arguments", args, "name",
                                                                json_object_get(item, "name")), out);
    event(x, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", oi, "item", item), out);
    json_array_append_new(x->output, item);
}

void kiln_resp_stream_end(kiln_resp *x, const char *incomplete_reason, json_t *usage, kiln_sbuf *out) {
    close_item(x, out);
    if (json_array_size(x->output) == 0) { /* an empty answer is still one (empty) message */
        json_t *item = message_item(new_id("msg_"), json_string(""), "completed");
        json_t *added = json_deep_copy(item);
        json_object_set_new(added, "status", json_string("in_progress"));
        json_array_clear(json_object_get(added, "content"));
        event(x, "response.output_item.added", json_pack("{s:i,s:o}", "output_index", 0, "item", added), out);
        event(x, "response.output_item.done", json_pack("{s:i,s:O}", "output_index", 0, "item", item), out);
        json_array_append_new(x->output, item);
    }
    json_t *o = kiln_resp_object(x, incomplete_reason, json_incref(x->output), usage);
    event(x, incomplete_reason ? "response.incomplete" : "response.completed", json_pack("{s:o}", "response", o), out);
}

void kiln_resp_stream_fail(kiln_resp *x, const kiln_oai_error *e, kiln_sbuf *out) {
    close_item(x, out);
    json_t *o = kiln_resp_object(x, NULL, json_incref(x->output), NULL);
    json_object_set_new(o, "status", json_string("failed"));
    json_object_set_new(o, "error", json_pack("{s:s,s:o}", "code", e->code ? e->code : e->http >= 500 ? "server_error" : "invalid_request",
                                              "message", kiln_json_bytes_string(e->msg, strlen(e->msg))));
    event(x, "response.failed", json_pack("{s:o}", "response", o), out);
}
