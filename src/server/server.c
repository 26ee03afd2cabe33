/* server.c — the HTTP front end (libmicrohttpd, a bounded pool of epoll threads): routing, API-key
 * check, body limits, connection limits and deadlines, the OpenAI completion handlers (JSON and
 * server-sent events), start-up and graceful shutdown.
 *
 * HTTP threads never touch the model or the KV pool and never block: they parse and validate,
 * create a kiln_req, submit it to the engine (src/engine/scheduler.c) and turn the tokens it
 * publishes into text (streaming detokenizer in text.c) and JSON. A connection whose request has
 * no new output is suspended (MHD_suspend_connection) and parked; the scheduler's notify hook marks
 * it, and the supervisor thread resumes it. The supervisor also resumes every parked connection
 * every 100 ms so its handler can check the socket (a client that went away cancels its request,
 * the scheduler frees its pages on its next step), and closes connections past their absolute
 * header / body / send deadline (shutdown(2) of the socket, which libmicrohttpd then closes). */
#include "kiln_test.h"
#include "server/server_internal.h"
#include "server/anthropic.h"
#include "server/responses.h"
#include "engine/json_grammar.h"
#include "base/status.h"
#include <microhttpd.h>
#include <arpa/inet.h>
#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define KILN_IDLE_TIMEOUT_S 120 /* libmicrohttpd's idle timeout once the headers are in (a slow reader) */
#define KILN_SUP_TICK_MS 100    /* the supervisor's period: parked connections re-check their socket */

const int kiln_counted_codes[KILN_N_CODES] = {200, 400, 401, 404, 405, 408, 413, 429, 500, 503, 504, 507, 0};

void kiln_server_options_default(kiln_server_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->max_batch = 32;
    o->max_queue = 64;
    o->step_tokens = 256;
    o->prefix_cache = 1;
    o->max_body_bytes = 1 << 20;
    o->request_timeout_s = 600;
    o->shutdown_grace_s = 10;
    o->max_connections = 512;
    o->max_conn_per_ip = 64;
    o->header_timeout_s = 30;
    o->body_timeout_s = 60;
    o->http_threads = 4;
}

/* ---- per-connection state -------------------------------------------------------------------------- */
enum { R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS };

/* One choice of a completion (n > 1: one per choice, each its own engine request). */
typedef struct choice {
    kiln_req *r;
    int pi;                   /* its prompt (c->p.prompts[pi]); choice index = pi × n + its place */
    kiln_detok dt;
    int seen;                 /* events of r consumed */
    int32_t prev;             /* previous token (for the piece of the next) */
    int n_out;                /* completion tokens counted */
    const char *finish;       /* "stop" / "length" once known */
    int cancel_sent;          /* we cancelled r (disconnect, stop string, a failed sibling) */
    size_t text_offset;
    int echoed;               /* echo, streaming: the prompt's chunk was sent */
    json_t *lp;               /* non-streaming logprobs accumulator */
    kiln_chat_out co;         /* chat: the reasoning / content / tool-call split of the text */
    int co_on;
    int reasoning_tokens;     /* tokens up to and including the one that closed the reasoning */
    int think_closed;
    char tool_id[48];         /* tool_choice naming a function: the call's id */
    int tool_started;         /* streaming: the call's first delta (id, type, name) was sent */
    kiln_sbuf tool_text;      /* tool_choice "required", streamed: the output until it is whole */
    int n_calls;              /* tool_choice "required": calls read from the output */
} choice;

/* Every open connection (MHD_OPTION_NOTIFY_CONNECTION's socket context), in s->socks. */
typedef struct kiln_sock {
    int fd;
    double deadline;          /* kiln_now() time at which the supervisor closes it (0 = none); under sup_mu */
    struct kiln_sock *prev, *next;
} kiln_sock;

typedef struct kiln_conn conn;
struct kiln_conn {
    kiln_server *s;
    struct MHD_Connection *mc;
    kiln_sock *sk;            /* its socket's deadline (NULL if the socket context was not made) */
    atomic_int refs;          /* the connection's and (when streaming) the response's */
    int in_flight;            /* counted in s->in_flight until freed */
    int waiting;              /* a non-streaming completion is submitted: the handler polls it */
    /* parking (under s->sup_mu) */
    int parked, kick;
    double parked_at;
    conn *pprev, *pnext;
    kiln_sbuf body;
    int too_large;
    /* a completion in progress */
    kiln_oai_params p;
    int have_params;
    choice *ch;               /* [n_ch] n per prompt (allocated with the request's parameters) */
    int n_ch;
    int failed;               /* the request ended in an error (any choice) */
    kiln_oai_error err;
    char id[48];
    long created;
    /* streaming output */
    kiln_sbuf out;
    size_t out_off;
    int stream_started, stream_done;
    /* the Anthropic Messages API (/v1/messages): errors, response and events in its shapes */
    int anthropic;
    int responses;            /* the Responses API (/v1/responses): its objects and events (responses.h) */
    kiln_resp resp;
    int blk_type, blk_index;  /* the open content block while streaming: 0 none, 1 thinking, 2 text */
};

/* ---- connections: parking, kicks, deadlines (the supervisor thread) ------------------------------ */
static void sock_deadline(conn *c, double deadline) {
    if (!c->sk) return;
    pthread_mutex_lock(&c->s->sup_mu);
    c->sk->deadline = deadline;
    pthread_mutex_unlock(&c->s->sup_mu);
}

static void unpark_locked(kiln_server *s, conn *c) { /* under sup_mu */
    if (!c->parked) return;
    if (c->pprev) c->pprev->pnext = c->pnext; else s->parked = c->pnext;
    if (c->pnext) c->pnext->pprev = c->pprev;
    c->pprev = c->pnext = NULL;
    c->parked = 0;
    if (c->kick) s->n_kicked--;
    MHD_resume_connection(c->mc);
}

/* The scheduler's notify hook (scheduler thread, under the request's mu): c has news. */
static void conn_notify(void *arg) {
    conn *c = arg;
    kiln_server *s = c->s;
    pthread_mutex_lock(&s->sup_mu);
    if (!c->kick) {
        c->kick = 1;
        if (c->parked) {
            s->n_kicked++;
            pthread_cond_signal(&s->sup_cv);
        }
    }
    pthread_mutex_unlock(&s->sup_mu);
}

/* From the access handler or the content reader, when there is nothing to do until the scheduler
 * publishes more: suspends the connection and parks it (returns 1; the caller returns at once), or
 * returns 0 when news arrived meanwhile (the caller looks again) or when nothing may be suspended
 * any more (stopping: the caller checks its socket and carries on). */
static int park(conn *c) {
    kiln_server *s = c->s;
    pthread_mutex_lock(&s->sup_mu);
    if (c->kick || s->no_park) {
        c->kick = 0;
        pthread_mutex_unlock(&s->sup_mu);
        return 0;
    }
    MHD_suspend_connection(c->mc);
    c->parked = 1;
    c->parked_at = kiln_now();
    c->pprev = NULL;
    c->pnext = s->parked;
    if (s->parked) s->parked->pprev = c;
    s->parked = c;
    pthread_mutex_unlock(&s->sup_mu);
    return 1;
}

/* Resumes kicked connections at once and every parked one each tick (so it can see a client that
 * went away), and closes connections past their deadline. */
static void *supervisor(void *arg) {
    kiln_server *s = arg;
    double next_tick = kiln_now() + KILN_SUP_TICK_MS / 1000.0;
    pthread_mutex_lock(&s->sup_mu);
    while (!s->sup_stop) {
        if (s->n_kicked == 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += KILN_SUP_TICK_MS / 2 * 1000000L;
            if (ts.tv_nsec >= 1000000000) { ts.tv_sec++; ts.tv_nsec -= 1000000000; }
            pthread_cond_timedwait(&s->sup_cv, &s->sup_mu, &ts);
            if (s->sup_stop) break;
        }
        double now = kiln_now();
        int tick = now >= next_tick;
        if (tick) next_tick = now + KILN_SUP_TICK_MS / 1000.0;
        for (conn *c = s->parked, *nx; c; c = nx) {
            nx = c->pnext;
            if (c->kick || (tick && now - c->parked_at >= KILN_SUP_TICK_MS / 1000.0)) unpark_locked(s, c);
        }
        if (!tick) continue;
        for (kiln_sock *k = s->socks; k; k = k->next)
            if (k->deadline > 0 && now > k->deadline && k->fd >= 0) {
                shutdown(k->fd, SHUT_RDWR); /* libmicrohttpd sees the end of the stream and closes it */
                k->deadline = 0;
                atomic_fetch_add(&s->deadline_closes, 1);
            }
    }
    pthread_mutex_unlock(&s->sup_mu);
    return NULL;
}

/* MHD_OPTION_NOTIFY_CONNECTION: a connection opened (header deadline from now) or closed. */
static void on_connection(void *cls, struct MHD_Connection *mc, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    kiln_server *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        atomic_fetch_add(&s->open_conns, 1);
        kiln_sock *k = calloc(1, sizeof *k);
        *socket_context = k;
        if (!k) return;
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->fd = ci ? ci->connect_fd : -1;
        pthread_mutex_lock(&s->sup_mu);
        k->deadline = kiln_now() + s->header_to;
        k->next = s->socks;
        if (s->socks) s->socks->prev = k;
        s->socks = k;
        pthread_mutex_unlock(&s->sup_mu);
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
        atomic_fetch_sub(&s->open_conns, 1);
        kiln_sock *k = *socket_context;
        *socket_context = NULL;
        if (!k) return;
        pthread_mutex_lock(&s->sup_mu);
        if (k->prev) k->prev->next = k->next; else s->socks = k->next;
        if (k->next) k->next->prev = k->prev;
        pthread_mutex_unlock(&s->sup_mu);
        free(k);
    }
}

/* Cancels every choice's request not cancelled yet (a failed sibling, a disconnect). */
static void cancel_all(conn *c) {
    for (int i = 0; i < c->n_ch; i++)
        if (c->ch[i].r && !c->ch[i].cancel_sent) {
            kiln_engine_cancel(c->s->eng, c->ch[i].r);
            c->ch[i].cancel_sent = 1;
        }
}

static void conn_unref(conn *c) {
    if (atomic_fetch_sub(&c->refs, 1) != 1) return;
    int gone = 0;
    pthread_mutex_lock(&c->s->sup_mu);
    if (c->parked) { /* only when libmicrohttpd closes a suspended connection itself */
        if (c->pprev) c->pprev->pnext = c->pnext; else c->s->parked = c->pnext;
        if (c->pnext) c->pnext->pprev = c->pprev;
        if (c->kick) c->s->n_kicked--;
        c->parked = 0;
    }
    pthread_mutex_unlock(&c->s->sup_mu);
    for (int i = 0; i < c->n_ch; i++) {
        choice *h = &c->ch[i];
        if (h->r) {
            if (c->s->eng) {
                pthread_mutex_lock(&h->r->mu);
                h->r->notify = NULL; /* the scheduler may hold r longer than c lives */
                h->r->notify_arg = NULL;
                int running = h->r->finish == KILN_FINISH_NONE;
                pthread_mutex_unlock(&h->r->mu);
                /* the connection ended before the request: the client went away mid-response */
                if (running && !h->cancel_sent) {
                    kiln_engine_cancel(c->s->eng, h->r);
                    gone = 1;
                }
            }
            kiln_req_unref(h->r);
        }
        kiln_detok_free(&h->dt);
        json_decref(h->lp);
        if (h->co_on) kiln_chat_out_free(&h->co);
        kiln_sbuf_free(&h->tool_text);
    }
    free(c->ch);
    kiln_resp_free(&c->resp);
    if (gone) atomic_fetch_add(&c->s->disconnects, 1);
    if (c->in_flight) atomic_fetch_sub(&c->s->in_flight, 1);
    if (c->have_params) kiln_oai_params_free(&c->p);
    kiln_sbuf_free(&c->body);
    kiln_sbuf_free(&c->out);
    free(c);
}

