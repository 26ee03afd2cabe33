/* cmd_serve.c — `kiln serve MODEL ...` (the OpenAI-compatible server, see docs/SERVER.md) and
 * `kiln bench --server MODEL ...` (output tokens/s of the server at several concurrency levels,
 * measured over loopback HTTP by client threads in this process). Uses only kiln.h. */
#include "kiln_test.h"
#include "cli.h"
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int read_key_file(const char *path, char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t')) buf[--n] = 0;
    if (n == 0) return 0;
    *out = strdup(buf);
    return *out != NULL;
}

/* Ranks 1.. of `--tp`: follow rank 0's server until it stops (0), or end the whole job when rank 0
 * is lost (MPI_Abort: a supervisor restarts it). Frees m. */
static int follow_rank0(const char *cmd, kiln_model *m, const kiln_options *o, const kiln_server_options *so, double timeout_s) {
    kiln_status st = kiln_server_follow(m, o, so, timeout_s);
    kiln_model_free(m);
    if (st) kiln_dist_abort(cli_fail_status(cmd, st));
    kiln_dist_finalize();
    return 0;
}

/* Server options shared by serve and bench --server; returns 1 if argv[a->i] was consumed. */
static int server_option(args_t *a, kiln_server_options *so, char **key_owned) {
    const char *k = a->argv[a->i];
    long v;
    double d;
    int64_t mem;
    if (strcmp(k, "--host") == 0) { so->host = cli_value(a); return 1; }
    if (strcmp(k, "--port") == 0) { if (cli_long(a, k, cli_value(a), 0, 65535, &v)) so->port = (int)v; return 1; }
    if (strcmp(k, "--api-key") == 0) { so->api_key = cli_value(a); return 1; }
    if (strcmp(k, "--api-key-file") == 0) {
        const char *p = cli_value(a);
        if (p && !read_key_file(p, key_owned)) {
            fprintf(stderr, "kiln %s: error: option --api-key-file: cannot read a key from '%s'\n", a->cmd, p);
            a->bad = 1;
        } else if (p) so->api_key = *key_owned;
        return 1;
    }
    /* (--served-model-name: vLLM's spelling; --alias: llama.cpp's) */
    if (!strcmp(k, "--model-name") || !strcmp(k, "--served-model-name") || !strcmp(k, "--alias")) { so->model_name = cli_value(a); return 1; }
    if (strcmp(k, "--max-batch") == 0) { if (cli_long(a, k, cli_value(a), 1, 4096, &v)) so->max_batch = (int)v; return 1; }
    if (strcmp(k, "--max-queue") == 0) { if (cli_long(a, k, cli_value(a), 0, 1 << 20, &v)) so->max_queue = (int)v; return 1; }
    if (strcmp(k, "--step-tokens") == 0) { if (cli_long(a, k, cli_value(a), 1, 1 << 16, &v)) so->step_tokens = (int)v; return 1; }
    if (strcmp(k, "--no-prefix-cache") == 0) { so->prefix_cache = 0; return 1; }
    if (strcmp(k, "--max-connections") == 0) { if (cli_long(a, k, cli_value(a), 1, 1 << 16, &v)) so->max_connections = (int)v; return 1; }
    if (strcmp(k, "--max-body") == 0) {
        const char *s = cli_value(a);
        if (s && cli_mem(a, s, &mem)) so->max_body_bytes = (size_t)mem;
        return 1;
    }
    if (strcmp(k, "--request-timeout") == 0) { if (cli_float(a, k, cli_value(a), 0, 1e7, &d)) so->request_timeout_s = d; return 1; }
    if (strcmp(k, "--shutdown-grace") == 0) { if (cli_float(a, k, cli_value(a), 0, 1e6, &d)) so->shutdown_grace_s = d; return 1; }
    if (strcmp(k, "--max-conn-per-ip") == 0) { if (cli_long(a, k, cli_value(a), 1, 1 << 16, &v)) so->max_conn_per_ip = (int)v; return 1; }
    if (strcmp(k, "--header-timeout") == 0) { if (cli_float(a, k, cli_value(a), 0.05, 1e6, &d)) so->header_timeout_s = d; return 1; }
    if (strcmp(k, "--body-timeout") == 0) { if (cli_float(a, k, cli_value(a), 0.05, 1e6, &d)) so->body_timeout_s = d; return 1; }
    if (strcmp(k, "--http-threads") == 0) { if (cli_long(a, k, cli_value(a), 1, 256, &v)) so->http_threads = (int)v; return 1; }
    if (strcmp(k, "--tool-parser") == 0) { so->tool_parser = cli_value(a); return 1; }            /* checked at start */
    if (strcmp(k, "--cors-origin") == 0) { so->cors_origin = cli_value(a); return 1; }
    if (strcmp(k, "--reasoning-parser") == 0) { so->reasoning_parser = cli_value(a); return 1; }  /* checked at start */
    if (strcmp(k, "--spec") == 0) { /* docs/SPECULATIVE.md: drafts for every request (its "speculative" field overrides) */
        const char *m = cli_value(a);
        if (m && !strcmp(m, "ngram")) { so->spec_mtp = 0; if (!so->spec_k) so->spec_k = 4; }
        else if (m && !strcmp(m, "mtp")) { so->spec_mtp = 1; if (!so->spec_k) so->spec_k = 3; }
        else if (m && !strcmp(m, "off")) so->spec_k = 0;
        else if (m) { fprintf(stderr, "kiln %s: error: option --spec: '%s' is not one of ngram, mtp, off\n", a->cmd, m); a->bad = 1; }
        return 1;
    }
    if (strcmp(k, "--spec-k") == 0) { if (cli_long(a, k, cli_value(a), 1, 16, &v)) so->spec_k = (int)v; return 1; }
    if (strcmp(k, "--spec-ngram") == 0) { if (cli_long(a, k, cli_value(a), 1, 16, &v)) so->spec_ngram = (int)v; return 1; }
    if (strcmp(k, "--spec-max-batch") == 0) { if (cli_long(a, k, cli_value(a), 1, 4096, &v)) so->spec_max_batch = (int)v; return 1; }
    if (strcmp(k, "--test-forced-output") == 0) { so->test_forced_output = cli_value(a); return 1; } /* test hook (docs/SERVER.md) */
    return 0;
}

