/* test_json_grammar.c — structured output's recogniser (src/engine/json_grammar.c) on hand-written
 * documents: JSON's grammar (RFC 8259) for json_object, a schema's constraints for json_schema,
 * every prefix of a valid document alive and only the whole one complete, invalid documents dead at
 * the byte that breaks them, unsupported schema keywords refused with the path. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <stdio.h>
#include <string.h>
#include "engine/json_grammar.h"

static void accepts(const kiln_jg *g, const char *doc) {
    kiln_jg_state st;
    kiln_jg_start(g, &st);
    const size_t n = strlen(doc);
    for (size_t i = 0; i < n; i++) {
        if (!kiln_jg_feed(&st, doc + i, 1)) { fprintf(stderr, "refused at byte %zu of %s\n", i, doc); fail(); }
        /* an object or array is whole only at its last byte */
        if (i + 1 < n && kiln_jg_done(&st) && (doc[0] == '{' || doc[0] == '[')) { fprintf(stderr, "complete early: %s\n", doc); fail(); }
    }
    if (!kiln_jg_done(&st)) { fprintf(stderr, "not complete: %s\n", doc); fail(); }
}
static void refuses(const kiln_jg *g, const char *doc) {
    kiln_jg_state st;
    kiln_jg_start(g, &st);
    if (kiln_jg_feed(&st, doc, strlen(doc)) && kiln_jg_done(&st)) { fprintf(stderr, "accepted: %s\n", doc); fail(); }
}

static void test_json_object(void **state) {
    (void)state;
    kiln_jg *g;
    assert_int_equal(kiln_jg_compile(NULL, &g), KILN_OK);
    accepts(g, "{}");
    accepts(g, "{\"a\":1,\"b\":[true,false,null,-0.5e+3,\"x\\u00e9\\n\"],\"c\":{\"d\":{}}}");
    accepts(g, "{\"\xc3\xa9t\xc3\xa9\":\"\xe6\x9d\xb1\xe4\xba\xac \xf0\x9f\x98\x80\"}");
    refuses(g, "[1]");                 /* json_object: an object */
    refuses(g, "{\"a\":01}");          /* leading zero */
    refuses(g, "{\"a\":1.}");
    refuses(g, "{\"a\":-}");
    refuses(g, "{\"a\" :1}");          /* compact output: no whitespace outside strings */
    refuses(g, "{\"a\":tru}");
    refuses(g, "{\"a\":\"\\x\"}");     /* bad escape */
    refuses(g, "{\"a\":\"\x01\"}");    /* control character */
    refuses(g, "{\"a\":\"\x80\"}");    /* a continuation byte without lead */
    refuses(g, "{\"a\":\"\xed\xa0\x80\"}"); /* a surrogate */
    refuses(g, "{\"a\":1}x");          /* nothing after the document */
    refuses(g, "{\"a\":1,}");
    kiln_jg_free(g);
}

static void test_schema(void **state) {
    (void)state;
    kiln_jg *g;
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":3},"
                         "\"age\":{\"type\":\"integer\"},\"ok\":{\"type\":\"boolean\"},\"tags\":{\"type\":\"array\",\"items\":{\"enum\":[\"a\",\"bb\",7]},"
                         "\"minItems\":1,\"maxItems\":2},\"x\":{\"type\":\"number\"},\"n\":{\"type\":\"null\"},\"any\":{}},"
                         "\"required\":[\"name\",\"age\",\"ok\",\"tags\",\"x\",\"n\",\"any\"]}";
    assert_int_equal(kiln_jg_compile(schema, &g), KILN_OK);
    accepts(g, "{\"name\":\"Ann\",\"age\":-12,\"ok\":false,\"tags\":[\"bb\",7],\"x\":3.25E-2,\"n\":null,\"any\":[{}]}");
    accepts(g, "{\"name\":\"\xe6\x9d\xb1\",\"age\":0,\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":\"s\"}");
    refuses(g, "{\"age\":1,\"name\":\"A\",\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":1}"); /* declaration order */
    refuses(g, "{\"name\":\"Ann\",\"age\":1}");                                                  /* missing properties */
    refuses(g, "{\"name\":\"Anne\",\"age\":1,\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":1}"); /* maxLength */
    refuses(g, "{\"name\":\"\",\"age\":1,\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":1}");     /* minLength */
    refuses(g, "{\"name\":\"A\",\"age\":1.5,\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":1}");   /* integer */
    refuses(g, "{\"name\":\"A\",\"age\":1,\"ok\":true,\"tags\":[],\"x\":1,\"n\":null,\"any\":1}");          /* minItems */
    refuses(g, "{\"name\":\"A\",\"age\":1,\"ok\":true,\"tags\":[\"a\",\"a\",\"a\"],\"x\":1,\"n\":null,\"any\":1}"); /* maxItems */
    refuses(g, "{\"name\":\"A\",\"age\":1,\"ok\":true,\"tags\":[\"c\"],\"x\":1,\"n\":null,\"any\":1}");     /* enum */
    refuses(g, "{\"name\":\"A\",\"age\":1,\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":1,\"extra\":1}");
    refuses(g, "{\"name\":\"A\",\"age\":1234567890123456,\"ok\":true,\"tags\":[\"a\"],\"x\":1,\"n\":null,\"any\":1}"); /* 16 digits */
    kiln_jg_free(g);
    /* a root that is one enum value / number: complete when it may end */
    assert_int_equal(kiln_jg_compile("{\"enum\":[1,12]}", &g), KILN_OK);
    accepts(g, "12");
    kiln_jg_state st;
    kiln_jg_start(g, &st);
    assert_true(kiln_jg_feed(&st, "1", 1));
    assert_true(kiln_jg_done(&st)); /* "1" is whole, "12" still possible */
    kiln_jg_free(g);
}