static void count_code(kiln_server *s, int code) {
    int i = 0;
    while (i < KILN_N_CODES - 1 && kiln_counted_codes[i] != code) i++;
    atomic_fetch_add(&s->code_count[i], 1);
}

/* ---- responses -------------------------------------------------------------------------------------- */
/* CORS (--cors-origin): the allowed origin on every response to a request that sent Origin. */
static void add_cors(conn *c, struct MHD_Response *resp) {
    const char *allow = c->s->cors_origin;
    if (!allow) return;
    const char *origin = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Origin");
    if (!origin) return;
    if (strcmp(allow, "*") == 0) MHD_add_response_header(resp, "Access-Control-Allow-Origin", "*");
    else if (strcmp(allow, origin) == 0) MHD_add_response_header(resp, "Access-Control-Allow-Origin", origin);
    else return;
    MHD_add_response_header(resp, "Vary", "Origin");
    MHD_add_response_header(resp, "Access-Control-Expose-Headers", "X-Kiln-Ignored-Fields");
}

/* X-Kiln-Ignored-Fields: the body fields the request's answer does not act on (openai.c). */
static void add_ignored(conn *c, struct MHD_Response *resp) {
    if (c->have_params && c->p.ignored[0]) MHD_add_response_header(resp, "X-Kiln-Ignored-Fields", c->p.ignored);
}

static enum MHD_Result send_buf(conn *c, int code, const char *ctype, const char *data, size_t n, int retry_after) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(n, (void *)data, MHD_RESPMEM_MUST_COPY);
    if (!resp) return MHD_NO;
    add_cors(c, resp);
    add_ignored(c, resp);
    MHD_add_response_header(resp, "Content-Type", ctype);
    if (retry_after > 0) {
        char v[16];
        snprintf(v, sizeof v, "%d", retry_after);
        MHD_add_response_header(resp, "Retry-After", v);
    }
    if (code == 401) MHD_add_response_header(resp, "WWW-Authenticate", "Bearer");
    enum MHD_Result ret = MHD_queue_response(c->mc, (unsigned)code, resp);
    MHD_destroy_response(resp);
    count_code(c->s, code);
    return ret;
}

static enum MHD_Result send_json(conn *c, int code, json_t *j, int retry_after) {
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!txt) return send_buf(c, 500, "text/plain", "out of memory\n", 14, 0);
    enum MHD_Result r = send_buf(c, code, "application/json", txt, strlen(txt), retry_after);
    free(txt);
    return r;
}

static enum MHD_Result send_error(conn *c, const kiln_oai_error *e) {
    return send_json(c, e->http, c->anthropic ? kiln_anthropic_error_json(e) : kiln_oai_error_json(e), e->http == 429 ? 1 : 0);
}

static enum MHD_Result fail(conn *c, int http, const char *type, const char *param, const char *code, const char *msg) {
    kiln_oai_error e;
    kiln_oai_fail(&e, http, type, param, code, "%s", msg);
    return send_error(c, &e);
}

