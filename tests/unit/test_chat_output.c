/* test_chat_output.c — the reasoning / content / tool-call split of generated chat text
 * (src/server/chat_output.c). Expected values are written here by hand from the formats GLM-4.x and
 * Kimi K2 publish and from vLLM's glm45 / kimi_k2 tool parsers and deepseek_r1 reasoning parser
 * (docs/SERVER.md, "Tools and reasoning"): content before the first call, whitespace-only content
 * null, argument values typed by the tool's declared schema, Python's json.dumps spacing, Kimi's
 * "functions.NAME:IDX" ids. Every case is also fed one byte at a time (as streaming delivers text)
 * and must give the same split, with no marker text leaking into a delta. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include "server/chat_output.h"

static const char *TOOLS =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":"
    "{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"zip\":{\"type\":\"string\"},\"metric\":{\"type\":\"boolean\"}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"search\",\"parameters\":{\"type\":\"object\",\"properties\":{\"q\":{\"type\":\"string\"}}}}}]";

typedef struct {
    json_t *content, *reasoning, *calls;
    kiln_sbuf dcontent, dreasoning; /* the deltas concatenated */
    json_t *dcalls;
} split;

static int opened; /* the prompt ended inside "<think>" */
static void run(kiln_tool_parser tp, kiln_reasoning_parser rp, const char *text, size_t step, const char *only, int single, split *out) {
    json_error_t e;
    json_t *tools = json_loads(TOOLS, 0, &e);
    assert_non_null(tools);
    kiln_chat_out o;
    kiln_chat_out_init(&o, tp, rp, opened, tools, only, single);
    kiln_chat_delta d = {0};
    memset(out, 0, sizeof *out);
    out->dcalls = json_array();
    const size_t n = strlen(text);
    for (size_t i = 0; i <= n; i += step) {
        const size_t k = i + step <= n ? step : n - i;
        kiln_chat_out_push(&o, text + i, k, i + step > n, &d);
        kiln_sbuf_put(&out->dcontent, d.content.p, d.content.len);
        kiln_sbuf_put(&out->dreasoning, d.reasoning.p, d.reasoning.len);
        size_t j;
        json_t *c;
        json_array_foreach(d.calls, j, c) json_array_append(out->dcalls, c);
    }
    kiln_chat_delta_free(&d);
    out->content = kiln_chat_out_content(&o);
    out->reasoning = kiln_chat_out_reasoning(&o);
    out->calls = json_deep_copy(o.calls);
    kiln_chat_out_free(&o);
    json_decref(tools);
}
static void split_free(split *s) {
    json_decref(s->content); json_decref(s->reasoning); json_decref(s->calls); json_decref(s->dcalls);
    kiln_sbuf_free(&s->dcontent); kiln_sbuf_free(&s->dreasoning);
}

/* Runs text whole and byte by byte; checks content (NULL = JSON null), reasoning (NULL = absent)
 * and the calls' names and arguments (names[i], args[i]); returns the whole run's calls. */
static void check(kiln_tool_parser tp, kiln_reasoning_parser rp, const char *text, const char *content, const char *reasoning, int n_calls,
                  const char *const *names, const char *const *args, const char *only, int single, const char *const *ids) {
    for (int pass = 0; pass < 2; pass++) {
        split s;
        run(tp, rp, text, pass ? 1 : strlen(text) + 1, only, single, &s);
        if (content) {
            assert_true(json_is_string(s.content));
            assert_string_equal(json_string_value(s.content), content);
        } else {
            assert_true(json_is_null(s.content));
        }
        if (reasoning) {
            assert_non_null(s.reasoning);
            assert_string_equal(json_string_value(s.reasoning), reasoning);
        } else {
            assert_null(s.reasoning);
        }
        /* the deltas add up to the whole: content (when not null), reasoning, calls */
        if (content && s.dcontent.len) assert_memory_equal(s.dcontent.p, content, strlen(content));
        if (content) assert_int_equal(s.dcontent.len, strlen(content));
        if (reasoning) { assert_int_equal(s.dreasoning.len, strlen(reasoning)); if (s.dreasoning.len) assert_memory_equal(s.dreasoning.p, reasoning, strlen(reasoning)); }
        assert_int_equal(json_array_size(s.calls), n_calls);
        assert_int_equal(json_array_size(s.dcalls), n_calls);
        for (int i = 0; i < n_calls; i++) {
            json_t *c = json_array_get(s.calls, (size_t)i), *f = json_object_get(c, "function"), *dc = json_array_get(s.dcalls, (size_t)i);
            assert_string_equal(json_string_value(json_object_get(c, "type")), "function");
            assert_string_equal(json_string_value(json_object_get(f, "name")), names[i]);
            assert_string_equal(json_string_value(json_object_get(f, "arguments")), args[i]);
            assert_int_equal(json_integer_value(json_object_get(dc, "index")), i);
            assert_string_equal(json_string_value(json_object_get(json_object_get(dc, "function"), "arguments")), args[i]);
            const char *id = json_string_value(json_object_get(c, "id"));
            assert_non_null(id);
            if (ids) assert_string_equal(id, ids[i]);
            else { /* chatcmpl-tool- + 32 lowercase hex digits */
                assert_int_equal(strlen(id), 14 + 32);
                assert_memory_equal(id, "chatcmpl-tool-", 14);
                for (int k = 14; k < 46; k++) assert_non_null(strchr("0123456789abcdef", id[k]));
            }
        }
        split_free(&s);
    }
}

