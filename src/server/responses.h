/* responses.h — OpenAI's Responses API (POST /v1/responses), the API coding agents speak (vLLM serves
 * it too), on top of the chat-completion machinery as the Anthropic API is (anthropic.h): a request
 * is validated and translated into the equivalent chat completion body (instructions → a system
 * message; input items: messages, function_call → assistant tool_calls, function_call_output → tool
 * messages, reasoning → reasoning_content; tools / tool_choice / text.format / reasoning.effort →
 * tools / tool_choice / response_format / chat_template_kwargs), and the split output
 * (chat_output.h) is answered as Response output items: reasoning, message, function_call — whole,
 * or as the API's typed server-sent events (docs/SERVER.md, "Responses API"). Nothing is stored:
 * previous_response_id is refused, the whole conversation comes in `input`. */
#ifndef KILN_SERVER_RESPONSES_H
#define KILN_SERVER_RESPONSES_H
#include "server/server_internal.h"

/* One response being made: the fields it repeats from the request, and the stream's state. */
typedef struct kiln_resp {
    json_t *req;          /* the request's own values the response object repeats (instructions,
                             max_output_tokens, temperature, top_p, tools, tool_choice,
                             parallel_tool_calls, text, reasoning, metadata, store, ...) */
    char id[40];          /* "resp_" + 32 hex digits */
    long long created_at;
    const char *model;
    long long seq;        /* the next event's sequence_number */
    int open_kind;        /* streaming: the open output item: 0 none, 1 reasoning, 2 message */
    char open_id[40];
    kiln_sbuf open_text;  /* ... and its text so far (its .done events repeat it) */
    json_t *output;       /* output items finished so far */
    char ignored[256];    /* the request's fields that change nothing (X-Kiln-Ignored-Fields) */
} kiln_resp;

/* Translates a Responses body into a chat-completion body (*out, a new reference) and fills x's
 * request fields (x->req). Returns 0 with err (OpenAI's error shape, naming the parameter) on a bad
 * request. */
int kiln_responses_request(const char *body, size_t len, kiln_resp *x, json_t **out, kiln_oai_error *err);
/* A new x for model (id from the OS CSPRNG, created_at now). */
void kiln_resp_init(kiln_resp *x, const char *model);
void kiln_resp_free(kiln_resp *x);

/* The response object: status "completed", or "incomplete" with incomplete_details.reason when
 * incomplete_reason is given ("max_output_tokens"); output and usage are taken (stolen). */
json_t *kiln_resp_object(const kiln_resp *x, const char *incomplete_reason, json_t *output, json_t *usage);
/* The output items of a whole message: its reasoning (a string or NULL), content (a string or
 * null) and calls (chat tool_calls, or NULL). */
json_t *kiln_resp_items(json_t *reasoning, json_t *content, json_t *calls);
/* A function_call output item from a chat tool call {id, function: {name, arguments}}. */
json_t *kiln_resp_call_item(json_t *call);

/* Streaming, into out: response.created and response.in_progress. */
void kiln_resp_stream_begin(kiln_resp *x, kiln_sbuf *out);
/* Generated text of one kind (1 reasoning, 2 message text) as deltas of the open item of that kind
 * (its output_item.added and content_part.added first). */
void kiln_resp_stream_text(kiln_resp *x, int kind, const char *p, size_t n, kiln_sbuf *out);
/* One whole tool call as a function_call item: added, its arguments as one delta, done. */
void kiln_resp_stream_call(kiln_resp *x, json_t *call, kiln_sbuf *out);
/* Closes the open item and ends with response.completed (or response.incomplete); usage taken. */
void kiln_resp_stream_end(kiln_resp *x, const char *incomplete_reason, json_t *usage, kiln_sbuf *out);
/* Ends with response.failed carrying e's code and message. */
void kiln_resp_stream_fail(kiln_resp *x, const kiln_oai_error *e, kiln_sbuf *out);
#endif
