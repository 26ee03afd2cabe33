/* test_chat_template.c — the chat template interpreter's C API (src/tokenizer/chat_template.h) and
 * kiln_chat_render / kiln_chat_render_path (src/model/chat_api.c).
 *
 * Expected renders are Python jinja2 3.1's output for the same template and variables (set up as
 * transformers does; tests/unit/test_chat_template_jinja.py compares hundreds more against jinja2
 * directly). Also: errors name the template, line and construct; hostile templates (deep recursion,
 * huge ranges and strings, invalid UTF-8) fail cleanly; a parsed template renders from several
 * threads at once; transformers' choice of named templates and the special-token variables. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln.h"
#include "tokenizer/chat_template.h"

static const char *shared_dir(void) {
    const char *s = getenv("SHARED");
    return s && *s ? s : "../shared";
}

static const char *tmp_dir(void) {
    static char dir[512];
    if (!dir[0]) {
        const char *t = getenv("TMPDIR");
        snprintf(dir, sizeof dir, "%s/kiln_test_ct_XXXXXX", t && *t ? t : "/tmp");
        assert_non_null(mkdtemp(dir));
    }
    return dir;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static json_t *J(const char *text) {
    json_error_t e;
    json_t *j = json_loads(text, JSON_DECODE_ANY, &e);
    if (!j) fail_msg("bad test JSON: %s", e.text);
    return j;
}

static const char *MSGS =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hi \\\"there\\\" \xf0\x9f\x98\x80\"},"
    "{\"role\":\"assistant\",\"content\":\"Hello!\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
    "\"arguments\":{\"x\":1.5,\"y\":[true,null]}}}]},{\"role\":\"user\",\"content\":\"Bye\"}]";

static const char *T1 =
    "{%- for m in messages -%}\n"
    "{%- if m.role == 'system' %}[SYS] {{ m.content }}\n"
    "{% elif m.role == 'user' -%}\n"
    "[U{{ loop.index }}] {{ m.content | trim }}\n"
    "{% else -%}\n"
    "[A] {{ m.content }}{% if m.tool_calls %} calls={{ m.tool_calls | map(attribute='function.name') | join(',') }} "
    "args={{ m.tool_calls[0].function.arguments | tojson }}{% endif %}\n"
    "\n"
    "{% endif -%}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt %}[A]{% endif %}";

/* jinja2's output for T1 (add_generation_prompt true; false drops the final "[A]") */
static const char *T1_OUT = "[SYS] Be brief.\n[U2] Hi \"there\" \xf0\x9f\x98\x80\n[A] Hello! calls=f args={\"x\": 1.5, "
                            "\"y\": [true, null]}\n[U4] Bye\n[A]";

static void test_render_basic(void **state) {
    (void)state;
    json_t *msgs = J(MSGS);
    char *out;
    size_t len;
    assert_int_equal(kiln_chat_template_apply(T1, msgs, NULL, 1, NULL, &out, &len), KILN_OK);
    assert_string_equal(out, T1_OUT);
    assert_int_equal(len, strlen(T1_OUT));
    free(out);
    assert_int_equal(kiln_chat_template_apply(T1, msgs, NULL, 0, NULL, &out, NULL), KILN_OK);
    assert_int_equal(strlen(out), strlen(T1_OUT) - 3);
    assert_memory_equal(out, T1_OUT, strlen(out));
    free(out);

    /* tools, namespace, extra variables; jinja2: "a,b n=2 <s>|True" */
    const char *t2 = "{% set ns = namespace(n=0) %}{% for t in tools %}{% set ns.n = ns.n + 1 %}{{ t.name }}"
                     "{{ ',' if not loop.last }}{% endfor %} n={{ ns.n }} {{ bos_token }}|{{ enable_thinking is defined }}";
    json_t *tools = J("[{\"name\":\"a\"},{\"name\":\"b\"}]"), *extra = J("{\"bos_token\":\"<s>\",\"enable_thinking\":false}");
    json_t *empty = J("[]");
    assert_int_equal(kiln_chat_template_apply(t2, empty, tools, 1, extra, &out, NULL), KILN_OK);
    assert_string_equal(out, "a,b n=2 <s>|True");
    free(out);
    /* tools absent = None: the loop over None fails as in jinja2 */
    assert_int_equal(kiln_chat_template_apply(t2, empty, NULL, 1, extra, &out, NULL), KILN_ERR_INVALID_ARG);
    assert_null(out);
    assert_non_null(strstr(kiln_last_error(), "'NoneType' object is not iterable"));
    json_decref(tools);
    json_decref(extra);
    json_decref(empty);
    json_decref(msgs);
}

static void expect_parse_error(const char *src, kiln_status st, const char *needle) {
    kiln_chat_template *t = (kiln_chat_template *)1;
    kiln_status got = kiln_chat_template_parse(src, strlen(src), "tmpl.jinja", &t);
    if (got != st) fail_msg("'%s': status %d, want %d (%s)", src, got, st, kiln_last_error());
    assert_null(t);
    if (!strstr(kiln_last_error(), needle)) fail_msg("'%s': error '%s' lacks '%s'", src, kiln_last_error(), needle);
}

