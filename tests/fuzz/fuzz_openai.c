/* fuzz_openai — the OpenAI request parser of kiln serve (kiln_oai_parse, src/server/openai.c):
 * JSON body, every parameter's type and range, logit_bias, stop, tools / tool_choice, messages
 * (assistant tool calls included) through the model's chat template (chat_template_kwargs as its
 * variables) or the built-in one, tokenization, context checks. Each input is parsed as a
 * /v1/chat/completions and as a /v1/completions body. The same bytes are then read as model output
 * by the reasoning / tool-call splitter (src/server/chat_output.c) with each parser, whole and in
 * 7-byte pieces: both must give the same content, reasoning and calls; and as an Anthropic Messages
 * body (src/server/anthropic.c) and a Responses body (src/server/responses.c), each translated and
 * parsed as the chat completion it becomes.
 *
 * The model, made once at start: $KILN_FUZZ_MODEL when set; else stories260K from $SHARED
 * (default ../shared) in a private directory beside a small chat_template.jinja (a trained
 * tokenizer and a template, so prompts tokenize and chats render); else a tiny `kiln mkmodel`
 * llama without a tokenizer (token-id prompts only). Input: the request body. */
#include "fuzz_common.h"
#include "server/server_internal.h"
#include "server/chat_output.h"
#include "server/anthropic.h"
#include "server/responses.h"

static kiln_server srv;
static kiln_model *model;

static const char tmpl[] =
    "{{ bos_token }}{% for m in messages %}{% if m.role == 'system' %}<<SYS>>{{ m.content | trim }}<</SYS>>\n"
    "{% elif m.role == 'tool' %}[tool] {{ m.content | tojson }}\n{% else %}{{ m.role | upper }}: {{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<call>{{ c.function.name }}({{ c.function.arguments | tojson }})</call>"
    "{% endfor %}{% endif %}\n{% endif %}{% endfor %}{% if add_generation_prompt %}ASSISTANT:"
    "{% if enable_thinking is defined and not enable_thinking %} /no_think{% endif %}{% endif %}";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    kiln_options o;
    fuzz_options(&o);
    o.max_context = 256;
    int trained;
    const char *path = fuzz_small_model("fuzz_openai", &trained);
    if (trained) fuzz_dir_file("chat_template.jinja", tmpl, sizeof tmpl - 1, 1);
    if (kiln_model_load(path, &o, &model) != KILN_OK) { fprintf(stderr, "fuzz_openai: %s: %s\n", path, kiln_last_error()); abort(); }
    srv.m = model;
    kiln_model_get_info(model, &srv.info);
    kiln_server_options_default(&srv.o);
    snprintf(srv.model_name, sizeof srv.model_name, "kiln");
    kiln_engine_config ec = {.max_batch = 1, .max_queue = 1, .step_tokens = 64, .prefix_cache = 0};
    if (kiln_engine_create(model, &o, &ec, &srv.eng) != KILN_OK) { fprintf(stderr, "fuzz_openai: engine: %s\n", kiln_last_error()); abort(); }
    kiln_server_probe_template(&srv);
    fprintf(stderr, "fuzz_openai: model %s (%s), chat template: %s\n", path, srv.info.arch, srv.template_note);
    return 0;
}

/* The splitter over data as generated text: whole and in pieces, same result. */
static void split_output(const uint8_t *data, size_t size) {
    static const char tools_json[] = "[{\"type\":\"function\",\"function\":{\"name\":\"get\",\"parameters\":{\"type\":\"object\","
                                     "\"properties\":{\"q\":{\"type\":\"string\"}}}}}]";
    json_t *tools = json_loads(tools_json, 0, NULL);
    const kiln_tool_parser tps[3] = {KILN_TOOLS_NONE, KILN_TOOLS_GLM45, KILN_TOOLS_KIMI_K2};
    const kiln_reasoning_parser rps[3] = {KILN_REASONING_NONE, KILN_REASONING_THINK, KILN_REASONING_R1};
    for (int t = 0; t < 3; t++)
        for (int r = 0; r < 3; r++) {
            char *got[2][3] = {{NULL}};
            for (int pass = 0; pass < 2; pass++) {
                kiln_chat_out o;
                kiln_chat_out_init(&o, tps[t], rps[r], (int)(size & 1), tools, NULL, 0);
                kiln_chat_delta d = {0};
                const size_t step = pass ? 7 : size + 1;
                for (size_t i = 0; i <= size; i += step)
                    kiln_chat_out_push(&o, (const char *)data + i, i + step <= size ? step : size - i, i + step > size, &d);
                kiln_chat_delta_free(&d);
                json_t *c = kiln_chat_out_content(&o), *rc = kiln_chat_out_reasoning(&o);
                got[pass][0] = json_dumps(c, JSON_ENCODE_ANY);
                got[pass][1] = rc ? json_dumps(rc, JSON_ENCODE_ANY) : strdup("-");
                json_t *fns = json_array(); /* the calls without their ids (GLM's are random) */
                size_t i;
                json_t *call;
                json_array_foreach(o.calls, i, call) json_array_append(fns, json_object_get(call, "function"));
                got[pass][2] = json_dumps(fns, 0);
                json_decref(fns);
                json_decref(c);
                json_decref(rc);
                kiln_chat_out_free(&o);
            }
            for (int k = 0; k < 3; k++) {
                if (!got[0][k] || !got[1][k]) abort();
                if (strcmp(got[0][k], got[1][k]) != 0) {
                    fprintf(stderr, "split_output: tools %d reasoning %d field %d: whole %s, in pieces %s\n", t, r, k, got[0][k], got[1][k]);
                    abort();
                }
                free(got[0][k]);
                free(got[1][k]);
            }
        }
    json_decref(tools);
}