#define SERVE_USAGE \
    "usage: kiln serve MODEL [--host 127.0.0.1] [--port 8080] [--api-key KEY | --api-key-file FILE] [--model-name NAME (also --served-model-name, --alias)]\n" \
    "         [--max-batch 32] [--max-queue 64] [--step-tokens 256] [--no-prefix-cache] [--max-body 1M]\n" \
    "         [--request-timeout 600] [--shutdown-grace 10] [--max-connections 512] [--max-conn-per-ip 64]\n" \
    "         [--header-timeout 30] [--body-timeout 60] [--http-threads 4]\n" \
    "         [--tool-parser auto|glm45|glm47|kimi_k2|none] [--reasoning-parser auto|think|none] [--cors-origin ORIGIN|*]\n" \
    "         [--kv-mem SIZE] [--kv-dtype auto|f32|bf16|fp8] [--kv-page 16] [--ctx N] [--threads N] [--isa ...] [--device cpu|ref|vulkan[:N]] [--fp8-gemv auto|exact|bf16]\n" \
    "         [--kv-integrity off|detect|heal|strict] [--inject-kv-faults SPEC] [--tp N under mpirun -np N] [--ep 1|N] [--tp-timeout 30]\n" \
    "         [--spec ngram|mtp|off] [--spec-k 4 (mtp: 3)] [--spec-ngram 3] [--spec-max-batch 2]"