static void test_errors(void **state) {
    (void)state;
    expect_parse_error("ok\n\n{% include 'x' %}", KILN_ERR_UNSUPPORTED, "tmpl.jinja:3: unsupported construct '{% include %}'");
    expect_parse_error("{{ x | xmlattr }}", KILN_ERR_UNSUPPORTED, "tmpl.jinja:1: unsupported construct 'filter xmlattr'");
    expect_parse_error("\n{% if x is frob %}{% endif %}", KILN_ERR_UNSUPPORTED, "tmpl.jinja:2: unsupported construct 'test frob'");
    expect_parse_error("{% for x in y recursive %}{% endfor %}", KILN_ERR_UNSUPPORTED, "recursive");
    expect_parse_error("{% for x in y %}", KILN_ERR_INVALID_ARG, "unexpected end of template: looking for 'endfor' or 'else'");
    expect_parse_error("{% endif %}", KILN_ERR_INVALID_ARG, "tmpl.jinja:1: unexpected '{% endif %}'");
    expect_parse_error("{{ 'abc }}", KILN_ERR_INVALID_ARG, "unterminated string");
    expect_parse_error("a\n{{ (1 ] }}", KILN_ERR_INVALID_ARG, "tmpl.jinja:2: unexpected ']', expected ')'");
    expect_parse_error("{# never closed", KILN_ERR_INVALID_ARG, "missing end of comment tag");
    expect_parse_error("bad \xff byte", KILN_ERR_INVALID_ARG, "invalid UTF-8 at byte 4");

    /* render errors carry the line of the failing expression */
    json_t *msgs = J("[]");
    char *out;
    assert_int_equal(kiln_chat_template_apply("line1\n{{ raise_exception('Only user and assistant roles') }}", msgs, NULL, 1,
                                              NULL, &out, NULL), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "chat_template:2: raise_exception: Only user and assistant roles"));
    assert_int_equal(kiln_chat_template_apply("\n\n{{ nope.attr }}", msgs, NULL, 1, NULL, &out, NULL), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "chat_template:3: 'nope' is undefined"));
    assert_int_equal(kiln_chat_template_apply("{{ messages[0].x.y }}", msgs, NULL, 1, NULL, &out, NULL), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "list object has no element 0"));
    assert_int_equal(kiln_chat_template_apply("{{ 10 ** 30 }}", msgs, NULL, 1, NULL, &out, NULL), KILN_ERR_UNSUPPORTED);
    assert_non_null(strstr(kiln_last_error(), "integer overflow"));
    json_t *notobj = J("[1]");
    assert_int_equal(kiln_chat_template_apply("x", msgs, NULL, 1, notobj, &out, NULL), KILN_ERR_INVALID_ARG);
    json_decref(notobj);
    json_decref(msgs);
}

/* hostile templates end with an error, not a crash or an exhausted machine */
static void test_limits(void **state) {
    (void)state;
    json_t *msgs = J("[]");
    char *out;
    assert_int_equal(kiln_chat_template_apply("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", msgs, NULL, 1, NULL,
                                              &out, NULL), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "recursion too deep"));
    assert_int_equal(kiln_chat_template_apply("{{ range(1000000000)|length }}", msgs, NULL, 1, NULL, &out, NULL),
                     KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "range too big"));
    assert_int_equal(kiln_chat_template_apply("{{ 'x' * 100000000000 }}", msgs, NULL, 1, NULL, &out, NULL), KILN_ERR_INVALID_ARG);
    /* doubling a string in a loop until the arena limit (256 MiB) stops it */
    assert_int_equal(kiln_chat_template_apply("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(40) %}"
                                              "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
                                              msgs, NULL, 1, NULL, &out, NULL), KILN_ERR_NOMEM);
    assert_non_null(strstr(kiln_last_error(), "out of memory"));
    /* 300 nested parentheses: parse depth limit */
    char deep[1000];
    size_t k = 0;
    k += (size_t)sprintf(deep, "{{ ");
    for (int i = 0; i < 300; i++) deep[k++] = '(';
    deep[k++] = '1';
    for (int i = 0; i < 300; i++) deep[k++] = ')';
    strcpy(deep + k, " }}");
    kiln_chat_template *t;
    assert_int_not_equal(kiln_chat_template_parse(deep, strlen(deep), NULL, &t), KILN_OK);
    json_decref(msgs);
}

/* ---- one parsed template, many threads ----------------------------------------------------------------- */
typedef struct { const kiln_chat_template *t; json_t *msgs; int ok; } thr_arg;
static void *render_thread(void *p) {
    thr_arg *a = p;
    a->ok = 1;
    for (int i = 0; i < 200; i++) {
        char *out = NULL;
        if (kiln_chat_template_render(a->t, a->msgs, NULL, 1, NULL, &out, NULL) != KILN_OK || strcmp(out, T1_OUT)) a->ok = 0;
        free(out);
    }
    return NULL;
}