static void test_glm_calls(void **st) {
    (void)st;
    /* GLM-4.6's format after "<|assistant|>": typed values by the declared schema (city, zip:
     * string even when they look like numbers; days: integer; metric: boolean from Python's True) */
    const char *t = "\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>東京</arg_value>\n<arg_key>days</arg_key>\n"
                    "<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>01234</arg_value>\n<arg_key>metric</arg_key>\n"
                    "<arg_value>True</arg_value>\n</tool_call>";
    const char *n1[] = {"get_weather"}, *a1[] = {"{\"city\": \"東京\", \"days\": 3, \"zip\": \"01234\", \"metric\": true}"};
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, t, NULL, NULL, 1, n1, a1, NULL, 0, NULL);
    /* text before the first call is content; text after / between calls is dropped; two calls */
    const char *t2 = "Let me look.<tool_call>search\n<arg_key>q</arg_key>\n<arg_value> kiln </arg_value>\n</tool_call>\nand "
                     "<tool_call>get_weather<arg_key>city</arg_key>\\n<arg_value>Paris</arg_value></tool_call>trailing";
    const char *n2[] = {"search", "get_weather"}, *a2[] = {"{\"q\": \"kiln\"}", "{\"city\": \"Paris\"}"};
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, t2, "Let me look.", NULL, 2, n2, a2, NULL, 0, NULL);
    /* parallel_tool_calls false keeps the first; a named tool_choice keeps that function's */
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, t2, "Let me look.", NULL, 1, n2, a2, NULL, 1, NULL);
    const char *n3[] = {"get_weather"}, *a3[] = {"{\"city\": \"Paris\"}"};
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, t2, "Let me look.", NULL, 1, n3, a3, "get_weather", 0, NULL);
    /* an undeclared function: values read as JSON (object, number) else kept as strings */
    const char *t4 = "<tool_call>other\n<arg_key>o</arg_key><arg_value>{\"a\": [1, 2]}</arg_value><arg_key>x</arg_key><arg_value>1.5</arg_value>"
                     "<arg_key>s</arg_key><arg_value>plain words</arg_value><arg_key>q</arg_key><arg_value>'quoted'</arg_value></tool_call>";
    const char *n4[] = {"other"}, *a4[] = {"{\"o\": {\"a\": [1, 2]}, \"x\": 1.5, \"s\": \"plain words\", \"q\": \"quoted\"}"};
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, t4, NULL, NULL, 1, n4, a4, NULL, 0, NULL);
    /* a call with no arguments */
    const char *n5[] = {"search"}, *a5[] = {"{}"};
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, "<tool_call>search</tool_call>", NULL, NULL, 1, n5, a5, NULL, 0, NULL);
    /* no call, or an unfinished one: the text is content, "<tool_" kept as written */
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, "a < b and <tool_ is not a call", "a < b and <tool_ is not a call", NULL, 0, NULL, NULL, NULL, 0, NULL);
    check(KILN_TOOLS_GLM45, KILN_REASONING_NONE, "x <tool_call>search\n<arg_key>q", "x <tool_call>search\n<arg_key>q", NULL, 0, NULL, NULL, NULL, 0, NULL);
    /* tools off (no tools / tool_choice none): everything is content */
    check(KILN_TOOLS_NONE, KILN_REASONING_NONE, t, t, NULL, 0, NULL, NULL, NULL, 0, NULL);
}