int cmd_serve(int argc, char **argv) {
    args_t a = {argc, argv, 0, "serve", 0};
    kiln_options o;
    kiln_options_default(&o);
    kiln_server_options so;
    kiln_server_options_default(&so);
    char *key_owned = NULL;
    const char *model_path = NULL;
    long tp = 1, ep = 1;
    double tp_timeout = 30;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (cli_common_option(&a, &o) || server_option(&a, &so, &key_owned)) continue;
        if (strcmp(k, "--tp") == 0) { cli_long(&a, k, cli_value(&a), 1, 1024, &tp); continue; }                 /* docs/SCALE.md */
        if (strcmp(k, "--ep") == 0) { cli_long(&a, k, cli_value(&a), 1, 1024, &ep); continue; }                 /* experts spread over the --tp ranks */
        if (strcmp(k, "--tp-timeout") == 0) { cli_float(&a, k, cli_value(&a), 0, 1e6, &tp_timeout); continue; } /* 0 = wait forever */
        if (strcmp(k, "-h") == 0 || strcmp(k, "--help") == 0) { fprintf(stderr, "%s\n", SERVE_USAGE); free(key_owned); return 0; }
        if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln serve: error: unknown option '%s'\n", k); free(key_owned); return 2; }
        if (model_path) { fprintf(stderr, "kiln serve: error: unexpected argument '%s'\n", k); free(key_owned); return 2; }
        model_path = k;
    }
    if (a.bad) { free(key_owned); return 2; }
    if (!model_path) { free(key_owned); return cli_fail_msg("serve", SERVE_USAGE); }
    if (ep > 1 && tp < 2) { free(key_owned); return cli_fail_msg("serve", "--ep spreads the experts over the --tp ranks: give --tp N (under mpirun -np N) as well"); }

    /* SIGINT / SIGTERM are taken by sigwait below: block them before any thread starts so that
     * every thread inherits the mask. A closed client socket must not kill the process. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    kiln_model *m;
    kiln_status st;
    int rank = 0;
    if (tp > 1) {
        /* --tp N under `mpirun -np N`: rank 0 serves HTTP and schedules; the others follow its
         * steps on their shards (docs/SCALE.md). Every collective waits at most --tp-timeout. */
        int trc = cli_tp_load("serve", &argc, &argv, tp, ep, model_path, &o, &m, &rank);
        if (trc) { free(key_owned); return trc; }
        kiln_dist_set_deadline(tp_timeout);
        if (rank > 0) {
            free(key_owned);
            return follow_rank0("serve", m, &o, &so, tp_timeout);
        }
    } else if ((st = kiln_model_load(model_path, &o, &m))) { free(key_owned); return cli_fail_status("serve", st); }
    kiln_server *srv;
    st = kiln_server_start(m, model_path, &o, &so, &srv);
    if (st) {
        kiln_model_free(m);
        free(key_owned);
        int rc = cli_fail_status("serve", st);
        if (tp > 1) kiln_dist_abort(rc); /* the other ranks wait for a scheduler that will not come */
        return rc;
    }
    if (tp > 1) fprintf(stderr, "kiln serve: tensor parallel over %ld ranks (rank 0 serves, pid %ld; a rank silent for %g s ends the job)\n", tp, (long)getpid(), tp_timeout);
    /* wait for SIGINT / SIGTERM, looking every 200 ms whether the server lost a rank */
    int sig = 0, failed = 0;
    const struct timespec poll_ts = {0, 200 * 1000000};
    while (!failed) {
        sig = sigtimedwait(&sigs, NULL, &poll_ts);
        if (sig > 0) break;
        failed = kiln_server_failed(srv);
    }
    if (failed) fprintf(stderr, "kiln serve: error: %s: in-flight requests were answered with errors; stopping\n", kiln_dist_failure());
    else fprintf(stderr, "kiln serve: %s: stopping (in-flight requests get %g s to finish)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", so.shutdown_grace_s);
    kiln_server_stop(srv);
    kiln_model_free(m);
    free(key_owned);
    fprintf(stderr, "kiln serve: stopped\n");
    if (failed) kiln_dist_abort(1); /* MPI_Finalize would wait for the lost rank forever */
    if (tp > 1) kiln_dist_finalize();
    return failed;
}

/* ---- bench --server ------------------------------------------------------------------------------------------ */
typedef struct {
    int port, id, requests, max_tokens, prompt_tokens, vocab;
    long tokens;
    double latency_sum;
    int errors;
} bench_client;

/* One POST over a fresh loopback connection; returns completion_tokens from usage, -1 on error. */
static long http_completion(int port, const char *body) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return -1;
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET;
    sa.sin_port = htons((uint16_t)port);
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) { close(fd); return -1; }
    char head[256];
    int hn = snprintf(head, sizeof head, "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                         "Content-Length: %zu\r\nConnection: close\r\n\r\n", strlen(body));
    if (send(fd, head, (size_t)hn, MSG_NOSIGNAL) != hn || send(fd, body, strlen(body), MSG_NOSIGNAL) != (ssize_t)strlen(body)) { close(fd); return -1; }
    size_t cap = 1 << 16, len = 0;
    char *resp = malloc(cap);
    for (;;) {
        if (len + 4096 > cap) { cap *= 2; char *p = realloc(resp, cap); if (!p) break; resp = p; }
        ssize_t k = recv(fd, resp + len, cap - len - 1, 0);
        if (k <= 0) break;
        len += (size_t)k;
    }
    close(fd);
    resp[len] = 0;
    long n = -1;
    const char *u = strstr(resp, "\"completion_tokens\":");
    if (strncmp(resp, "HTTP/1.1 200", 12) == 0 && u) n = strtol(u + 20, NULL, 10);
    free(resp);
    return n;
}