static void test_threads(void **state) {
    (void)state;
    kiln_chat_template *t;
    assert_int_equal(kiln_chat_template_parse(T1, strlen(T1), "t1", &t), KILN_OK);
    json_t *msgs = J(MSGS);
    pthread_t th[4];
    thr_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_arg){t, msgs, 0};
        assert_int_equal(pthread_create(&th[i], NULL, render_thread, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_true(args[i].ok);
    }
    json_decref(msgs);
    kiln_chat_template_free(t);
}

/* ---- kiln_chat_render_path / kiln_chat_render -------------------------------------------------------------- */
static void test_render_path(void **state) {
    (void)state;
    /* Qwen3's own template from its tokenizer directory (jinja2 renders the same) */
    char p[1024];
    snprintf(p, sizeof p, "%s/tokenizers/qwen3", shared_dir());
    char *out;
    assert_int_equal(kiln_chat_render_path(p, NULL, "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, 1,
                                           "{\"enable_thinking\": false}", &out), KILN_OK);
    assert_string_equal(out, "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
    free(out);
    /* DeepSeek-V3 writes its bos_token variable (from tokenizer_config.json) */
    snprintf(p, sizeof p, "%s/tokenizers/deepseek-v3/tokenizer_config.json", shared_dir());
    assert_int_equal(kiln_chat_render_path(p, NULL, "[{\"role\":\"user\",\"content\":\"Hi\"}]", NULL, 0, NULL, &out), KILN_OK);
    assert_string_equal(out, "<\xef\xbd\x9c" "begin\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c><\xef\xbd\x9cUser\xef\xbd\x9c>Hi");
    free(out);

    /* named templates: "tool_use" when tools are given, else "default"; chat_template.jinja wins */
    char dir[700], cfg[800], jp[800];
    snprintf(dir, sizeof dir, "%s/named", tmp_dir());
    mkdir(dir, 0755);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    write_file(cfg, "{\"bos_token\": {\"content\": \"<B>\"}, \"eos_token\": \"<E>\", \"chat_template\": ["
                    "{\"name\": \"default\", \"template\": \"D{{ bos_token }}{{ eos_token }}{{ tools }}\"},"
                    "{\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}]}");
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[]", NULL, 1, NULL, &out), KILN_OK);
    assert_string_equal(out, "D<B><E>None");
    free(out);
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[]", "[{\"a\":1},{\"b\":2}]", 1, NULL, &out), KILN_OK);
    assert_string_equal(out, "T2");
    free(out);
    /* extra variables override the special tokens */
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[]", NULL, 1, "{\"bos_token\": \"<X>\"}", &out), KILN_OK);
    assert_string_equal(out, "D<X><E>None");
    free(out);
    snprintf(jp, sizeof jp, "%s/chat_template.jinja", dir);
    write_file(jp, "J{{ messages|length }}\n");
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[{}]", NULL, 1, NULL, &out), KILN_OK);
    assert_string_equal(out, "J1"); /* jinja2 drops the template's trailing newline */
    free(out);

    /* bad input */
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[{\"role\": ", NULL, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "messages: invalid JSON"));
    assert_int_equal(kiln_chat_render_path(dir, NULL, "{}", NULL, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[]", "{\"x\":1}", 1, NULL, &out), KILN_ERR_INVALID_ARG);
    assert_int_equal(kiln_chat_render_path("/nonexistent/dir", NULL, "[]", NULL, 1, NULL, &out), KILN_ERR_FORMAT);
    write_file(jp, "{% if %}");
    assert_int_equal(kiln_chat_render_path(dir, NULL, "[]", NULL, 1, NULL, &out), KILN_ERR_INVALID_ARG);
    assert_non_null(strstr(kiln_last_error(), "chat_template.jinja:1:"));
    unlink(jp);
}

/* kiln_chat_render on a loaded model reads the files beside it */
static void test_render_model(void **state) {
    (void)state;
    char dir[700], cfg[800];
    snprintf(dir, sizeof dir, "%s/model", tmp_dir());
    assert_int_equal(kiln_mkmodel("llama", "preset=tiny", "f32", 1, dir), KILN_OK);
    snprintf(cfg, sizeof cfg, "%s/tokenizer_config.json", dir);
    write_file(cfg, "{\"bos_token\": \"<s>\", \"chat_template\": \"{{ bos_token }}{% for m in messages %}[{{ m.role }}]"
                    "{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}\"}");
    kiln_options o;
    kiln_options_default(&o);
    o.quiet = 1;
    kiln_model *m;
    assert_int_equal(kiln_model_load(dir, &o, &m), KILN_OK);
    char *out;
    assert_int_equal(kiln_chat_render(m, "[{\"role\":\"user\",\"content\":\"hey\"}]", NULL, 1, NULL, &out), KILN_OK);
    assert_string_equal(out, "<s>[user]hey[assistant]");
    free(out);
    kiln_model_free(m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_render_basic), cmocka_unit_test(test_errors),      cmocka_unit_test(test_limits),
        cmocka_unit_test(test_threads),      cmocka_unit_test(test_render_path), cmocka_unit_test(test_render_model),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