static void test_kimi_calls(void **st) {
    (void)st;
    const char *t = "I will check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
                    "{\"city\": \"Beijing\"}<|tool_call_end|><|tool_call_begin|> functions.search:1 <|tool_call_argument_begin|> {\"q\":\"x\"} "
                    "<|tool_call_end|><|tool_calls_section_end|>";
    const char *n[] = {"get_weather", "search"}, *a[] = {"{\"city\": \"Beijing\"}", "{\"q\":\"x\"}"};
    const char *ids[] = {"functions.get_weather:0", "functions.search:1"};
    check(KILN_TOOLS_KIMI_K2, KILN_REASONING_NONE, t, "I will check.", NULL, 2, n, a, NULL, 0, ids);
    /* a malformed id (no :index) is not a call; nothing parsed → the whole text is content */
    const char *bad = "<|tool_calls_section_begin|><|tool_call_begin|>functions.f<|tool_call_argument_begin|>{}<|tool_call_end|>";
    check(KILN_TOOLS_KIMI_K2, KILN_REASONING_NONE, bad, bad, NULL, 0, NULL, NULL, NULL, 0, NULL);
}

static void test_reasoning(void **st) {
    (void)st;
    /* R1 (vLLM's deepseek_r1), and THINK after a prompt that opened "<think>": a leading <think>
     * dropped, reasoning up to </think>, the rest content (not stripped); without </think>
     * everything is reasoning and content is null */
    opened = 1;
    check(KILN_TOOLS_NONE, KILN_REASONING_THINK, "the prompt opened it</think>done", "done", "the prompt opened it", 0, NULL, NULL, NULL, 0, NULL);
    opened = 0;
    check(KILN_TOOLS_NONE, KILN_REASONING_R1, "no tags at all", NULL, "no tags at all", 0, NULL, NULL, NULL, 0, NULL);
    /* THINK, prompt not opened: reasoning only when the output opens it; otherwise all content */
    check(KILN_TOOLS_NONE, KILN_REASONING_THINK, "plain answer</think>?", "plain answer</think>?", NULL, 0, NULL, NULL, NULL, 0, NULL);
    check(KILN_TOOLS_NONE, KILN_REASONING_THINK, "<thin", "<thin", NULL, 0, NULL, NULL, NULL, 0, NULL);
    check(KILN_TOOLS_NONE, KILN_REASONING_THINK, "<think>Let me think.</think>\nThe answer is 4.", "\nThe answer is 4.", "Let me think.", 0, NULL, NULL, NULL, 0, NULL);
    check(KILN_TOOLS_NONE, KILN_REASONING_THINK, "<think>never closed", NULL, "never closed", 0, NULL, NULL, NULL, 0, NULL);
    check(KILN_TOOLS_NONE, KILN_REASONING_THINK, "<think></think>", NULL, "", 0, NULL, NULL, NULL, 0, NULL);
    check(KILN_TOOLS_NONE, KILN_REASONING_R1, "<thin", NULL, "<thin", 0, NULL, NULL, NULL, 0, NULL);
    /* reasoning, then a GLM call in the content */
    const char *n[] = {"search"}, *a[] = {"{\"q\": \"kiln\"}"};
    check(KILN_TOOLS_GLM45, KILN_REASONING_THINK, "<think>I need to search.</think>\n<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>kiln</arg_value>\n</tool_call>",
          NULL, "I need to search.", 1, n, a, NULL, 0, NULL);
}

static void test_parser_names(void **st) {
    (void)st;
    kiln_tool_parser p;
    assert_int_equal(kiln_tool_parser_from_name("glm47", &p), 0);
    assert_int_equal(p, KILN_TOOLS_GLM45);
    assert_int_equal(kiln_tool_parser_from_name("kimi_k2", &p), 0);
    assert_int_equal(p, KILN_TOOLS_KIMI_K2);
    assert_int_equal(kiln_tool_parser_from_name("hermes", &p), -1);
    assert_int_equal(kiln_tool_parser_for_template("{{ '<arg_key>' }}"), KILN_TOOLS_GLM45);
    assert_int_equal(kiln_tool_parser_for_template("<|im_system|>tool_declare<|im_middle|>"), KILN_TOOLS_KIMI_K2);
    assert_int_equal(kiln_tool_parser_for_template("{{ messages }}"), KILN_TOOLS_NONE);
    assert_int_equal(kiln_reasoning_parser_for_template("<think></think>"), KILN_REASONING_THINK);
    assert_true(kiln_prompt_opens_think("<|assistant|>\n<think>\n", strlen("<|assistant|>\n<think>\n")));
    assert_false(kiln_prompt_opens_think("<|assistant|>\n<think></think>", strlen("<|assistant|>\n<think></think>")));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_glm_calls),
        cmocka_unit_test(test_kimi_calls),
        cmocka_unit_test(test_reasoning),
        cmocka_unit_test(test_parser_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