/* ---- the client's socket ------------------------------------------------------------------------------- */
/* 1 when the peer has closed or reset the connection (without consuming anything it sent). */
static int client_gone(conn *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c->mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return 0;
    int fd = ci->connect_fd;
    struct pollfd pf = {fd, POLLIN | POLLRDHUP, 0};
    if (poll(&pf, 1, 0) <= 0) return 0;
    if (pf.revents & (POLLHUP | POLLERR | POLLRDHUP)) return 1;
    char b;
    ssize_t k = recv(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* 1 when some unfinished choice has events past its `seen` or has finished (or none is unfinished):
 * there is something to consume. */
static int has_news(conn *c) {
    int open = 0;
    for (int i = 0; i < c->n_ch; i++) {
        choice *h = &c->ch[i];
        if (h->finish) continue;
        open = 1;
        pthread_mutex_lock(&h->r->mu);
        int news = h->r->n_ev != h->seen || h->r->finish != KILN_FINISH_NONE;
        pthread_mutex_unlock(&h->r->mu);
        if (news) return 1;
    }
    return !open;
}

/* Nothing to consume: -1 when the client disconnected (every choice is cancelled), else 0. */
static int check_gone(conn *c) {
    if (!client_gone(c)) return 0;
    cancel_all(c);
    atomic_fetch_add(&c->s->disconnects, 1);
    return -1;
}

/* ---- generation: events → text, logprobs, finish ----------------------------------------------------------- */
static json_t *bytes_array(const char *p, size_t n) {
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

static const char *piece_of(conn *c, int32_t prev, int32_t id, size_t *len, char *tmp, size_t tmp_len) {
    if (!c->s->info.has_tokenizer) { /* token-id models: each token reads as its id and a space */
        int k = snprintf(tmp, tmp_len, "%d ", id);
        *len = (size_t)k;
        return tmp;
    }
    const char *p = kiln_token_piece(c->s->m, prev, id, len);
    if (!p) { *len = 0; return ""; }
    return p;
}

/* skip_special_tokens: whether token id's piece (len bytes) adds no text, being a special token. */
static int skipped_special(conn *c, int32_t id, size_t len) {
    return len && c->p.skip_special && c->s->info.has_tokenizer && kiln_tokenizer_is_special(kiln_model_tokenizer(c->s->m), id);
}

/* Completions' top_logprobs entry: {piece: logprob} of the K alternatives ids / lps (their pieces
 * as they read after prev; ids whose pieces coincide share one key, as OpenAI's do). */
static json_t *top_object(conn *c, int32_t prev, const int32_t *ids, const float *lps, int K) {
    json_t *tops = json_object();
    for (int i = 0; i < K; i++) {
        size_t l;
        char tmp[32];
        const char *pp = piece_of(c, prev, ids[i], &l, tmp, sizeof tmp);
        json_t *key = kiln_json_bytes_string(pp, l);
        json_object_set_new(tops, json_string_value(key), json_real(lps[i]));
        json_decref(key);
    }
    return tops;
}

/* The logprobs entry of choice h's event k (chat: one element of "content"; completions: appended
 * to the four parallel arrays of lpobj). */
static void logprob_entry(conn *c, choice *h, int k, const char *piece, size_t plen, json_t *dst) {
    kiln_req *r = h->r;
    int K = c->p.top_logprobs;
    double lp = r->ev[k].logprob;
    json_t *lpv = isfinite(lp) ? json_real(lp) : json_real(-9999.0);
    if (c->p.chat) {
        json_t *e = json_object();
        json_object_set_new(e, "token", kiln_json_bytes_string(piece, plen));
        json_object_set_new(e, "logprob", lpv);
        json_object_set_new(e, "bytes", bytes_array(piece, plen));
        json_t *tops = json_array();
        for (int i = 0; i < K; i++) {
            int32_t id = r->top_ids[(size_t)k * K + i];
            size_t l;
            char tmp[32];
            const char *pp = piece_of(c, h->prev, id, &l, tmp, sizeof tmp);
            json_t *t = json_object();
            json_object_set_new(t, "token", kiln_json_bytes_string(pp, l));
            json_object_set_new(t, "logprob", json_real(r->top_lp[(size_t)k * K + i]));
            json_object_set_new(t, "bytes", bytes_array(pp, l));
            json_array_append_new(tops, t);
        }
        json_object_set_new(e, "top_logprobs", tops);
        json_array_append_new(json_object_get(dst, "content"), e);
    } else {
        json_array_append_new(json_object_get(dst, "tokens"), kiln_json_bytes_string(piece, plen));
        json_array_append_new(json_object_get(dst, "token_logprobs"), lpv);
        json_array_append_new(json_object_get(dst, "top_logprobs"),
                              top_object(c, h->prev, K ? r->top_ids + (size_t)k * K : NULL, K ? r->top_lp + (size_t)k * K : NULL, K));
        json_array_append_new(json_object_get(dst, "text_offset"), json_integer((json_int_t)h->text_offset));
    }
}

static json_t *new_logprobs(int chat) {
    if (chat) return json_pack("{s:[],s:n}", "content", "refusal");
    return json_pack("{s:[],s:[],s:[],s:[]}", "tokens", "token_logprobs", "top_logprobs", "text_offset");
}

/* Consumes one event of choice h: its text goes into the detokenizer, its logprobs into lp_dst.
 * Returns 1 when the choice is over from the client's point of view (a stop string matched). */
static int consume_event(conn *c, choice *h, int k, json_t *lp_dst) {
    kiln_req *r = h->r;
    int32_t id = r->ev[k].id;
    size_t len = 0;
    char tmp[32];
    const char *piece = "";
    int eos = kiln_model_is_eos(&c->s->info, id) && !c->p.ignore_eos;
    for (int i = 0; i < c->p.n_stop_ids; i++) eos |= c->p.stop_ids[i] == id;
    if (!eos) piece = piece_of(c, h->prev, id, &len, tmp, sizeof tmp);
    /* skip_special_tokens: special tokens add no text, except the markers an active parser reads */
    if (!eos && skipped_special(c, id, len) && !(h->co_on && kiln_chat_marker(piece, len))) len = 0;
    if (c->p.logprobs && lp_dst) logprob_entry(c, h, k, piece, len, lp_dst);
    h->text_offset += len;
    h->prev = id;
    h->n_out++;
    h->seen = k + 1;
    const int stopped = kiln_detok_push(&h->dt, piece, len);
    if (h->co_on && h->co.reasoning != KILN_REASONING_NONE && !h->think_closed) {
        h->reasoning_tokens++; /* this token is (part of) the reasoning, or closes it */
        const size_t tl = h->dt.text.len, look = len + 8 < tl ? len + 8 : tl;
        if (look && memmem(h->dt.text.p + tl - look, look, "</think>", 8)) h->think_closed = 1;
    }
    if (stopped) {
        h->finish = "stop";
        atomic_fetch_add(&c->s->stop_strings, 1);
        h->cancel_sent = 1;
        kiln_engine_cancel(c->s->eng, r); /* frees the pages now; later tokens are not wanted */
        return 1;
    }
    return 0;
}

/* After all of h's events are consumed: how it ended. Returns 1 if it is over (c->failed when it
 * failed: the whole request fails then). */
static int check_finish(conn *c, choice *h) {
    kiln_req *r = h->r;
    if (h->finish) return 1;
    pthread_mutex_lock(&r->mu);
    kiln_finish f = r->n_ev == h->seen ? r->finish : KILN_FINISH_NONE;
    int timed_out = r->timed_out;
    kiln_status err = r->err;
    char msg[256];
    snprintf(msg, sizeof msg, "%s", r->err_msg);
    pthread_mutex_unlock(&r->mu);
    switch (f) {
    case KILN_FINISH_NONE: return 0;
    case KILN_FINISH_STOP: h->finish = "stop"; return 1;
    case KILN_FINISH_LENGTH: h->finish = "length"; return 1;
    case KILN_FINISH_CANCELLED:
    case KILN_FINISH_ERROR:
        c->failed = 1;
        if (timed_out) {
            atomic_fetch_add(&c->s->timeouts, 1);
            kiln_oai_fail(&c->err, 504, "timeout_error", NULL, "timeout", "the request did not finish within %g s", c->s->o.request_timeout_s);
        } else if (atomic_load(&c->s->closing))
            kiln_oai_fail(&c->err, 503, "server_error", NULL, "server_shutting_down", "the server is shutting down");
        else if (err == KILN_ERR_INTEGRITY)
            kiln_oai_fail(&c->err, 500, "server_error", NULL, "kv_integrity", "%s", msg);
        else
            kiln_oai_fail(&c->err, 500, "server_error", NULL, NULL, "generation failed: %s", msg[0] ? msg : "cancelled");
        return 1;
    }
    return 1;
}

/* echo: whether choice h's prompt part of the output can be made — always without logprobs; with
 * them once its prompt's first choice (the one request that scores the prompt) has recorded them
 * (1), or -1 when that one ended without (an error or a cancellation, which its own drain reports);
 * 0 = not yet. */
/* The request of prompt pi's first choice: the one that scores the prompt and whose cache hits count. */
static kiln_req *prompt_req(conn *c, int pi) { return c->ch[pi * c->p.n].r; }

/* Prompt tokens r read from the prefix cache (0 before admission). */
static int cached_of(kiln_req *r) {
    pthread_mutex_lock(&r->mu);
    const int n = r->cached_tokens > 0 ? r->cached_tokens : 0;
    pthread_mutex_unlock(&r->mu);
    return n;
}

static int echo_state(conn *c, const choice *h) {
    if (!c->p.logprobs) return 1;
    kiln_req *r = prompt_req(c, h->pi);
    pthread_mutex_lock(&r->mu);
    const int st = r->plp_done ? 1 : r->finish != KILN_FINISH_NONE ? -1 : 0;
    pthread_mutex_unlock(&r->mu);
    return st;
}

/* echo: the prompt's text into *text (verbatim when it came as a string, else its tokens' text,
 * special tokens skipped as in the output) and, when lp is given, its tokens' logprobs entries
 * appended to lp's arrays (OpenAI's legacy shape: the first token's logprob and alternatives null;
 * every other one's under the model's raw logits, vLLM's prompt_logprobs, with the request's
 * number of alternatives). text_offset counts the tokens' bytes from 0. Needs echo_state(c) == 1. */
static void echo_prompt(conn *c, int pi, kiln_sbuf *text, json_t *lp) {
    const kiln_oai_prompt *q = &c->p.prompts[pi];
    const kiln_req *r = prompt_req(c, pi);
    const int K = c->p.top_logprobs, stride = r->prompt_logprobs; /* (the request may hold more alternatives, for prompt_logprobs) */
    size_t off = 0;
    for (int i = 0; i < q->n; i++) {
        const int32_t id = q->ids[i];
        size_t len;
        char tmp[32];
        const char *piece = piece_of(c, i ? q->ids[i - 1] : -1, id, &len, tmp, sizeof tmp);
        if (skipped_special(c, id, len)) len = 0;
        if (!q->echo_text) kiln_sbuf_put(text, piece, len);
        if (!lp) continue;
        json_array_append_new(json_object_get(lp, "tokens"), kiln_json_bytes_string(piece, len));
        json_array_append_new(json_object_get(lp, "text_offset"), json_integer((json_int_t)off));
        off += len;
        if (i == 0) {
            json_array_append_new(json_object_get(lp, "token_logprobs"), json_null());
            json_array_append_new(json_object_get(lp, "top_logprobs"), json_null());
            continue;
        }
        const double v = r->plp[i];
        json_array_append_new(json_object_get(lp, "token_logprobs"), json_real(isfinite(v) ? v : -9999.0));
        json_array_append_new(json_object_get(lp, "top_logprobs"),
                              top_object(c, q->ids[i - 1], K ? r->ptop_ids + (size_t)i * stride : NULL, K ? r->ptop_lp + (size_t)i * stride : NULL, K));
    }
    if (q->echo_text) kiln_sbuf_put(text, q->echo_text, q->echo_len);
}

/* vLLM's prompt_logprobs of prompt pi: [null, {"ID": {"logprob", "rank", "decoded_token"}}, ...] —
 * at each position after the first, the prompt's token (its rank among the vocabulary) and the
 * prompt_logprobs most likely ones (ranks 1, 2, ...), one entry per id. */
static json_t *prompt_logprobs_json(conn *c, int pi) {
    const kiln_oai_prompt *q = &c->p.prompts[pi];
    const kiln_req *r = prompt_req(c, pi);
    const int K = c->p.prompt_logprobs, stride = r->prompt_logprobs;
    json_t *a = json_array();
    json_array_append_new(a, json_null());
    for (int i = 1; i < q->n; i++) {
        json_t *d = json_object();
        for (int k = -1; k < K; k++) {
            const int32_t id = k < 0 ? q->ids[i] : r->ptop_ids[(size_t)i * stride + k];
            const double lp = k < 0 ? r->plp[i] : r->ptop_lp[(size_t)i * stride + k];
            char key[16], tmp[32];
            snprintf(key, sizeof key, "%d", id);
            if (json_object_get(d, key)) continue;
            size_t l;
            const char *pp = piece_of(c, q->ids[i - 1], id, &l, tmp, sizeof tmp);
            json_object_set_new(d, key, json_pack("{s:f,s:i,s:o}", "logprob", isfinite(lp) ? lp : -9999.0, "rank", k < 0 ? r->prank[i] : k + 1,
                                                  "decoded_token", kiln_json_bytes_string(pp, l)));
        }
        json_array_append_new(a, d);
    }
    return a;
}

/* The byte length of echo_prompt's text. */
static size_t echo_text_len(conn *c, int pi) {
    kiln_sbuf t = {0};
    echo_prompt(c, pi, &t, NULL);
    const size_t n = t.len;
    kiln_sbuf_free(&t);
    return n;
}

/* Consumes what choice h has now (each event's logprobs into lp_for(k), or h->lp when lp_for is
 * NULL; each event's released text handed to emit when given). Returns 1 when h is over. */
static int drain_choice(conn *c, choice *h, void (*emit)(conn *, int, choice *, json_t *)) {
    pthread_mutex_lock(&h->r->mu);
    int n = h->r->n_ev;
    pthread_mutex_unlock(&h->r->mu);
    if (c->p.prompts[h->pi].max_tokens == 0 && n > 0) { /* echo alone: the engine's one token is not part of the output */
        h->seen = n;
        h->finish = "length";
        return 1;
    }
    int over = 0;
    for (int k = h->seen; k < n && !over; k++) {
        if (!emit) { over = consume_event(c, h, k, h->lp); continue; }
        json_t *lp = c->p.logprobs ? new_logprobs(c->p.chat) : NULL;
        over = consume_event(c, h, k, lp);
        emit(c, (int)(h - c->ch), h, lp);
    }
    return over || check_finish(c, h);
}

/* usage: the prompt counted once, completion tokens summed over the choices (OpenAI); cached
 * tokens are those of the first choice's prompt. */
static json_t *usage_json(conn *c) {
    int cached = 0, out = 0, in = 0;
    for (int k = 0; k < c->p.n_prompts; k++) { /* each prompt once (its first choice's cache hits) */
        cached += cached_of(prompt_req(c, k));
        in += c->p.prompts[k].n;
    }
    int reasoning = 0;
    for (int i = 0; i < c->n_ch; i++) { /* counted while no "</think>" was seen; 0 when the output had no reasoning */
        out += c->ch[i].n_out;
        if (c->ch[i].co_on && c->ch[i].co.saw_reasoning) reasoning += c->ch[i].reasoning_tokens;
    }
    return json_pack("{s:i,s:i,s:i,s:{s:i},s:{s:i}}", "prompt_tokens", in, "completion_tokens", out, "total_tokens",
                     in + out, "prompt_tokens_details", "cached_tokens", cached, "completion_tokens_details",
                     "reasoning_tokens", reasoning);
}

/* tool_choice "required": the output [{"name", "arguments"}, ...] (whole, as the grammar made it)
 * as OpenAI tool_calls with CSPRNG ids; NULL when it is not (cut short by max_tokens). */
static json_t *required_calls(choice *h, const char *text, size_t n) {
    json_error_t je;
    json_t *arr = json_loadb(text, n, 0, &je), *calls = NULL;
    if (json_is_array(arr) && json_array_size(arr) > 0) {
        calls = json_array();
        size_t i;
        json_t *e;
        json_array_foreach(arr, i, e) {
            char id[48];
            memcpy(id, "chatcmpl-tool-", 14);
            kiln_random_hex(id + 14, 16);
            char *args = json_dumps(json_object_get(e, "arguments"), JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
            json_array_append_new(calls, json_pack("{s:i,s:s,s:s,s:{s:s,s:s}}", "index", (int)i, "id", id, "type", "function", "function", "name",
                                                   json_string_value(json_object_get(e, "name")), "arguments", args ? args : "{}"));
            free(args);
        }
        h->n_calls = (int)json_array_size(calls);
    }
    json_decref(arr);
    return calls;
}

/* The calls of a request whose tool_choice forced them (tool_json): the named function's one call
 * with the output as its arguments, or "required"'s list; NULL when the output is not whole. */
static json_t *forced_calls(conn *c, choice *h, const char *text, size_t n) {
    if (c->p.tool_json == 2) return required_calls(h, text, n);
    json_error_t je;
    json_t *v = json_loadb(text, n, 0, &je);
    const int whole = json_is_object(v);
    json_decref(v);
    if (!whole) return NULL;
    h->n_calls = 1;
    return json_pack("[{s:s,s:s,s:{s:s,s:o}}]", "id", h->tool_id, "type", "function", "function", "name", c->p.tool_name, "arguments",
                     kiln_json_bytes_string(text, n));
}

/* finish_reason of choice h: "tool_calls" when calls were parsed, unless tool_choice named the
 * function (vLLM answers those "stop"). */
static const char *finish_of(conn *c, choice *h) {
    if (h->co_on && json_array_size(h->co.calls) > 0 && c->p.tool_choice != KILN_TOOL_CHOICE_NAMED) return "tool_calls";
    if (c->p.tool_json == 2 && h->n_calls > 0) return "tool_calls";
    return h->finish;
}

static json_t *envelope(conn *c, const char *object) {
    return json_pack("{s:s,s:s,s:I,s:s,s:s}", "id", c->id, "object", object, "created", (json_int_t)c->created, "model",
                     c->s->model_name, "system_fingerprint", "kiln");
}

/* ---- the Anthropic Messages shapes ------------------------------------------------------------------------------ */
/* stop_reason (and stop_sequence) of choice h: tool_use when calls were parsed, max_tokens,
 * stop_sequence with the matched string, else end_turn. */
static const char *anthropic_stop(conn *c, choice *h, json_t **seq) {
    *seq = json_null();
    if (h->co_on && json_array_size(h->co.calls) > 0) return "tool_use";
    if (h->finish && strcmp(h->finish, "length") == 0) return "max_tokens";
    if (h->dt.stopped && h->dt.stop_index < c->p.n_stops) {
        json_decref(*seq);
        *seq = json_string(c->p.stops[h->dt.stop_index]);
        return "stop_sequence";
    }
    return "end_turn";
}

static json_t *anthropic_tool_use(json_t *call) {
    json_t *f = json_object_get(call, "function");
    char *id = kiln_anthropic_tool_id(json_string_value(json_object_get(call, "id")));
    json_t *b = json_pack("{s:s,s:s,s:O,s:o}", "type", "tool_use", "id", id ? id : "toolu_0", "name", json_object_get(f, "name"), "input",
                          kiln_anthropic_tool_input(json_string_value(json_object_get(f, "arguments"))));
    free(id);
    return b;
}

/* usage: input_tokens excludes the prompt tokens read from the prefix cache (Anthropic counts
 * those as cache_read_input_tokens). */
static json_t *anthropic_usage(conn *c, int with_input) {
    const int cached = cached_of(c->ch[0].r);
    if (!with_input) return json_pack("{s:i}", "output_tokens", c->ch[0].n_out);
    return json_pack("{s:i,s:i,s:i,s:i}", "input_tokens", c->p.prompts[0].n - cached, "output_tokens", c->ch[0].n_out, "cache_read_input_tokens", cached,
                     "cache_creation_input_tokens", 0);
}

static json_t *anthropic_message(conn *c, json_t *content, const char *stop, json_t *seq) {
    json_t *m = json_pack("{s:s,s:s,s:s,s:s,s:o,s:o}", "id", c->id, "type", "message", "role", "assistant", "model", c->s->model_name, "content",
                          content, "stop_sequence", seq);
    json_object_set_new(m, "stop_reason", stop ? json_string(stop) : json_null());
    json_object_set_new(m, "usage", anthropic_usage(c, 1));
    return m;
}

/* The whole message of choice 0 after its final push: thinking, text and tool_use blocks. */
static json_t *anthropic_response(conn *c) {
    choice *h = &c->ch[0];
    json_t *blocks = json_array();
    json_t *rc = kiln_chat_out_reasoning(&h->co), *ct = kiln_chat_out_content(&h->co);
    if (rc && json_string_length(rc))
        json_array_append_new(blocks, json_pack("{s:s,s:O,s:s}", "type", "thinking", "thinking", rc, "signature", ""));
    if (json_is_string(ct) && json_string_length(ct)) json_array_append_new(blocks, json_pack("{s:s,s:O}", "type", "text", "text", ct));
    json_decref(rc);
    json_decref(ct);
    size_t i;
    json_t *call;
    json_array_foreach(h->co.calls, i, call) json_array_append_new(blocks, anthropic_tool_use(call));
    json_t *seq;
    const char *stop = anthropic_stop(c, h, &seq);
    return anthropic_message(c, blocks, stop, seq);
}

/* ---- the Responses shapes (responses.h) --------------------------------------------------------------------- */
/* usage: input tokens (those read from the prefix cache in input_tokens_details), output tokens
 * (the reasoning ones in output_tokens_details). */
static json_t *responses_usage(conn *c) {
    choice *h = &c->ch[0];
    const int cached = cached_of(h->r);
    const int in = c->p.prompts[0].n, reasoning = h->co_on && h->co.saw_reasoning ? h->reasoning_tokens : 0;
    return json_pack("{s:i,s:{s:i},s:i,s:{s:i},s:i}", "input_tokens", in, "input_tokens_details", "cached_tokens", cached, "output_tokens", h->n_out,
                     "output_tokens_details", "reasoning_tokens", reasoning, "total_tokens", in + h->n_out);
}

/* incomplete_details.reason, or NULL when the response is complete. */
static const char *responses_incomplete(choice *h) { return h->finish && strcmp(h->finish, "length") == 0 ? "max_output_tokens" : NULL; }

/* The whole response of choice 0 after its final push: reasoning, message and function_call items. */
static json_t *responses_object(conn *c) {
    choice *h = &c->ch[0];
    json_t *rc = kiln_chat_out_reasoning(&h->co), *ct = kiln_chat_out_content(&h->co);
    json_t *items = kiln_resp_items(rc, ct, h->co.calls);
    json_decref(rc);
    json_decref(ct);
    return kiln_resp_object(&c->resp, responses_incomplete(h), items, responses_usage(c));
}

/* ---- non-streaming ------------------------------------------------------------------------------------------- */
/* A non-streaming completion, from the access handler (again after each resume): consumes what
 * the choices have, parks the connection until there is more, answers once every choice is over. */
static enum MHD_Result run_blocking(conn *c) {
    for (;;) {
        if (!has_news(c)) {
            if (check_gone(c) < 0) return MHD_NO; /* the client is gone: close */
            if (park(c)) return MHD_YES;
            continue;
        }
        int all = 1;
        for (int i = 0; i < c->n_ch && !c->failed; i++)
            if (!c->ch[i].finish && !drain_choice(c, &c->ch[i], NULL)) all = 0;
        if (c->failed) { cancel_all(c); break; }
        if (all) break;
    }
    c->waiting = 0;
    if (c->failed) return send_error(c, &c->err);
    if (c->anthropic || c->responses) {
        kiln_sbuf text = {0};
        kiln_detok_take(&c->ch[0].dt, 1, &text);
        json_t *calls = c->p.tool_json ? forced_calls(c, &c->ch[0], text.p ? text.p : "", text.len) : NULL;
        if (calls) { /* tool_choice any / tool: the grammar's calls are the message */
            json_array_extend(c->ch[0].co.calls, calls);
            json_decref(calls);
        } else {
            kiln_chat_delta d = {0};
            kiln_chat_out_push(&c->ch[0].co, text.p ? text.p : "", text.len, 1, &d);
            kiln_chat_delta_free(&d);
        }
        kiln_sbuf_free(&text);
        if (c->responses) return send_json(c, 200, responses_object(c), 0);
        return send_json(c, 200, anthropic_response(c), 0);
    }
    json_t *res = envelope(c, c->p.chat ? "chat.completion" : "text_completion");
    json_t *choices = json_array();
    for (int i = 0; i < c->n_ch; i++) {
        choice *h = &c->ch[i];
        kiln_sbuf text = {0};
        kiln_detok_take(&h->dt, 1, &text);
        json_t *ch = json_pack("{s:i}", "index", i);
        if (c->p.chat && h->co_on) {
            kiln_chat_delta d = {0};
            kiln_chat_out_push(&h->co, text.p ? text.p : "", text.len, 1, &d);
            kiln_chat_delta_free(&d);
            json_t *msg = json_pack("{s:s,s:o,s:n}", "role", "assistant", "content", kiln_chat_out_content(&h->co), "refusal");
            json_t *rc = kiln_chat_out_reasoning(&h->co);
            if (rc) json_object_set_new(msg, "reasoning_content", rc);
            if (json_array_size(h->co.calls)) json_object_set(msg, "tool_calls", h->co.calls);
            json_object_set_new(ch, "message", msg);
        } else if (c->p.chat && c->p.tool_json == 2) { /* "required": the calls the grammar made */
            json_t *calls = required_calls(h, text.p ? text.p : "", text.len);
            json_t *msg = json_pack("{s:s,s:o,s:n}", "role", "assistant", "content", calls ? json_null() : json_stringn(text.p ? text.p : "", text.len), "refusal");
            if (calls) {
                for (size_t k = 0; k < json_array_size(calls); k++) json_object_del(json_array_get(calls, k), "index");
                json_object_set_new(msg, "tool_calls", calls);
            }
            json_object_set_new(ch, "message", msg);
        } else if (c->p.chat && c->p.tool_json) { /* the named function's arguments, as one call (vLLM, OpenAI) */
            json_t *call = json_pack("{s:s,s:s,s:{s:s,s:o}}", "id", h->tool_id, "type", "function", "function", "name", c->p.tool_name, "arguments",
                                     kiln_json_bytes_string(text.p ? text.p : "", text.len));
            json_object_set_new(ch, "message", json_pack("{s:s,s:n,s:n,s:[o]}", "role", "assistant", "content", "refusal", "tool_calls", call));
        } else if (c->p.echo) { /* the prompt, then the completion (text and logprobs) */
            kiln_sbuf all = {0};
            json_t *lp = h->lp ? new_logprobs(0) : NULL;
            echo_prompt(c, h->pi, &all, lp);
            kiln_sbuf_put(&all, text.p ? text.p : "", text.len);
            if (all.oom) { kiln_sbuf_free(&text); json_decref(lp); json_decref(ch); json_decref(choices); json_decref(res);
                           return fail(c, 500, "server_error", NULL, NULL, "out of memory"); }
            json_object_set_new(ch, "text", json_stringn(all.p ? all.p : "", all.len));
            kiln_sbuf_free(&all);
            if (lp) {
                static const char *const arrays[4] = {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
                for (int a = 0; a < 4; a++) json_array_extend(json_object_get(lp, arrays[a]), json_object_get(h->lp, arrays[a]));
                json_decref(h->lp);
                h->lp = lp;
            }
        } else {
            json_t *t = json_stringn(text.p ? text.p : "", text.len);
            if (c->p.chat) json_object_set_new(ch, "message", json_pack("{s:s,s:o,s:n}", "role", "assistant", "content", t, "refusal"));
            else json_object_set_new(ch, "text", t);
        }
        kiln_sbuf_free(&text);
        json_t *msg = json_object_get(ch, "message");
        if (c->p.chat_echo && msg) { /* chat echo: the final assistant message's text first */
            json_t *ct = json_object_get(msg, "content");
            kiln_sbuf e = {0};
            kiln_sbuf_put(&e, c->p.chat_echo, c->p.chat_echo_len);
            if (json_is_string(ct)) kiln_sbuf_put(&e, json_string_value(ct), json_string_length(ct));
            json_object_set_new(msg, "content", json_stringn(e.p ? e.p : "", e.len));
            kiln_sbuf_free(&e);
        }
        json_object_set_new(ch, "logprobs", h->lp ? json_incref(h->lp) : json_null());
        if (c->p.prompt_logprobs >= 0 && !c->p.chat) json_object_set_new(ch, "prompt_logprobs", prompt_logprobs_json(c, h->pi));
        json_object_set_new(ch, "finish_reason", json_string(finish_of(c, h)));
        json_array_append_new(choices, ch);
    }
    json_object_set_new(res, "choices", choices);
    json_object_set_new(res, "usage", usage_json(c));
    if (c->p.prompt_logprobs >= 0 && c->p.chat) json_object_set_new(res, "prompt_logprobs", prompt_logprobs_json(c, 0)); /* (vLLM: the response's) */
    return send_json(c, 200, res, 0);
}

/* ---- streaming (server-sent events) ------------------------------------------------------------------------------ */
static void sse(conn *c, json_t *j) {
    char *txt = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    kiln_sbuf_puts(&c->out, "data: ");
    if (txt) kiln_sbuf_puts(&c->out, txt);
    kiln_sbuf_puts(&c->out, "\n\n");
    free(txt);
}

static json_t *chunk(conn *c, int index, const char *text, size_t n, json_t *lp, const char *finish, int role) {
    json_t *j = envelope(c, c->p.chat ? "chat.completion.chunk" : "text_completion");
    json_t *choice = json_pack("{s:i}", "index", index);
    if (c->p.chat) {
        json_t *delta = json_object();
        if (role) json_object_set_new(delta, "role", json_string("assistant"));
        if (text) json_object_set_new(delta, "content", json_stringn(text, n));
        json_object_set_new(choice, "delta", delta);
    } else {
        json_object_set_new(choice, "text", json_stringn(text ? text : "", text ? n : 0));
    }
    json_object_set_new(choice, "logprobs", lp ? lp : json_null());
    json_object_set_new(choice, "finish_reason", finish ? json_string(finish) : json_null());
    json_object_set_new(j, "choices", json_pack("[o]", choice));
    if (c->p.include_usage) json_object_set_new(j, "usage", json_null());
    return j;
}

/* An Anthropic server-sent event: "event: NAME" and its data. */
static void sse_event(conn *c, const char *name, json_t *j) {
    kiln_sbuf_printf(&c->out, "event: %s\n", name);
    sse(c, j);
}

static void anthropic_close_block(conn *c) {
    if (!c->blk_type) return;
    sse_event(c, "content_block_stop", json_pack("{s:s,s:i}", "type", "content_block_stop", "index", c->blk_index));
    c->blk_type = 0;
    c->blk_index++;
}

/* Text of one kind (1 thinking, 2 text) as a delta of the open block of that kind (opened here). */
static void anthropic_text(conn *c, int kind, const char *p, size_t n) {
    if (!n) return;
    if (c->blk_type != kind) {
        anthropic_close_block(c);
        json_t *cb = kind == 1 ? json_pack("{s:s,s:s,s:s}", "type", "thinking", "thinking", "", "signature", "") : json_pack("{s:s,s:s}", "type", "text", "text", "");
        sse_event(c, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", c->blk_index, "content_block", cb));
        c->blk_type = kind;
    }
    json_t *d = kind == 1 ? json_pack("{s:s,s:s%}", "type", "thinking_delta", "thinking", p, n) : json_pack("{s:s,s:s%}", "type", "text_delta", "text", p, n);
    sse_event(c, "content_block_delta", json_pack("{s:s,s:i,s:o}", "type", "content_block_delta", "index", c->blk_index, "delta", d));
}

/* What the splitter released, as Anthropic content-block events (each tool call one tool_use block:
 * start with empty input, its arguments as one input_json_delta, stop). */
/* One call as a streamed tool_use block: start, its whole input as one input_json_delta, stop. */
static void anthropic_emit_call(conn *c, json_t *call) {
    {
        anthropic_close_block(c);
        json_t *tu = anthropic_tool_use(call);
        json_object_set_new(tu, "input", json_object());
        sse_event(c, "content_block_start", json_pack("{s:s,s:i,s:o}", "type", "content_block_start", "index", c->blk_index, "content_block", tu));
        const char *args = json_string_value(json_object_get(json_object_get(call, "function"), "arguments"));
        json_t *in = kiln_anthropic_tool_input(args);
        char *js = json_dumps(in, JSON_COMPACT | JSON_PRESERVE_ORDER);
        json_decref(in);
        sse_event(c, "content_block_delta", json_pack("{s:s,s:i,s:{s:s,s:s}}", "type", "content_block_delta", "index", c->blk_index, "delta", "type",
                                                      "input_json_delta", "partial_json", js ? js : "{}"));
        free(js);
        c->blk_type = 3;
        anthropic_close_block(c);
    }
}

/* Text of one kind (1 reasoning, 2 text) and one whole tool call as the dialect's events: Anthropic
 * content blocks or Responses output items. */
static void block_text(conn *c, int kind, const char *p, size_t n) {
    if (c->responses) kiln_resp_stream_text(&c->resp, kind, p, n, &c->out);
    else anthropic_text(c, kind, p, n);
}
static void block_call(conn *c, json_t *call) {
    if (c->responses) kiln_resp_stream_call(&c->resp, call, &c->out);
    else anthropic_emit_call(c, call);
}

/* What the splitter released, as Anthropic content-block events or Responses output-item events. */
static void anthropic_split(conn *c, choice *h, const char *text, size_t n, int final) {
    if (c->p.tool_json) { /* tool_choice any / tool: the calls once the output is whole (stream_produce_anthropic) */
        kiln_sbuf_put(&h->tool_text, text, n);
        return;
    }
    kiln_chat_delta d = {0};
    kiln_chat_out_push(&h->co, text, n, final, &d);
    block_text(c, 1, d.reasoning.p, d.reasoning.len);
    block_text(c, 2, d.content.p, d.content.len);
    size_t i;
    json_t *call;
    json_array_foreach(d.calls, i, call) block_call(c, call);
    kiln_chat_delta_free(&d);
}

/* A chat chunk of what the output splitter released: reasoning_content, content and tool_calls
 * deltas (OpenAI's streamed tool calls: each call whole, with its index, id, type and name). */
static void emit_split(conn *c, int index, choice *h, const char *text, size_t n, int final, json_t *lp) {
    kiln_chat_delta d = {0};
    kiln_chat_out_push(&h->co, text, n, final, &d);
    if (d.reasoning.len || d.content.len || d.calls || lp) {
        json_t *j = chunk(c, index, NULL, 0, lp, NULL, 0);
        json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
        if (d.reasoning.len) json_object_set_new(delta, "reasoning_content", json_stringn(d.reasoning.p, d.reasoning.len));
        if (d.content.len) json_object_set_new(delta, "content", json_stringn(d.content.p, d.content.len));
        if (d.calls) json_object_set(delta, "tool_calls", d.calls);
        sse(c, j);
    }
    kiln_chat_delta_free(&d);
}

/* tool_choice naming a function, streamed: the arguments' text as delta.tool_calls pieces of call 0
 * (the first with its id, type and name), which the official clients assemble. */
static void emit_tool_args(conn *c, int index, choice *h, const char *text, size_t n, json_t *lp) {
    if (!n && !lp && h->tool_started) return;
    json_t *j = chunk(c, index, NULL, 0, lp, NULL, 0);
    json_t *delta = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta");
    json_t *fn = json_pack("{s:o}", "arguments", kiln_json_bytes_string(text, n));
    json_t *call = json_pack("{s:i}", "index", 0);
    if (!h->tool_started) {
        json_object_set_new(call, "id", json_string(h->tool_id));
        json_object_set_new(call, "type", json_string("function"));
        json_object_set_new(fn, "name", json_string(c->p.tool_name));
        h->tool_started = 1;
    }
    json_object_set_new(call, "function", fn);
    json_object_set_new(delta, "tool_calls", json_pack("[o]", call));
    sse(c, j);
}

/* One event of choice `index` consumed: the text it released (and its logprobs) as a chunk. */
static void emit_event(conn *c, int index, choice *h, json_t *lp) {
    kiln_sbuf text = {0};
    kiln_detok_take(&h->dt, 0, &text);
    if (c->anthropic || c->responses) anthropic_split(c, h, text.p ? text.p : "", text.len, 0);
    else if (h->co_on) emit_split(c, index, h, text.p ? text.p : "", text.len, 0, lp);
    else if (c->p.tool_json == 2 && c->p.chat) kiln_sbuf_put(&h->tool_text, text.p ? text.p : "", text.len); /* sent whole at the end */
    else if (c->p.tool_json && c->p.chat) emit_tool_args(c, index, h, text.p ? text.p : "", text.len, lp);
    else if (text.len || lp) sse(c, chunk(c, index, text.p ? text.p : "", text.len, lp, NULL, 0));
    kiln_sbuf_free(&text);
}

/* The Anthropic Messages stream (message_start, ping, the content blocks' events, message_delta,
 * message_stop) or the Responses one (response.created / in_progress, the output items' events,
 * response.completed / incomplete / failed), of choice 0. Returns as stream_produce. */
static int stream_produce_blocks(conn *c) {
    if (!c->stream_started) {
        c->stream_started = 1;
        if (c->responses) {
            kiln_resp_stream_begin(&c->resp, &c->out);
            return 0;
        }
        json_t *m = anthropic_message(c, json_array(), NULL, json_null());
        json_object_set_new(json_object_get(m, "usage"), "output_tokens", json_integer(0));
        sse_event(c, "message_start", json_pack("{s:s,s:o}", "type", "message_start", "message", m));
        sse_event(c, "ping", json_pack("{s:s}", "type", "ping"));
        return 0;
    }
    if (!has_news(c)) return check_gone(c) < 0 ? -1 : 1;
    choice *h = &c->ch[0];
    if (!drain_choice(c, h, emit_event)) return 0;
    if (c->failed) {
        cancel_all(c);
        if (c->responses) kiln_resp_stream_fail(&c->resp, &c->err, &c->out);
        else sse_event(c, "error", kiln_anthropic_error_json(&c->err));
        c->stream_done = 1;
        return 0;
    }
    kiln_sbuf text = {0};
    kiln_detok_take(&h->dt, 1, &text);
    anthropic_split(c, h, text.p ? text.p : "", text.len, 1);
    kiln_sbuf_free(&text);
    if (c->p.tool_json) { /* the forced calls, or the text when it is not whole (max_tokens) */
        json_t *calls = forced_calls(c, h, h->tool_text.p ? h->tool_text.p : "", h->tool_text.len);
        if (calls) {
            size_t i;
            json_t *call;
            json_array_foreach(calls, i, call) block_call(c, call);
            json_array_extend(h->co.calls, calls);
            json_decref(calls);
        } else {
            block_text(c, 2, h->tool_text.p, h->tool_text.len);
        }
    }
    if (c->responses) {
        kiln_resp_stream_end(&c->resp, responses_incomplete(h), responses_usage(c), &c->out);
    } else {
        anthropic_close_block(c);
        json_t *seq;
        const char *stop = anthropic_stop(c, h, &seq);
        sse_event(c, "message_delta", json_pack("{s:s,s:{s:s,s:o},s:o}", "type", "message_delta", "delta", "stop_reason", stop, "stop_sequence", seq,
                                                "usage", anthropic_usage(c, 0)));
        sse_event(c, "message_stop", json_pack("{s:s}", "type", "message_stop"));
    }
    c->stream_done = 1;
    return 0;
}

/* Fills c->out with the next SSE events; returns -1 when the client is gone, 1 when there is
 * nothing new yet (the reader parks the connection), else 0. Each choice streams
 * its own chunks (its `index`) and its own finish chunk; the usage chunk and [DONE] come after
 * the last choice ends. */
static int stream_produce(conn *c) {
    if (c->anthropic || c->responses) return stream_produce_blocks(c);
    if (!c->stream_started) {
        c->stream_started = 1;
        if (c->p.chat) {
            for (int i = 0; i < c->n_ch; i++) {
                sse(c, chunk(c, i, "", 0, NULL, NULL, 1));
                if (c->p.chat_echo_len) sse(c, chunk(c, i, c->p.chat_echo, c->p.chat_echo_len, NULL, NULL, 0)); /* chat echo */
            }
            return 0;
        }
    }
    if (!has_news(c)) return check_gone(c) < 0 ? -1 : 1;
    int all = 1;
    for (int i = 0; i < c->n_ch && !c->failed; i++) {
        choice *h = &c->ch[i];
        if (h->finish) continue;
        if (c->p.echo && !h->echoed) { /* the prompt first, as its own chunk (with its logprobs) */
            const int es = echo_state(c, h);
            if (es == 0) { all = 0; continue; }
            if (es > 0) {
                kiln_sbuf et = {0};
                json_t *lp = c->p.logprobs ? new_logprobs(0) : NULL;
                echo_prompt(c, h->pi, &et, lp);
                sse(c, chunk(c, i, et.p ? et.p : "", et.len, lp, NULL, 0));
                kiln_sbuf_free(&et);
                h->echoed = 1;
            } /* (es < 0: the first choice failed; its drain below or before reports it) */
        }
        if (!drain_choice(c, h, emit_event)) { all = 0; continue; }
        if (c->failed) break;
        kiln_sbuf text = {0};
        kiln_detok_take(&h->dt, 1, &text);
        if (h->co_on) emit_split(c, i, h, text.p ? text.p : "", text.len, 1, NULL);
        else if (c->p.tool_json == 2 && c->p.chat) { /* "required": every call in one delta, once the list is whole */
            kiln_sbuf_put(&h->tool_text, text.p ? text.p : "", text.len);
            json_t *calls = required_calls(h, h->tool_text.p ? h->tool_text.p : "", h->tool_text.len);
            json_t *j = chunk(c, i, calls ? NULL : (h->tool_text.p ? h->tool_text.p : ""), calls ? 0 : h->tool_text.len, NULL, NULL, 0);
            if (calls) json_object_set_new(json_object_get(json_array_get(json_object_get(j, "choices"), 0), "delta"), "tool_calls", calls);
            sse(c, j);
            kiln_sbuf_free(&h->tool_text);
        }
        else if (c->p.tool_json && c->p.chat) emit_tool_args(c, i, h, text.p ? text.p : "", text.len, NULL);
        else if (text.len) sse(c, chunk(c, i, text.p, text.len, NULL, NULL, 0));
        kiln_sbuf_free(&text);
        sse(c, chunk(c, i, c->p.chat ? NULL : "", 0, NULL, finish_of(c, h), 0));
    }
    if (c->failed) {
        cancel_all(c);
        sse(c, kiln_oai_error_json(&c->err));
    } else if (all && c->p.include_usage) {
        json_t *u = envelope(c, c->p.chat ? "chat.completion.chunk" : "text_completion");
        json_object_set_new(u, "choices", json_array());
        json_object_set_new(u, "usage", usage_json(c));
        sse(c, u);
    }
    if (c->failed || all) {
        kiln_sbuf_puts(&c->out, "data: [DONE]\n\n");
        c->stream_done = 1;
    }
    return 0;
}

static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn *c = cls;
    while (c->out_off == c->out.len) {
        if (c->stream_done) return MHD_CONTENT_READER_END_OF_STREAM;
        c->out.len = c->out_off = 0;
        int r = stream_produce(c);
        if (r < 0 || c->out.oom) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (r > 0 && park(c)) return 0; /* suspended: called again once resumed */
    }
    size_t n = c->out.len - c->out_off < max ? c->out.len - c->out_off : max;
    memcpy(buf, c->out.p + c->out_off, n);
    c->out_off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { conn_unref(cls); }

/* ---- completions ------------------------------------------------------------------------------------------------------ */
/* n > 1: n engine requests for the same prompt (choice i samples with seed + i; the siblings wait
 * for the first choice's prompt pages in the prefix cache). All are submitted or none is. */
static enum MHD_Result handle_completion(conn *c, int chat) {
    kiln_server *s = c->s;
    kiln_oai_error err;
    if (atomic_load(&s->closing)) return fail(c, 503, "server_error", NULL, "server_shutting_down", "the server is shutting down");
    char *converted = NULL; /* /v1/messages: the Anthropic body as the chat completion it asks for */
    if (c->anthropic) {
        json_t *cb = NULL;
        if (!kiln_anthropic_request(s, c->body.p ? c->body.p : "", c->body.len, 0, &cb, &err)) return send_error(c, &err);
        converted = json_dumps(cb, JSON_COMPACT);
        json_decref(cb);
        if (!converted) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    }
    if (c->responses) { /* /v1/responses: likewise */
        json_t *cb = NULL;
        kiln_resp_init(&c->resp, s->model_name);
        if (!kiln_responses_request(c->body.p ? c->body.p : "", c->body.len, &c->resp, &cb, &err)) return send_error(c, &err);
        converted = json_dumps(cb, JSON_COMPACT);
        json_decref(cb);
        if (!converted) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    }
    const int parsed = converted ? kiln_oai_parse(s, converted, strlen(converted), 1, &c->p, &err)
                                 : kiln_oai_parse(s, c->body.p ? c->body.p : "", c->body.len, chat, &c->p, &err);
    free(converted);
    if (!parsed) return send_error(c, &err);
    c->have_params = 1;
    if (c->responses) memcpy(c->p.ignored, c->resp.ignored, sizeof c->p.ignored); /* (the Responses body's own) */
    const int total = c->p.n * c->p.n_prompts; /* (at most 256 × 16; more than max batch + max queue is a 429 below) */
    c->ch = calloc((size_t)total, sizeof *c->ch);
    if (!c->ch) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    c->n_ch = total;
    double deadline = s->o.request_timeout_s > 0 ? kiln_now() + s->o.request_timeout_s : 0;
    for (int i = 0; i < c->n_ch; i++) {
        choice *h = &c->ch[i];
        h->pi = i / c->p.n; /* choice index = prompt × n + place (vLLM's order) */
        const int place = i % c->p.n;
        const kiln_oai_prompt *q = &c->p.prompts[h->pi];
        h->cancel_sent = 1; /* until submitted: nothing to cancel */
        kiln_sampling sp = c->p.sp;
        sp.seed = c->p.sp.seed + (uint64_t)place; /* each prompt's first choice as if it came alone */
        /* (max_tokens 0, echo alone: the engine runs the prompt and one token, which is dropped) */
        kiln_status st = kiln_req_create(q->ids, q->n, q->max_tokens > 0 ? q->max_tokens : 1, &sp, s->info.vocab_size,
                                         c->p.logprobs ? c->p.top_logprobs : -1, &h->r);
        if (st != KILN_OK) { c->n_ch = i; return fail(c, 500, "server_error", NULL, NULL, kiln_last_error()); }
        /* echo with logprobs, or prompt_logprobs: each prompt's first choice scores it (the others
         * share its pages) */
        const int echo_k = c->p.echo && c->p.logprobs ? c->p.top_logprobs : -1;
        const int plp_k = echo_k > c->p.prompt_logprobs ? echo_k : c->p.prompt_logprobs;
        if (place == 0 && plp_k >= 0 && kiln_req_want_prompt_logprobs(h->r, plp_k) != KILN_OK) {
            c->n_ch = i + 1;
            return fail(c, 500, "server_error", NULL, NULL, kiln_last_error());
        }
        if (c->p.echo) h->text_offset = q->echo_text ? q->echo_len : echo_text_len(c, h->pi);
        h->r->ignore_eos = c->p.ignore_eos;
        h->r->spec_k = c->p.spec_set ? c->p.spec_k : s->o.spec_k;
        h->r->spec_ngram = c->p.spec_set ? c->p.spec_ngram : s->o.spec_ngram;
        h->r->spec_mtp = c->p.spec_set ? c->p.spec_mtp : s->o.spec_mtp;
        h->r->n_stop_ids = c->p.n_stop_ids;
        memcpy(h->r->stop_ids, c->p.stop_ids, sizeof h->r->stop_ids);
        h->r->deadline = deadline;
        h->r->notify = conn_notify;
        h->r->notify_arg = c;
        if (place > 0) {
            kiln_req *first = c->ch[i - place].r;
            atomic_fetch_add(&first->refs, 1);
            h->r->share_from = first;
        }
        for (int k = 0; k < c->p.n_stops; k++) {
            h->dt.stops[k] = c->p.stops[k];
            h->dt.stop_len[k] = strlen(c->p.stops[k]);
        }
        h->dt.n_stops = c->p.n_stops;
        h->prev = q->ids[q->n - 1];
        h->r->forced = s->forced;
        h->r->n_forced = s->n_forced;
        if (c->p.tool_json) { /* ids as the tool-call parsers make them: CSPRNG hex */
            memcpy(h->tool_id, "chatcmpl-tool-", 14);
            kiln_random_hex(h->tool_id + 14, 16);
        }
        if (c->p.tool_json == 2) { /* tool_choice "required": the calls' grammar (engine/json_grammar.h) */
            kiln_jg *g = NULL;
            char *tj = json_dumps(c->p.tools, JSON_COMPACT | JSON_PRESERVE_ORDER);
            kiln_status gst = tj ? kiln_jg_compile_tools(tj, !c->p.parallel_tools, &g) : kiln_fail(KILN_ERR_NOMEM, "out of memory");
            free(tj);
            if (gst == KILN_OK) gst = kiln_req_set_grammar(h->r, g);
            if (gst != KILN_OK) { c->n_ch = i + 1; return fail(c, 500, "server_error", NULL, NULL, kiln_last_error()); }
        }
        if (c->p.json_mode) { /* structured output: each choice its own grammar state */
            kiln_jg *g = NULL;
            kiln_status gst = kiln_jg_compile(c->p.json_mode == 2 ? c->p.schema : NULL, &g);
            if (gst == KILN_OK) gst = kiln_req_set_grammar(h->r, g);
            if (gst != KILN_OK) { c->n_ch = i + 1; return fail(c, 500, "server_error", NULL, NULL, kiln_last_error()); }
        }
        if (chat && (c->anthropic || c->responses || c->p.tool_parser != KILN_TOOLS_NONE || c->p.reasoning != KILN_REASONING_NONE)) {
            kiln_chat_out_init(&h->co, c->p.tool_parser, c->p.reasoning, c->p.think_opened, c->p.tools,
                               c->p.tool_choice == KILN_TOOL_CHOICE_NAMED ? c->p.tool_name : NULL, !c->p.parallel_tools);
            h->co_on = 1;
        }
    }
    c->created = (long)time(NULL);
    /* ids from the OS CSPRNG: one client cannot guess another's (OpenAI's ids are random too) */
    const int pre = snprintf(c->id, sizeof c->id, "%s", c->anthropic ? "msg_" : chat ? "chatcmpl-" : "cmpl-");
    kiln_random_hex(c->id + pre, 16);
    char why[256];
    kiln_req **rs = malloc((size_t)c->n_ch * sizeof *rs);
    if (!rs) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    for (int i = 0; i < c->n_ch; i++) rs[i] = c->ch[i].r;
    const kiln_submit_result res = kiln_engine_submit_all(s->eng, rs, c->n_ch, why, sizeof why); /* all choices or none */
    free(rs);
    if (res == KILN_SUBMIT_OK)
        for (int i = 0; i < c->n_ch; i++) c->ch[i].cancel_sent = 0;
    switch (res) {
    case KILN_SUBMIT_OK: break;
    case KILN_SUBMIT_QUEUE_FULL: return fail(c, 429, "rate_limit_error", NULL, "rate_limit_exceeded", why);
    case KILN_SUBMIT_TOO_LONG: return fail(c, 400, "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded", why);
    case KILN_SUBMIT_SHUTDOWN: return fail(c, 503, "server_error", NULL, "server_shutting_down", why);
    }
    /* from here the request timeout bounds the connection (+ the header timeout to send the end) */
    sock_deadline(c, deadline > 0 ? deadline + s->header_to : 0);
    if (c->p.logprobs && !c->p.stream)
        for (int i = 0; i < c->n_ch; i++) c->ch[i].lp = new_logprobs(c->p.chat);
    if (!c->p.stream) {
        c->waiting = 1;
        return run_blocking(c);
    }
    atomic_fetch_add(&c->refs, 1);
    struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, stream_reader, c, stream_free);
    if (!resp) { conn_unref(c); return MHD_NO; }
    MHD_add_response_header(resp, "Content-Type", "text/event-stream");
    add_cors(c, resp);
    add_ignored(c, resp);
    MHD_add_response_header(resp, "Cache-Control", "no-cache");
    MHD_add_response_header(resp, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c->mc, 200, resp);
    MHD_destroy_response(resp);
    count_code(s, 200);
    return ret;
}

/* ---- routing --------------------------------------------------------------------------------------------------------- */
/* Constant-time comparison of the presented key with the configured one (time depends only on
 * the configured key's length). */
static int key_ok(const char *given, const char *want) {
    size_t lw = strlen(want), lg = given ? strlen(given) : 0;
    volatile unsigned char diff = (unsigned char)(lg != lw);
    for (size_t i = 0; i < lw; i++) diff |= (unsigned char)(want[i] ^ (i < lg ? given[i] : 0));
    return diff == 0;
}

static int authorized(conn *c) {
    if (!c->s->api_key) return 1;
    const char *x = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "x-api-key"); /* Anthropic's header */
    if (x) return key_ok(x, c->s->api_key);
    const char *h = MHD_lookup_connection_value(c->mc, MHD_HEADER_KIND, "Authorization");
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return key_ok(NULL, c->s->api_key) && 0;
    h += 7;
    while (*h == ' ') h++;
    return key_ok(h, c->s->api_key);
}

static json_t *model_obj(kiln_server *s) {
    return json_pack("{s:s,s:s,s:I,s:s,s:i}", "id", s->model_name, "object", "model", "created", (json_int_t)s->created, "owned_by", "kiln",
                     "max_model_len", kiln_engine_context(s->eng));
}

/* CORS preflight: 204 with the methods and headers the API takes (origin checked by add_cors). */
static enum MHD_Result preflight(conn *c) {
    struct MHD_Response *resp = MHD_create_response_from_buffer(0, (void *)"", MHD_RESPMEM_PERSISTENT);
    if (!resp) return MHD_NO;
    add_cors(c, resp);
    MHD_add_response_header(resp, "Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    MHD_add_response_header(resp, "Access-Control-Allow-Headers", "Authorization, Content-Type, x-api-key, anthropic-version");
    MHD_add_response_header(resp, "Access-Control-Max-Age", "600");
    enum MHD_Result ret = MHD_queue_response(c->mc, 204, resp);
    MHD_destroy_response(resp);
    count_code(c->s, 204);
    return ret;
}

/* vLLM's POST /tokenize: {"prompt": text, "add_special_tokens": true} or {"messages": [...], "tools"?,
 * "chat_template_kwargs"?} (the chat prompt a completion would have) → {"tokens", "count",
 * "max_model_len"}. */
static enum MHD_Result handle_tokenize(conn *c) {
    kiln_server *s = c->s;
    json_error_t je;
    json_t *o = json_loadb(c->body.p ? c->body.p : "", c->body.len, 0, &je);
    if (!json_is_object(o)) { json_decref(o); return fail(c, 400, "invalid_request_error", NULL, NULL, "the body must be a JSON object"); }
    if (!s->info.has_tokenizer) { json_decref(o); return fail(c, 400, "invalid_request_error", NULL, NULL, "this model has no tokenizer"); }
    json_t *pr = json_object_get(o, "prompt"), *msgs = json_object_get(o, "messages"), *as = json_object_get(o, "add_special_tokens");
    int32_t *ids = NULL;
    size_t n = 0;
    kiln_oai_error err;
    int ok = 0;
    if (json_is_string(pr)) {
        if (as && !json_is_boolean(as)) { json_decref(o); return fail(c, 400, "invalid_request_error", "add_special_tokens", NULL, "'add_special_tokens' must be a boolean"); }
        const int bos = !as || json_is_true(as);
        if (kiln_tokenizer_encode(kiln_model_tokenizer(s->m), json_string_value(pr), json_string_length(pr), bos && s->info.bos_id >= 0, 1, &ids, &n) != KILN_OK)
            kiln_oai_fail(&err, 400, "invalid_request_error", "prompt", NULL, "cannot tokenize 'prompt': %s", kiln_last_error());
        else ok = 1;
    } else if (json_is_array(msgs)) {
        json_t *body = json_pack("{s:s,s:O,s:i}", "model", s->model_name, "messages", msgs, "max_tokens", 1);
        json_t *t = json_object_get(o, "tools"), *kw = json_object_get(o, "chat_template_kwargs");
        if (t) json_object_set(body, "tools", t);
        if (kw) json_object_set(body, "chat_template_kwargs", kw);
        static const char *const rendering[] = {"add_generation_prompt", "continue_final_message", NULL}; /* (vLLM's /tokenize takes them too) */
        for (int i = 0; rendering[i]; i++)
            if (json_object_get(o, rendering[i])) json_object_set(body, rendering[i], json_object_get(o, rendering[i]));
        char *txt = json_dumps(body, JSON_COMPACT);
        json_decref(body);
        kiln_oai_params p;
        if (txt && kiln_oai_parse(s, txt, strlen(txt), 1, &p, &err)) {
            ids = p.prompts[0].ids;
            n = (size_t)p.prompts[0].n;
            p.prompts[0].ids = NULL;
            kiln_oai_params_free(&p);
            ok = 1;
        }
        free(txt);
    } else {
        kiln_oai_fail(&err, 400, "invalid_request_error", "prompt", NULL, "give 'prompt' (a string) or 'messages' (an array)");
    }
    json_decref(o);
    if (!ok) return send_error(c, &err);
    json_t *a = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(a, json_integer(ids[i]));
    free(ids);
    return send_json(c, 200, json_pack("{s:o,s:i,s:i}", "tokens", a, "count", (int)n, "max_model_len", kiln_engine_context(s->eng)), 0);
}

/* vLLM's POST /detokenize: {"tokens": [ids]} → {"prompt": text} (every id must be in the vocabulary). */
static enum MHD_Result handle_detokenize(conn *c) {
    kiln_server *s = c->s;
    json_error_t je;
    json_t *o = json_loadb(c->body.p ? c->body.p : "", c->body.len, 0, &je), *t = json_object_get(o, "tokens");
    if (!json_is_array(t)) { json_decref(o); return fail(c, 400, "invalid_request_error", "tokens", NULL, "'tokens' must be an array of token ids"); }
    kiln_sbuf text = {0};
    int32_t prev = -1;
    size_t i;
    json_t *v;
    json_array_foreach(t, i, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= s->info.vocab_size) {
            char m[128];
            snprintf(m, sizeof m, "tokens[%zu] is not a token id in [0, %d)", i, s->info.vocab_size);
            json_decref(o);
            kiln_sbuf_free(&text);
            return fail(c, 400, "invalid_request_error", "tokens", "invalid_value", m);
        }
        const int32_t id = (int32_t)json_integer_value(v);
        size_t len = 0;
        char tmp[32];
        const char *piece = piece_of(c, prev, id, &len, tmp, sizeof tmp);
        kiln_sbuf_put(&text, piece, len);
        prev = id;
    }
    json_decref(o);
    json_t *r = json_pack("{s:o}", "prompt", kiln_json_bytes_string(text.p ? text.p : "", text.len));
    kiln_sbuf_free(&text);
    return send_json(c, 200, r, 0);
}

static enum MHD_Result route(conn *c, const char *url, const char *method) {
    kiln_server *s = c->s;
    int get = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0, post = strcmp(method, "POST") == 0;
    if (strcmp(method, "OPTIONS") == 0 && s->cors_origin) return preflight(c);
    if (strcmp(url, "/health") == 0) {
        if (!get) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET /health");
        if (atomic_load(&s->closing)) return send_json(c, 503, json_pack("{s:s}", "status", "shutting_down"), 0);
        return send_json(c, 200, json_pack("{s:s}", "status", "ok"), 0);
    }
    if (strcmp(url, "/") == 0 || strcmp(url, "/index.html") == 0) { /* the chat page (webpage.c); its API calls carry the key */
        if (!get) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET /");
        size_t n;
        const char *html = kiln_web_page(&n);
        return send_buf(c, 200, "text/html; charset=utf-8", html, n, 0);
    }
    if (strcmp(url, "/metrics") == 0) {
        if (!get) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET /metrics");
        kiln_sbuf b = {0};
        kiln_server_metrics(s, &b);
        enum MHD_Result r = send_buf(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.p ? b.p : "", b.len, 0);
        kiln_sbuf_free(&b);
        return r;
    }
    const int tok_route = strcmp(url, "/tokenize") == 0 || strcmp(url, "/detokenize") == 0;
    if (!tok_route && strncmp(url, "/v1/", 4) != 0 && strcmp(url, "/v1") != 0)
        return fail(c, 404, "invalid_request_error", NULL, "not_found", "unknown route (try /v1/chat/completions, /v1/completions, /v1/messages, /v1/responses, /v1/models, /health, /metrics, / for the chat page)");
    c->anthropic = strncmp(url, "/v1/messages", 12) == 0; /* errors in Anthropic's shape from here on */
    if (!authorized(c))
        return fail(c, 401, "invalid_request_error", NULL, "invalid_api_key",
                    "Incorrect API key provided: send it as 'Authorization: Bearer KEY' or 'x-api-key: KEY'");
    if (c->too_large) {
        char m[128];
        snprintf(m, sizeof m, "the request body exceeds the limit of %zu bytes", s->o.max_body_bytes);
        return fail(c, 413, "invalid_request_error", NULL, "request_too_large", m);
    }
    if (tok_route) {
        if (!post) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use POST");
        return url[1] == 't' ? handle_tokenize(c) : handle_detokenize(c);
    }
    if (strcmp(url, "/v1/models") == 0) {
        if (!get) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET /v1/models");
        return send_json(c, 200, json_pack("{s:s,s:[o]}", "object", "list", "data", model_obj(s)), 0);
    }
    if (strncmp(url, "/v1/models/", 11) == 0) {
        if (!get) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use GET /v1/models/ID");
        if (strcmp(url + 11, s->model_name) != 0) return fail(c, 404, "invalid_request_error", "model", "model_not_found", "no such model");
        return send_json(c, 200, model_obj(s), 0);
    }
    if (strcmp(url, "/v1/messages/count_tokens") == 0) { /* Anthropic: the prompt's tokens, nothing generated */
        if (!post) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use POST");
        kiln_oai_error err;
        json_t *cb = NULL;
        if (!kiln_anthropic_request(s, c->body.p ? c->body.p : "", c->body.len, 1, &cb, &err)) return send_error(c, &err);
        char *txt = json_dumps(cb, JSON_COMPACT);
        json_decref(cb);
        kiln_oai_params p;
        int ok = txt && kiln_oai_parse(s, txt, strlen(txt), 1, &p, &err);
        free(txt);
        if (!ok) return send_error(c, &err);
        const int n = p.prompts[0].n;
        kiln_oai_params_free(&p);
        return send_json(c, 200, json_pack("{s:i}", "input_tokens", n), 0);
    }
    c->anthropic = strcmp(url, "/v1/messages") == 0;
    c->responses = strcmp(url, "/v1/responses") == 0;
    int chat = c->anthropic || c->responses || strcmp(url, "/v1/chat/completions") == 0;
    if (chat || strcmp(url, "/v1/completions") == 0) {
        if (!post) return fail(c, 405, "invalid_request_error", NULL, "method_not_allowed", "use POST");
        /* in flight until the connection lets go of it (the response sent or the client gone); a
         * suspended connection does not time out, so a long queue wait is not idleness */
        atomic_fetch_add(&s->in_flight, 1);
        c->in_flight = 1;
        return handle_completion(c, chat);
    }
    return fail(c, 404, "invalid_request_error", NULL, "not_found", "unknown route");
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *mc, const char *url, const char *method, const char *version,
                                  const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    kiln_server *s = cls;
    conn *c = *con_cls;
    if (!c) {
        c = calloc(1, sizeof *c);
        if (!c) return MHD_NO;
        c->s = s;
        c->mc = mc;
        atomic_init(&c->refs, 1);
        *con_cls = c;
        /* the headers are in: the body deadline starts, and the idle timeout is the long one */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
        c->sk = ci ? ci->socket_context : NULL;
        sock_deadline(c, kiln_now() + s->body_to);
        MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)KILN_IDLE_TIMEOUT_S);
        /* bodies far beyond the limit are refused before they are read */
        const char *cl = MHD_lookup_connection_value(mc, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes + ((size_t)64 << 20)) {
            c->too_large = 1;
            char m[128];
            snprintf(m, sizeof m, "the request body exceeds the limit of %zu bytes", s->o.max_body_bytes);
            return fail(c, 413, "invalid_request_error", NULL, "request_too_large", m);
        }
        return MHD_YES;
    }
    if (c->waiting) return run_blocking(c); /* resumed */
    if (*upload_size) {
        /* over the limit: keep reading (so the client sees our 413, not a reset) but drop it */
        if (c->body.len + *upload_size > s->o.max_body_bytes) c->too_large = 1;
        else kiln_sbuf_put(&c->body, upload, *upload_size);
        *upload_size = 0;
        return MHD_YES;
    }
    if (c->body.oom) return fail(c, 500, "server_error", NULL, NULL, "out of memory");
    return route(c, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *mc, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    conn *c = *con_cls;
    kiln_server *s = cls;
    /* keep-alive: the next request's headers have the header deadline from now */
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    kiln_sock *k = ci ? ci->socket_context : NULL;
    if (k) {
        pthread_mutex_lock(&s->sup_mu);
        k->deadline = kiln_now() + s->header_to;
        pthread_mutex_unlock(&s->sup_mu);
    }
    MHD_set_connection_option(mc, MHD_CONNECTION_OPTION_TIMEOUT, (unsigned)ceil(s->header_to));
    *con_cls = NULL;
    if (c) conn_unref(c);
}

/* ---- start / stop ------------------------------------------------------------------------------------------------------- */
static void base_name(const char *path, char *out, size_t n) {
    size_t len = strlen(path);
    while (len > 1 && path[len - 1] == '/') len--;
    size_t b = len;
    while (b > 0 && path[b - 1] != '/') b--;
    size_t l = len - b;
    const char *dot = NULL;
    for (size_t i = b; i < len; i++) if (path[i] == '.') dot = path + i;
    if (dot && dot > path + b && (strncmp(dot, ".bin", 4) == 0 || strncmp(dot, ".gguf", 5) == 0)) l = (size_t)(dot - (path + b));
    if (l >= n) l = n - 1;
    memcpy(out, path + b, l);
    out[l] = 0;
}

kiln_status kiln_server_start(kiln_model *m, const char *model_path, const kiln_options *opts, const kiln_server_options *so,
                              kiln_server **out) {
    *out = NULL;
    kiln_server *s = calloc(1, sizeof *s);
    if (!s) return kiln_fail(KILN_ERR_NOMEM, "out of memory");
    s->m = m;
    s->o = *so;
    /* the template's end-of-turn tokens end generation too (before the engine copies the end ids) */
    if (!kiln_model_add_turn_ends(m, s->turn_note, sizeof s->turn_note)) snprintf(s->turn_note, sizeof s->turn_note, "none added");
    kiln_model_get_info(m, &s->info);
    s->t_start = kiln_now();
    s->created = (long)time(NULL);
    if (so->model_name && *so->model_name) snprintf(s->model_name, sizeof s->model_name, "%s", so->model_name);
    else base_name(model_path ? model_path : "model", s->model_name, sizeof s->model_name);
    if (so->api_key && *so->api_key) s->api_key = strdup(so->api_key);
    if (so->cors_origin && *so->cors_origin) s->cors_origin = strdup(so->cors_origin);
    if (so->max_body_bytes < 1024) { free(s->cors_origin); free(s->api_key); free(s); return kiln_fail(KILN_ERR_INVALID_ARG, "--max-body %zu is below 1024 bytes", so->max_body_bytes); }
    kiln_engine_config ec = {so->max_batch, so->max_queue, so->step_tokens, so->prefix_cache, so->spec_max_batch};
    kiln_status st = kiln_engine_create(m, opts, &ec, &s->eng);
    if (st != KILN_OK) { free(s->cors_origin); free(s->api_key); free(s); return st; }
    kiln_server_probe_template(s); /* before the first request can arrive */
    st = kiln_server_choose_parsers(s, so);
    if (st == KILN_OK && so->spec_mtp && so->spec_k > 0 && !kiln_engine_mtp_ok(s->eng))
        st = kiln_fail(KILN_ERR_UNSUPPORTED, "--spec mtp: this model ships no MTP layer (num_nextn_predict_layers)");
    if (st == KILN_OK && so->test_forced_output) { /* the test hook: its tokens, then the first end id */
        int32_t *ids = NULL;
        size_t n = 0;
        if (!s->info.has_tokenizer) st = kiln_fail(KILN_ERR_INVALID_ARG, "--test-forced-output needs a model with a tokenizer");
        else st = kiln_tokenizer_encode(kiln_model_tokenizer(m), so->test_forced_output, strlen(so->test_forced_output), 0, 1, &ids, &n);
        if (st == KILN_OK && (s->forced = malloc((n + 1) * sizeof *s->forced)) == NULL) st = kiln_fail(KILN_ERR_NOMEM, "out of memory");
        if (st == KILN_OK) {
            memcpy(s->forced, ids, n * sizeof *ids);
            s->forced[n] = s->info.eos_id >= 0 ? s->info.eos_id : 0;
            s->n_forced = (int)n + (s->info.eos_id >= 0);
        }
        free(ids);
    }
    if (st != KILN_OK) { kiln_engine_free(s->eng); free(s->forced); free(s->cors_origin); free(s->api_key); free(s); return st; }

    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV | AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%d", so->port);
    int gr = getaddrinfo(so->host, port, &hints, &ai);
    if (gr != 0 || !ai) {
        kiln_engine_free(s->eng); free(s->forced); free(s->cors_origin); free(s->api_key); free(s);
        return kiln_fail(KILN_ERR_INVALID_ARG, "--host '%s': %s", so->host, gai_strerror(gr));
    }
    /* connections: a bounded pool of epoll threads (nothing in them blocks: a connection waiting
     * for the scheduler is suspended), a per-address limit, absolute header / body deadlines */
    s->header_to = so->header_timeout_s > 0 ? so->header_timeout_s : 30;
    s->body_to = so->body_timeout_s > 0 ? so->body_timeout_s : 60;
    unsigned per_ip = (unsigned)(so->max_conn_per_ip > 0 ? so->max_conn_per_ip : 64);
    unsigned threads = (unsigned)(so->http_threads > 0 ? so->http_threads : 4);
    unsigned max_conn = (unsigned)(so->max_connections > 0 ? so->max_connections : 512);
    pthread_mutex_init(&s->sup_mu, NULL);
    pthread_cond_init(&s->sup_cv, NULL);
    s->sup_running = pthread_create(&s->sup_th, NULL, supervisor, s) == 0;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL | MHD_ALLOW_SUSPEND_RESUME;
    if (ai->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
    if (s->sup_running)
        s->d = MHD_start_daemon(flags, (uint16_t)so->port, NULL, NULL, on_request, s,
                                MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                                MHD_OPTION_THREAD_POOL_SIZE, threads,
                                MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
                                MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                MHD_OPTION_CONNECTION_LIMIT, max_conn,
                                MHD_OPTION_PER_IP_CONNECTION_LIMIT, per_ip,
                                MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)ceil(s->header_to),
                                MHD_OPTION_END);
    freeaddrinfo(ai);
    if (!s->d) {
        if (s->sup_running) {
            pthread_mutex_lock(&s->sup_mu);
            s->sup_stop = 1;
            pthread_cond_signal(&s->sup_cv);
            pthread_mutex_unlock(&s->sup_mu);
            pthread_join(s->sup_th, NULL);
        }
        pthread_mutex_destroy(&s->sup_mu);
        pthread_cond_destroy(&s->sup_cv);
        kiln_engine_free(s->eng); free(s->forced); free(s->cors_origin); free(s->api_key); free(s);
        return kiln_fail(KILN_ERR_IO, "cannot listen on %s:%d (address in use or not available)", so->host, so->port);
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_LISTEN_FD);
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    s->port = so->port;
    if (di && getsockname(di->listen_fd, (struct sockaddr *)&ss, &sl) == 0)
        s->port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port : ((struct sockaddr_in *)&ss)->sin_port);
    if (!so->quiet) {
        kiln_engine_stats es;
        kiln_engine_get_stats(s->eng, &es);
        const kiln_kv_pool *pool = kiln_engine_pool(s->eng);
        kiln_kv_dtype dt = pool->cfg.dtype;
        const char *dtn = dt == KILN_KV_F32 ? "f32" : dt == KILN_KV_BF16 ? "bf16" : dt == KILN_KV_FP8 ? "fp8_e4m3" : "?";
        char dsa_note[256] = ""; /* sparse-attention models: what a KV row holds (docs/DSA.md) */
        kiln_kv_info kvi;
        if (kiln_kv_plan(s->m, opts, &kvi) == KILN_OK && kvi.dsa_index_key)
            snprintf(dsa_note, sizeof dsa_note, "kiln serve: sparse-attention KV rows: latent %d and indexer key %d as FP8 + a scale per 128, rope %d "
                     "in %s: %d bytes per token per layer\n", kvi.dsa_latent, kvi.dsa_index_key, kvi.dsa_rope, dtn, kvi.dsa_row_bytes);
        fprintf(stderr,
                "kiln serve: model '%s' (%s, %d layers, vocab %d), context %d tokens\n"
                "kiln serve: KV pool %s, %d pages × %d tokens = %lld tokens%s%s; max batch %d, queue %d, step %d tokens, prefix cache %s\n"
                "%s"
                "kiln serve: chat template: %s; %s; end-of-turn tokens: %s\n"
                "kiln serve: body limit %zu bytes, request timeout %g s, API key %s\n"
                "kiln serve: connections: %u (%u per address), header deadline %g s, body deadline %g s, %u HTTP threads\n"
                "kiln serve: listening on http://%s:%d\n",
                s->model_name, s->info.arch, s->info.n_layers, s->info.vocab_size, kiln_engine_context(s->eng), dtn, es.kv_pages_total,
                es.page_tokens, (long long)es.kv_capacity_tokens, dt == KILN_KV_FP8 ? ", fp8 scales: " : "",
                dt == KILN_KV_FP8 ? kiln_engine_kv_source(s->eng) : "", so->max_batch, so->max_queue,
                ec.step_tokens < so->max_batch ? so->max_batch : ec.step_tokens, so->prefix_cache ? "on" : "off", dsa_note, s->template_note, s->parsers_note, s->turn_note, so->max_body_bytes,
                so->request_timeout_s, s->api_key ? "required" : "off", max_conn, per_ip, s->header_to, s->body_to, threads, so->host, s->port);
        fflush(stderr);
    }
    *out = s;
    return KILN_OK;
}

int kiln_server_port(const kiln_server *s) { return s->port; }
int kiln_server_failed(const kiln_server *s) { return kiln_engine_failed(s->eng); }

kiln_status kiln_server_follow(kiln_model *m, const kiln_options *opts, const kiln_server_options *so, double timeout_s) {
    kiln_engine_config ec = {so->max_batch, so->max_queue, so->step_tokens, so->prefix_cache, so->spec_max_batch};
    return kiln_engine_follow(m, opts, &ec, timeout_s);
}

void kiln_server_stop(kiln_server *s) {
    if (!s) return;
    atomic_store(&s->closing, 1);
    /* 1. new work gets 503 at once — /health and every completion route, on new connections too:
     * the listener stays open through the grace period, so a load balancer's probe is answered
     * "shutting down" instead of hanging in the accept queue */
    kiln_engine_close(s->eng);
    /* 2. let in-flight requests finish for the grace period */
    double until = kiln_now() + s->o.shutdown_grace_s;
    for (;;) {
        kiln_engine_stats es;
        kiln_engine_get_stats(s->eng, &es);
        if ((es.waiting == 0 && es.running == 0 && atomic_load(&s->in_flight) == 0) || kiln_now() > until) break;
        usleep(20000);
    }
    /* 3. stop accepting connections, then cancel the rest: their handlers (resumed by the notify
     * hook) answer 503 / an error event */
    MHD_socket lfd = MHD_quiesce_daemon(s->d);
    kiln_engine_stop(s->eng);
    double answered = kiln_now() + 2;
    while (atomic_load(&s->in_flight) > 0 && kiln_now() < answered) usleep(10000);
    /* 4. nothing may stay suspended when the daemon stops (libmicrohttpd's rule) */
    pthread_mutex_lock(&s->sup_mu);
    s->sup_stop = 1;
    s->no_park = 1;
    pthread_cond_signal(&s->sup_cv);
    pthread_mutex_unlock(&s->sup_mu);
    pthread_join(s->sup_th, NULL);
    pthread_mutex_lock(&s->sup_mu);
    while (s->parked) unpark_locked(s, s->parked);
    pthread_mutex_unlock(&s->sup_mu);
    /* 5. close connections, free */
    MHD_stop_daemon(s->d);
    if (lfd != MHD_INVALID_SOCKET) close(lfd);
    kiln_engine_free(s->eng);
    pthread_mutex_destroy(&s->sup_mu);
    pthread_cond_destroy(&s->sup_cv);
    free(s->api_key);
    free(s->cors_origin);
    free(s->forced);
    free(s);
}
