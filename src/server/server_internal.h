/* server_internal.h — what the server's files share: the server object, OpenAI request parameters
 * and errors, chat rendering and metrics. */
#ifndef KILN_SERVER_INTERNAL_H
#define KILN_SERVER_INTERNAL_H
#include "kiln.h"
#include "engine/scheduler.h"
#include "server/text.h"
#include "server/chat_output.h"
#include <jansson.h>
#include <stdatomic.h>

/* HTTP statuses counted in kiln_requests_total{code=...}; the last slot is "other". */
#define KILN_N_CODES 13
extern const int kiln_counted_codes[KILN_N_CODES];

struct MHD_Daemon;
struct kiln_server {
    kiln_model *m;
    kiln_model_info info;
    kiln_server_options o;
    char model_name[256];
    char *api_key;
    kiln_engine *eng;
    struct MHD_Daemon *d;
    int port, listen_fd_quiesced;
    atomic_int closing;          /* 1 from kiln_server_stop on: new work gets 503 */
    atomic_int in_flight;        /* completions being handled */
    atomic_ullong code_count[KILN_N_CODES];
    atomic_ullong disconnects, stop_strings, timeouts;
    atomic_ullong id_counter;
    double t_start;
    long created;
    int has_template;            /* chat uses the model's template (else the built-in one) */
    kiln_tool_parser tool_parser;          /* --tool-parser, or the template's */
    kiln_reasoning_parser reasoning_parser; /* --reasoning-parser, or the template's */
    char parsers_note[160];      /* for the start-up summary */
    char *cors_origin;           /* --cors-origin; NULL = none */
    int32_t *forced;             /* --test-forced-output's token ids (then an end id); NULL = none */
    int n_forced;
    char template_note[320];     /* for the start-up summary */
    char turn_note[320];         /* end-of-turn tokens the template added to the end ids (start-up summary) */
    /* connection supervision (server.c, "connections"): suspended connections and deadlines */
    double header_to, body_to;   /* resolved header / body deadlines (s) */
    pthread_mutex_t sup_mu;      /* guards everything below and each kiln_sock's deadline */
    pthread_cond_t sup_cv;
    pthread_t sup_th;
    int sup_running, sup_stop;   /* the supervisor thread runs / is asked to exit */
    int no_park;                 /* stopping: nothing may be suspended any more */
    int n_kicked;                /* parked connections with news */
    struct kiln_conn *parked;    /* suspended connections (waiting for the scheduler) */
    struct kiln_sock *socks;     /* every open connection */
    atomic_int open_conns;
    atomic_ullong deadline_closes; /* connections closed at their header / body / send deadline */
};

/* An OpenAI error: HTTP status and the body's error object. */
typedef struct kiln_oai_error {
    int http;
    const char *type;     /* "invalid_request_error", "authentication_error", ... */
    const char *param;    /* NULL = null */
    const char *code;     /* NULL = null */
    char msg[512];
} kiln_oai_error;
int kiln_oai_fail(kiln_oai_error *e, int http, const char *type, const char *param, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 6, 7)));
/* {"error": {...}} as a new JSON object. */
json_t *kiln_oai_error_json(const kiln_oai_error *e);

/* A validated /v1/chat/completions or /v1/completions request. */
/* One prompt of a request (chat: the rendered messages; completions: each of `prompt`'s). */
typedef struct kiln_oai_prompt {
    int32_t *ids;             /* token ids, BOS included when the model has one */
    int n;
    int max_tokens;           /* resolved for this prompt (>= 1; 0 only with echo: the prompt alone) */
    char *echo_text;          /* echo of a string prompt: the string as sent (NULL: the ids' text) */
    size_t echo_len;
} kiln_oai_prompt;

