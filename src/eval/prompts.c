/* prompts.c — the prompt format of every task, following the lm-evaluation-harness task configs
 * (docs/EVAL.md shows each one beside the harness's template):
 *   arc_easy / arc_challenge: "Question: {q}\nAnswer:" + " {choice}"   (the data's query already
 *                             carries "Question: ")
 *   piqa:                     "Question: {goal}\nAnswer:" + " {sol}"
 *   openbook_qa:              "{question_stem}" + " {choice}"
 *   winogrande:               partial evaluation: context "{sentence up to _}{option}", scored
 *                             continuation " {rest of the sentence}"
 *   mmlu:                     description + 5 dev shots + "{q}\nA. ..\nB. ..\nC. ..\nD. ..\nAnswer:"
 *                             + " A" / " B" / " C" / " D"
 *   gsm8k:                    "Q: {q}\nA:" after the 8 chain-of-thought exemplars (gsm8k-cot) */
#include "eval/eval.h"
#include "base/status.h"
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void eval_mc_free(eval_mc *e) {
    for (int i = 0; i < e->n_choices; i++) {
        if (e->ctx) free(e->ctx[i]);
        if (e->cont) free(e->cont[i]);
    }
    free(e->ctx);
    free(e->cont);
    free(e->norm_len);
    memset(e, 0, sizeof *e);
}

/* ---- a tiny string builder ---------------------------------------------------------------------- */
typedef struct { char *s; size_t n, cap; int oom; } sb_t;
static void sb_put(sb_t *b, const char *s, size_t n) {
    if (b->oom) return;
    if (b->n + n + 1 > b->cap) {
        size_t c = b->cap ? b->cap : 256;
        while (c < b->n + n + 1) c *= 2;
        char *p = realloc(b->s, c);
        if (!p) { b->oom = 1; return; }
        b->s = p;
        b->cap = c;
    }
    memcpy(b->s + b->n, s, n);
    b->n += n;
    b->s[b->n] = 0;
}
static void sb_str(sb_t *b, const char *s) { sb_put(b, s, strlen(s)); }
static char *sb_done(sb_t *b) {
    if (b->oom) { free(b->s); return NULL; }
    if (!b->s) return strdup("");
    return b->s;
}

/* Python's str.strip() over ASCII whitespace. */
static void put_stripped(sb_t *b, const char *s) {
    size_t n = strlen(s);
    while (n && (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r' || *s == '\f' || *s == '\v')) { s++; n--; }
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == '\f' || s[n - 1] == '\v')) n--;
    sb_put(b, s, n);
}

/* ---- MMLU ----------------------------------------------------------------------------------------- */
/* doc_to_text: "{{question.strip()}}\nA. {{choices[0]}}\nB. ...\nD. {{choices[3]}}\nAnswer:" */
static void mmlu_question(sb_t *b, const eval_mmlu_row *r) {
    put_stripped(b, r->q);
    static const char *lab[4] = {"\nA. ", "\nB. ", "\nC. ", "\nD. "};
    for (int i = 0; i < 4; i++) {
        sb_str(b, lab[i]);
        sb_str(b, r->opt[i]);
    }
    sb_str(b, "\nAnswer:");
}

char *eval_mmlu_prompt(const char *subject, const eval_mmlu_row *shots, int n_shots, const eval_mmlu_row *q) {
    sb_t b = {0};
    /* description: "The following are multiple choice questions (with answers) about {subject}.\n\n" */
    sb_str(&b, "The following are multiple choice questions (with answers) about ");
    for (const char *p = subject; *p; p++) sb_put(&b, *p == '_' ? " " : p, 1);
    sb_str(&b, ".\n\n");
    /* shots: doc_to_text + target_delimiter " " + letter, joined by fewshot_delimiter "\n\n" */
    for (int i = 0; i < n_shots; i++) {
        mmlu_question(&b, &shots[i]);
        char t[4] = {' ', (char)('A' + shots[i].answer), 0, 0};
        sb_str(&b, t);
        sb_str(&b, "\n\n");
    }
    mmlu_question(&b, q);
    return sb_done(&b);
}

/* ---- JSONL multiple-choice tasks ------------------------------------------------------------------ */
static int why(char *w, size_t cap, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int why(char *w, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w, cap, fmt, ap);
    va_end(ap);
    return 0;
}

static char *cat2(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *s = malloc(la + lb + 1);
    if (!s) return NULL;
    memcpy(s, a, la);
    memcpy(s + la, b, lb + 1);
    return s;
}

static int alloc_choices(eval_mc *e, int n) {
    e->n_choices = n;
    e->ctx = calloc((size_t)n, sizeof *e->ctx);
    e->cont = calloc((size_t)n, sizeof *e->cont);
    e->norm_len = calloc((size_t)n, sizeof *e->norm_len);
    return e->ctx && e->cont && e->norm_len;
}