/* A translated body (taken) parsed as the chat completion it is; a refusal must say why. */
static void parse_translated(json_t *cb) {
    kiln_oai_error err;
    memset(&err, 0, sizeof err);
    char *txt = json_dumps(cb, JSON_COMPACT);
    json_decref(cb);
    if (!txt) abort();
    kiln_oai_params p;
    if (kiln_oai_parse(&srv, txt, strlen(txt), 1, &p, &err)) kiln_oai_params_free(&p);
    else if (err.http < 400 || err.http > 599 || !err.msg[0]) abort();
    free(txt);
}

/* data as an Anthropic Messages body (and a count_tokens one): translated, then parsed as the chat
 * completion it becomes; every refusal says why. */
static void anthropic(const uint8_t *data, size_t size) {
    for (int count = 0; count < 2; count++) {
        json_t *cb = NULL;
        kiln_oai_error err;
        memset(&err, 0, sizeof err);
        if (!kiln_anthropic_request(&srv, (const char *)data, size, count, &cb, &err)) {
            if (err.http < 400 || err.http > 599 || !err.msg[0]) abort();
            json_decref(kiln_anthropic_error_json(&err));
            continue;
        }
        parse_translated(cb);
    }
}

/* data as a Responses body: translated, parsed as the chat completion it becomes, and its response
 * object made from an empty output; every refusal says why. */
static void responses(const uint8_t *data, size_t size) {
    json_t *cb = NULL;
    kiln_oai_error err;
    memset(&err, 0, sizeof err);
    kiln_resp x;
    kiln_resp_init(&x, "kiln");
    if (!kiln_responses_request((const char *)data, size, &x, &cb, &err)) {
        if (err.http < 400 || err.http > 599 || !err.msg[0]) abort();
        kiln_resp_free(&x);
        return;
    }
    parse_translated(cb);
    json_t *o = kiln_resp_object(&x, NULL, kiln_resp_items(NULL, json_null(), NULL), NULL);
    if (!json_is_object(o) || json_array_size(json_object_get(o, "output")) != 1) abort();
    json_decref(o);
    kiln_resp_free(&x);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    split_output(data, size);
    anthropic(data, size);
    responses(data, size);
    for (int chat = 0; chat < 2; chat++) {
        kiln_oai_params p;
        kiln_oai_error err;
        memset(&err, 0, sizeof err);
        if (kiln_oai_parse(&srv, (const char *)data, size, chat, &p, &err)) {
            /* every prompt non-empty, its ids in the vocabulary, its max_tokens (0 only with echo,
             * which still runs one token) within the context; chat has one prompt and no echo */
            if (p.n_prompts < 1 || p.n_prompts > KILN_MAX_PROMPTS || (chat && (p.n_prompts != 1 || p.echo))) abort();
            for (int k = 0; k < p.n_prompts; k++) {
                const kiln_oai_prompt *q = &p.prompts[k];
                const int run_tokens = q->max_tokens > 0 ? q->max_tokens : 1;
                if (q->n < 1 || q->max_tokens < (p.echo ? 0 : 1) || q->n + run_tokens > kiln_engine_context(srv.eng)) abort();
                if (q->echo_text && !p.echo) abort();
                for (int i = 0; i < q->n; i++)
                    if (q->ids[i] < 0 || q->ids[i] >= srv.info.vocab_size) abort();
            }
            if (getenv("FUZZ_DEBUG")) fprintf(stderr, "  %s: ok, %d prompts, the first of %d tokens\n", chat ? "chat" : "completion", p.n_prompts, p.prompts[0].n);
            kiln_oai_params_free(&p);
        } else {
            if (getenv("FUZZ_DEBUG")) fprintf(stderr, "  %s: %d %s\n", chat ? "chat" : "completion", err.http, err.msg);
            if (err.http < 400 || err.http > 599 || !err.msg[0]) abort(); /* a failure always says why */
            json_decref(kiln_oai_error_json(&err));
        }
    }
    return 0;
}