typedef struct kiln_oai_params {
    int chat, stream, include_usage, ignore_eos;
    int n;                    /* choices per prompt (1..KILN_MAX_N) */
    kiln_oai_prompt *prompts; /* [n_prompts]: one for chat; completions take a list (vLLM, OpenAI) */
    int n_prompts;
    kiln_sampling sp;
    char *stops[KILN_MAX_STOPS];
    int n_stops;
    int32_t stop_ids[KILN_MAX_STOP_IDS]; /* stop_token_ids (vLLM's extension): ids that end the choice */
    int n_stop_ids;
    int logprobs;             /* 1 = return logprobs */
    int spec_set, spec_k, spec_ngram, spec_mtp; /* "speculative" given: prompt-lookup (or MTP: spec_mtp) drafts (k 0 = off) */
    int top_logprobs;         /* alternatives per token (0..20) */
    int echo;                 /* completions: the prompt precedes the completion (text and logprobs) */
    int prompt_logprobs;      /* vLLM's prompt_logprobs: -1 none, else the alternatives per prompt position */
    char *chat_echo;          /* chat echo (vLLM): the final assistant message's text, put before the answer's content (NULL: none) */
    size_t chat_echo_len;
    int32_t *bias_ids;        /* logit_bias (sp.logit_bias_ids / sp.logit_bias point here) */
    float *bias_vals;
    /* chat: tools and reasoning (chat_output.h) */
    json_t *tools;            /* the request's "tools" (a reference), NULL when none */
    int tool_choice;          /* KILN_TOOL_CHOICE_* */
    char *tool_name;          /* tool_choice naming a function */
    int tool_json;            /* 1: tool_choice naming a function: the output is its arguments, decoded
                                 under its parameters schema (json_mode / schema), sent as one call;
                                 2: tool_choice "required": the output is [{"name", "arguments"}, ...]
                                 under kiln_jg_compile_tools' grammar, sent as the calls */
    int parallel_tools;       /* parallel_tool_calls (default 1) */
    kiln_tool_parser tool_parser;          /* for this request: NONE when no tools / "none" / no parser */
    kiln_reasoning_parser reasoning;       /* for this request: NONE when thinking is turned off */
    int think_opened;                      /* the rendered prompt ends inside "<think>" */
    int skip_special;                      /* skip_special_tokens (default 1) */
    char ignored[256];                     /* body fields kiln does not know or does not act on, listed
                                              in the X-Kiln-Ignored-Fields response header */
    int json_mode;                         /* response_format: 0 text, 1 json_object, 2 json_schema */
    char *schema;                          /* json_schema: the schema (compact JSON) */
} kiln_oai_params;
enum { KILN_TOOL_CHOICE_AUTO = 0, KILN_TOOL_CHOICE_NONE, KILN_TOOL_CHOICE_REQUIRED, KILN_TOOL_CHOICE_NAMED };
#define KILN_MAX_LOGIT_BIAS 300 /* OpenAI's limit */
#define KILN_MAX_N 16           /* choices per prompt (n) */
#define KILN_MAX_PROMPTS 256    /* prompts of one completions request */

/* The names of o's fields not in known (NULL-terminated), comma-separated into out[cap] (cut at a
 * whole name): what X-Kiln-Ignored-Fields lists. */
void kiln_oai_list_unknown(json_t *o, const char *const *known, char *out, size_t cap);
/* Parses and validates a request body (any failure → 0 with *err filled). */
int kiln_oai_parse(kiln_server *s, const char *body, size_t len, int chat, kiln_oai_params *p, kiln_oai_error *err);
void kiln_oai_params_free(kiln_oai_params *p);

/* Renders chat messages to prompt text (chat.c): the model's own chat template when it has one
 * (*templated = 1: the text holds its special tokens and BOS, encode with add_bos 0 and special
 * tokens parsed), else the built-in plain template (*templated = 0). kwargs: the request's
 * chat_template_kwargs object or NULL; add_gen: add_generation_prompt; cont:
 * continue_final_message (the text ends right after the final message's, for the model to go on). */
int kiln_server_render_chat(kiln_server *s, json_t *messages, json_t *tools, json_t *kwargs, int add_gen, int cont, kiln_sbuf *out, int *templated,
                            kiln_oai_error *err);
/* Sets s's parsers from so (tool_parser / reasoning_parser, "auto" = from the chat template) and
 * the summary note; KILN_ERR_INVALID_ARG naming an unknown parser. */
kiln_status kiln_server_choose_parsers(kiln_server *s, const kiln_server_options *so);
/* At start: whether the model's chat template renders (sets s->has_template, s->template_note). */
void kiln_server_probe_template(kiln_server *s);

/* kiln_json_bytes_string: chat_output.h */
/* The Prometheus text of /metrics (metrics.c). */
void kiln_server_metrics(kiln_server *s, kiln_sbuf *out);
/* The chat page served at GET / (webpage.c): a static HTML document of *len bytes. */
const char *kiln_web_page(size_t *len);
#endif