static void test_refusals(void **state) {
    (void)state;
    kiln_jg *g = NULL;
    assert_int_not_equal(kiln_jg_compile("{\"type\":\"object\",\"properties\":{\"a\":{\"anyOf\":[{\"type\":\"string\"}]}}}", &g), KILN_OK);
    assert_non_null(strstr(kiln_last_error(), "schema.properties.a"));
    assert_non_null(strstr(kiln_last_error(), "anyOf"));
    assert_int_not_equal(kiln_jg_compile("{\"type\":\"strange\"}", &g), KILN_OK);
    assert_non_null(strstr(kiln_last_error(), "strange"));
    assert_int_not_equal(kiln_jg_compile("{\"type\":\"string\",\"minLength\":5,\"maxLength\":2}", &g), KILN_OK);
    assert_int_not_equal(kiln_jg_compile("not json", &g), KILN_OK);
    assert_null(g);
}

/* tool_choice "required": [{"name": N, "arguments": A}] with A following N's schema. */
static void test_tools_union(void **state) {
    (void)state;
    const char *tools = "[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"parameters\":{\"type\":\"object\",\"properties\":"
                        "{\"x\":{\"type\":\"integer\"}}}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"ab\",\"parameters\":{\"type\":\"object\",\"properties\":"
                        "{\"s\":{\"type\":\"string\",\"maxLength\":3}}}}},"
                        "{\"type\":\"function\",\"function\":{\"name\":\"free\"}}]";
    kiln_jg *g;
    assert_int_equal(kiln_jg_compile_tools(tools, 0, &g), KILN_OK);
    accepts(g, "[{\"name\":\"a\",\"arguments\":{\"x\":5}}]");
    accepts(g, "[{\"name\":\"ab\",\"arguments\":{\"s\":\"hey\"}},{\"name\":\"a\",\"arguments\":{\"x\":-1}}]");
    accepts(g, "[{\"name\":\"free\",\"arguments\":{\"anything\":[1,{}]}}]");
    refuses(g, "[]");                                                  /* at least one call */
    refuses(g, "[{\"name\":\"a\",\"arguments\":{\"s\":\"hey\"}}]");     /* a's arguments, not ab's */
    refuses(g, "[{\"name\":\"ab\",\"arguments\":{\"x\":5}}]");           /* and the other way round */
    refuses(g, "[{\"name\":\"b\",\"arguments\":{}}]");                    /* no such function */
    refuses(g, "[{\"name\":\"ab\",\"arguments\":{\"s\":\"toolong\"}}]"); /* maxLength of ab's s */
    kiln_jg_free(g);
    assert_int_equal(kiln_jg_compile_tools(tools, 1, &g), KILN_OK);   /* parallel_tool_calls false */
    accepts(g, "[{\"name\":\"a\",\"arguments\":{\"x\":5}}]");
    refuses(g, "[{\"name\":\"a\",\"arguments\":{\"x\":5}},{\"name\":\"a\",\"arguments\":{\"x\":6}}]");
    kiln_jg_free(g);
    assert_int_not_equal(kiln_jg_compile_tools("[]", 0, &g), KILN_OK);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_json_object), cmocka_unit_test(test_schema), cmocka_unit_test(test_refusals),
                                       cmocka_unit_test(test_tools_union)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