int eval_mc_from_json(const char *task, json_t *obj, eval_mc *out, char *w, size_t wcap) {
    memset(out, 0, sizeof *out);
    if (!json_is_object(obj)) return why(w, wcap, "not a JSON object");
    json_t *gold = json_object_get(obj, "gold");
    if (!json_is_integer(gold)) return why(w, wcap, "field \"gold\" is missing or not an integer");
    long long g = json_integer_value(gold);
    int wino = strcmp(task, "winogrande") == 0;
    json_t *arr = json_object_get(obj, wino ? "context_options" : "choices");
    const char *arr_name = wino ? "context_options" : "choices";
    if (!json_is_array(arr) || json_array_size(arr) < 2 || json_array_size(arr) > 64)
        return why(w, wcap, "field \"%s\" is missing or not an array of 2 to 64 strings", arr_name);
    int n = (int)json_array_size(arr);
    if (g < 0 || g >= n) return why(w, wcap, "field \"gold\" = %lld is not an index into the %d choices", g, n);
    for (int i = 0; i < n; i++)
        if (!json_is_string(json_array_get(arr, (size_t)i))) return why(w, wcap, "field \"%s\"[%d] is not a string", arr_name, i);
    const char *fixed; /* the part every choice shares: the query, or winogrande's continuation */
    json_t *f = json_object_get(obj, wino ? "continuation" : "query");
    if (!json_is_string(f)) return why(w, wcap, "field \"%s\" is missing or not a string", wino ? "continuation" : "query");
    fixed = json_string_value(f);
    if (!alloc_choices(out, n)) { eval_mc_free(out); return why(w, wcap, "out of memory"); }
    out->gold = (int)g;

    char *ctx = NULL;
    if (!wino) {
        sb_t b = {0};
        if (strcmp(task, "piqa") == 0 || strncmp(task, "arc_", 4) == 0) {
            /* "Question: {q}\nAnswer:"; the data's query is "Question: {q}" (ARC) or
             * "Question: {goal}\n" (PIQA): trailing whitespace dropped, the prefix added if absent. */
            const char *q = fixed;
            size_t n_q = strlen(q);
            while (n_q && (q[n_q - 1] == '\n' || q[n_q - 1] == ' ' || q[n_q - 1] == '\r')) n_q--;
            if (strncmp(q, "Question:", 9) != 0) sb_str(&b, "Question: ");
            sb_put(&b, q, n_q);
            sb_str(&b, "\nAnswer:");
        } else {
            sb_str(&b, fixed); /* openbook_qa: the question stem as it is */
        }
        ctx = sb_done(&b);
        if (!ctx) { eval_mc_free(out); return why(w, wcap, "out of memory"); }
    }
    for (int i = 0; i < n; i++) {
        const char *c = json_string_value(json_array_get(arr, (size_t)i));
        if (wino) {
            /* context = sentence[:blank] + option; continuation = " " + the rest */
            out->ctx[i] = strdup(c);
            out->cont[i] = cat2(" ", fixed);
            out->norm_len[i] = strlen(fixed);
        } else {
            out->ctx[i] = strdup(ctx);
            out->cont[i] = cat2(" ", c);
            out->norm_len[i] = strlen(c);
        }
        if (!out->ctx[i] || !out->cont[i]) { free(ctx); eval_mc_free(out); return why(w, wcap, "out of memory"); }
    }
    free(ctx);
    return 1;
}

/* ---- GSM8K chain-of-thought exemplars --------------------------------------------------------------- */
/* The eight exemplars of Wei et al. (2022), "Chain-of-Thought Prompting Elicits Reasoning in Large
 * Language Models", as lm-evaluation-harness's gsm8k-cot task uses them ("first_n" sampler). */
const char *const eval_gsm8k_cot_q[EVAL_GSM8K_COT_N] = {
    "There are 15 trees in the grove. Grove workers will plant trees in the grove today. After they are done, there will be 21 trees. How many trees did the grove workers plant today?",
    "If there are 3 cars in the parking lot and 2 more cars arrive, how many cars are in the parking lot?",
    "Leah had 32 chocolates and her sister had 42. If they ate 35, how many pieces do they have left in total?",
    "Jason had 20 lollipops. He gave Denny some lollipops. Now Jason has 12 lollipops. How many lollipops did Jason give to Denny?",
    "Shawn has five toys. For Christmas, he got two toys each from his mom and dad. How many toys does he have now?",
    "There were nine computers in the server room. Five more computers were installed each day, from monday to thursday. How many computers are now in the server room?",
    "Michael had 58 golf balls. On tuesday, he lost 23 golf balls. On wednesday, he lost 2 more. How many golf balls did he have at the end of wednesday?",
    "Olivia has $23. She bought five bagels for $3 each. How much money does she have left?",
};
const char *const eval_gsm8k_cot_a[EVAL_GSM8K_COT_N] = {
    "There are 15 trees originally. Then there were 21 trees after some more were planted. So there must have been 21 - 15 = 6. The answer is 6.",
    "There are originally 3 cars. 2 more cars arrive. 3 + 2 = 5. The answer is 5.",
    "Originally, Leah had 32 chocolates. Her sister had 42. So in total they had 32 + 42 = 74. After eating 35, they had 74 - 35 = 39. The answer is 39.",
    "Jason started with 20 lollipops. Then he had 12 after giving some to Denny. So he gave Denny 20 - 12 = 8. The answer is 8.",
    "Shawn started with 5 toys. If he got 2 toys each from his mom and dad, then that is 4 more toys. 5 + 4 = 9. The answer is 9.",
    "There were originally 9 computers. For each of 4 days, 5 more computers were added. So 5 * 4 = 20 computers were added. 9 + 20 is 29. The answer is 29.",
    "Michael started with 58 golf balls. After losing 23 on tuesday, he had 58 - 23 = 35. After losing 2 more, he had 35 - 2 = 33 golf balls. The answer is 33.",
    "Olivia had 23 dollars. 5 bagels for 3 dollars each will be 5 x 3 = 15 dollars. So she has 23 - 15 dollars left. 23 - 15 is 8. The answer is 8.",
};