static void *bench_thread(void *arg) {
    bench_client *c = arg;
    char *body = malloc((size_t)c->prompt_tokens * 12 + 256);
    for (int r = 0; r < c->requests; r++) {
        /* distinct prompts per client and request, so the prefix cache does not help */
        size_t k = (size_t)sprintf(body, "{\"model\":\"bench\",\"max_tokens\":%d,\"temperature\":0,\"ignore_eos\":true,\"prompt\":[", c->max_tokens);
        uint64_t x = 0x9E3779B97F4A7C15ull * (uint64_t)(c->id * 1000 + r + 1);
        for (int i = 0; i < c->prompt_tokens; i++) {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17;
            k += (size_t)sprintf(body + k, "%s%d", i ? "," : "", (int)(x % (uint64_t)(c->vocab > 3 ? c->vocab - 3 : 1)) + 3);
        }
        strcpy(body + k, "]}");
        double t0 = kiln_now();
        long n = http_completion(c->port, body);
        c->latency_sum += kiln_now() - t0;
        if (n < 0) c->errors++;
        else c->tokens += n;
    }
    free(body);
    return NULL;
}

int cmd_bench_server(int argc, char **argv) {
    args_t a = {argc, argv, 0, "bench", 0};
    kiln_options o;
    kiln_options_default(&o);
    kiln_server_options so;
    kiln_server_options_default(&so);
    char *key_owned = NULL;
    const char *model_path = NULL, *levels = "1,4,16";
    long reqs = 2, max_tokens = 32, prompt_tokens = 32, tp = 1, ep = 1;
    int json = 0;
    for (a.i = 1; a.i < argc && !a.bad; a.i++) {
        const char *k = argv[a.i];
        if (strcmp(k, "--server") == 0) continue;
        if (cli_common_option(&a, &o) || server_option(&a, &so, &key_owned)) continue;
        if (strcmp(k, "--concurrency") == 0) levels = cli_value(&a);
        else if (strcmp(k, "--requests") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &reqs);
        else if (strcmp(k, "--max-tokens") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &max_tokens);
        else if (strcmp(k, "--prompt-tokens") == 0) cli_long(&a, k, cli_value(&a), 1, 1 << 20, &prompt_tokens);
        else if (strcmp(k, "--json") == 0) json = 1;
        else if (strcmp(k, "--tp") == 0) cli_long(&a, k, cli_value(&a), 1, 1024, &tp); /* under mpirun -np N (docs/SCALE.md) */
        else if (strcmp(k, "--ep") == 0) cli_long(&a, k, cli_value(&a), 1, 1024, &ep);
        else if (k[0] == '-' && k[1]) { fprintf(stderr, "kiln bench: error: unknown option '%s'\n", k); free(key_owned); return 2; }
        else if (!model_path) model_path = k;
        else { fprintf(stderr, "kiln bench: error: unexpected argument '%s'\n", k); free(key_owned); return 2; }
    }
    free(key_owned);
    if (a.bad) return 2;
    if (!model_path)
        return cli_fail_msg("bench", "usage: kiln bench --server MODEL [--concurrency 1,4,16] [--requests N per client] [--max-tokens N] "
                                     "[--prompt-tokens N] [--json] [--tp N under mpirun -np N] [--ep 1|N] [serve options]");
    if (ep > 1 && tp < 2) return cli_fail_msg("bench", "--ep spreads the experts over the --tp ranks: give --tp N (under mpirun -np N) as well");
    int32_t *lv = NULL;
    int n_lv = 0;
    if (!cli_ids(&a, levels, &lv, &n_lv) || n_lv == 0) return 2;
    signal(SIGPIPE, SIG_IGN);
    kiln_model *m;
    kiln_status st;
    int rank = 0;
    if (tp > 1) { /* rank 0 serves and measures; the others follow its steps */
        int trc = cli_tp_load("bench", &argc, &argv, tp, ep, model_path, &o, &m, &rank);
        if (trc) { free(lv); return trc; }
    } else if ((st = kiln_model_load(model_path, &o, &m))) { free(lv); return cli_fail_status("bench", st); }
    kiln_model_info info;
    kiln_model_get_info(m, &info);
    int maxc = 1;
    for (int i = 0; i < n_lv; i++) if (lv[i] > maxc) maxc = lv[i];
    so.host = "127.0.0.1";
    so.port = 0;
    so.api_key = NULL;
    so.model_name = "bench";
    so.quiet = 1;
    so.prefix_cache = 0;
    if (so.max_batch < maxc) so.max_batch = maxc;
    if (so.max_queue < maxc) so.max_queue = maxc;
    if (so.max_conn_per_ip < maxc + 8) so.max_conn_per_ip = maxc + 8; /* every bench client is 127.0.0.1 */
    if (so.max_connections < maxc + 8) so.max_connections = maxc + 8;
    if (rank > 0) {
        free(lv);
        return follow_rank0("bench", m, &o, &so, 0);
    }
    kiln_server *srv;
    st = kiln_server_start(m, model_path, &o, &so, &srv);
    if (st) { kiln_model_free(m); free(lv); int rc = cli_fail_status("bench", st); if (tp > 1) kiln_dist_abort(rc); return rc; }
    int port = kiln_server_port(srv);
    if (!json) printf("kiln bench --server %s: %ld prompt tokens, %ld output tokens per request, %ld requests per client, greedy\n"
                      "concurrency  requests  output_tokens  seconds  output_tok/s  mean_latency_s\n", model_path, prompt_tokens, max_tokens, reqs);
    else printf("{\"model\":\"%s\",\"prompt_tokens\":%ld,\"max_tokens\":%ld,\"requests_per_client\":%ld,\"levels\":[", model_path, prompt_tokens, max_tokens, reqs);
    int rc = 0;
    for (int li = 0; li < n_lv; li++) {
        int C = lv[li] > 0 ? lv[li] : 1;
        bench_client *cl = calloc((size_t)C, sizeof *cl);
        pthread_t *th = calloc((size_t)C, sizeof *th);
        double t0 = kiln_now();
        for (int i = 0; i < C; i++) {
            cl[i] = (bench_client){port, li * 4096 + i, (int)reqs, (int)max_tokens, (int)prompt_tokens, info.vocab_size, 0, 0, 0};
            pthread_create(&th[i], NULL, bench_thread, &cl[i]);
        }
        long tokens = 0, errors = 0;
        double lat = 0;
        for (int i = 0; i < C; i++) {
            pthread_join(th[i], NULL);
            tokens += cl[i].tokens;
            errors += cl[i].errors;
            lat += cl[i].latency_sum;
        }
        double dt = kiln_now() - t0;
        long nreq = (long)C * reqs;
        if (!json) printf("%11d  %8ld  %13ld  %7.2f  %12.1f  %14.2f%s\n", C, nreq, tokens, dt, tokens / dt, lat / (double)nreq, errors ? "  (errors!)" : "");
        else printf("%s{\"concurrency\":%d,\"requests\":%ld,\"output_tokens\":%ld,\"seconds\":%.3f,\"output_tokens_per_s\":%.2f,\"mean_latency_s\":%.3f,\"errors\":%ld}",
                    li ? "," : "", C, nreq, tokens, dt, tokens / dt, lat / (double)nreq, errors);
        fflush(stdout);
        if (errors) rc = 1;
        free(cl);
        free(th);
    }
    if (json) printf("]}\n");
    kiln_server_stop(srv);
    kiln_model_free(m);
    free(lv);
    if (tp > 1) {
        double secs;
        unsigned long long calls, bytes;
        kiln_dist_stats(&secs, &calls, &bytes);
        fprintf(stderr, "tensor parallel: %ld ranks, rank 0 spent %.3f s in %llu all-reduces (%.1f KiB each on average)\n", tp, secs, calls,
                calls ? (double)bytes / (double)calls / 1024.0 : 0.0);
        kiln_dist_finalize();
    }
    return rc;
}
