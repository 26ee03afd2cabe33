/* cli.h — shared helpers of the kiln subcommands (tools/cmd_*.c): argument parsing with errors
 * that name the option and value, and one-line error printing. Subcommands use only kiln.h. */
#ifndef KILN_TOOLS_CLI_H
#define KILN_TOOLS_CLI_H
#include "kiln.h"
#include <stdint.h>
#include <stdio.h>

typedef struct { int argc; char **argv; int i; const char *cmd; int bad; } args_t;

int cli_fail_status(const char *cmd, kiln_status st); /* prints "kiln CMD: error: ..."; returns 1 */
int cli_fail_msg(const char *cmd, const char *msg);   /* returns 2 (usage errors) */
const char *cli_value(args_t *a);                     /* the value after argv[a->i]; sets a->bad if none */
int cli_long(args_t *a, const char *opt, const char *s, long lo, long hi, long *out);
int cli_float(args_t *a, const char *opt, const char *s, double lo, double hi, double *out);
int cli_mem(args_t *a, const char *s, int64_t *out);  /* 512M, 2G, 40% */
/* --threads --kv-mem --kv-page --ctx --kv-dtype --kv-scale static|dynamic --kv-scales FILE --isa
 * --kv-integrity off|detect|heal|strict --inject-kv-faults SPEC;
 * returns 1 if argv[a->i] was consumed. */
int cli_common_option(args_t *a, kiln_options *o);
int cli_ids(args_t *a, const char *s, int32_t **ids, int *n);
/* q[0], q[1], q[2] = the 25th percentile, median and 75th percentile of v[0..n) (zeros when n < 1 or
 * out of memory): the benches' round statistics. */
void cli_quartiles(const double *v, long n, double q[3]);
/* One line "kv integrity: ..."  with a session's counters (tools/cmd_integrity.c); nothing when off. */
void cli_print_integrity(FILE *f, const kiln_kv_integrity_stats *st);

/* `--tp N` under `mpirun -np N` (docs/SCALE.md): starts MPI, checks the process count, has every
 * rank agree on --tp, --ep (1, or tp: expert parallelism), the model path, --kv-dtype and --kv-integrity, silences the other ranks'
 * stdout (and o->quiet), loads the model and keeps this rank's shard with MPI's all-reduce. On
 * failure prints the error, finalizes MPI and returns the exit code (else 0: *m and *rank set). */
int cli_tp_load(const char *cmd, int *argc, char ***argv, long tp, long ep, const char *model_path, kiln_options *o, kiln_model **m, int *rank);

/* Subcommands, one file each (tools/cmd_*.c). argv[0] is the subcommand name. */
int cmd_run(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_mkmodel(int argc, char **argv);
int cmd_quantize(int argc, char **argv);      /* tools/cmd_quantize.c */
int cmd_bench(int argc, char **argv);         /* tools/cmd_bench.c: weights / KV bench; dispatches: */
int cmd_bench_integrity(int argc, char **argv); /* tools/cmd_integrity.c (bench --integrity) */
int cmd_bench_server(int argc, char **argv);  /* tools/cmd_serve.c (bench --server) */
int cmd_bench_tokenizer(int argc, char **argv); /* tools/cmd_tokenize.c (bench --tokenizer) */
int cmd_bench_attention(int argc, char **argv); /* tools/cmd_bench.c (bench --attention: the attention kernels alone) */
int cmd_bench_gemv(int argc, char **argv);      /* tools/cmd_bench.c (bench --gemv: one format's GEMV streaming rate) */
int cmd_bench_batch(int argc, char **argv);     /* tools/cmd_bench.c (bench --batch: aggregate batched decode) */
int cmd_bench_spec(int argc, char **argv);      /* tools/cmd_bench_spec.c (bench --spec: speculative decoding vs off) */
int cmd_calibrate(int argc, char **argv);     /* tools/cmd_kv.c */
int cmd_inspect_kv(int argc, char **argv);    /* tools/cmd_kv.c (inspect --kv) */
int kv_bench(int argc, char **argv);           /* tools/cmd_kv.c (bench --kv-context: FP8 vs BF16 KV speed / quality) */
int cmd_verify(int argc, char **argv);        /* tools/cmd_integrity.c */
int cmd_serve(int argc, char **argv);         /* tools/cmd_serve.c */
int cmd_eval(int argc, char **argv);          /* tools/cmd_eval.c */
int cmd_tokenize(int argc, char **argv);      /* tools/cmd_tokenize.c */
int cmd_chat_template(int argc, char **argv); /* tools/cmd_tokenize.c */
#endif
