/* test_server_text.c — the server's UTF-8 repair and streaming detokenizer (src/server/text.c).
 * References: the Unicode Standard's "U+FFFD substitution of maximal subparts" examples (chapter 3,
 * Table 3-8 and the text around it), RFC 3629's invalid ranges, and hand-built token streams. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>
#include <string.h>
#include "server/text.h"

#define FFFD "\xEF\xBF\xBD"

static void repair_is(const char *in, size_t n, const char *want) {
    kiln_sbuf b = {0};
    kiln_utf8_repair(in, n, &b);
    assert_int_equal(b.len, strlen(want));
    assert_memory_equal(b.p, want, b.len);
    assert_true(kiln_utf8_valid(b.p, b.len));
    kiln_sbuf_free(&b);
}

static void test_repair_unicode_examples(void **st) {
    (void)st;
    /* Table 3-8: 61 F1 80 80 E1 80 C2 62 80 63 80 BF 64 */
    repair_is("\x61\xF1\x80\x80\xE1\x80\xC2\x62\x80\x63\x80\xBF\x64", 13, "a" FFFD FFFD FFFD "b" FFFD "c" FFFD FFFD "d");
    /* overlong, surrogate and beyond-U+10FFFF forms: every byte is its own maximal subpart */
    repair_is("\xC0\xAF", 2, FFFD FFFD);
    repair_is("\xE0\x80\xAF", 3, FFFD FFFD FFFD);
    repair_is("\xED\xA0\x80", 3, FFFD FFFD FFFD);
    repair_is("\xF4\x90\x80\x80", 4, FFFD FFFD FFFD FFFD);
    repair_is("\xF5\x80", 2, FFFD FFFD);
    /* truncated sequence at the end: one replacement */
    repair_is("ab\xE4\xBD", 4, "ab" FFFD);
    /* valid text passes through unchanged */
    repair_is("h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80", 18, "h\xC3\xA9llo \xE4\xBD\xA0\xE5\xA5\xBD \xF0\x9F\x98\x80");
    assert_false(kiln_utf8_valid("\xC3", 1));
    assert_true(kiln_utf8_valid("", 0));
}

static void test_complete_prefix(void **st) {
    (void)st;
    assert_int_equal(kiln_utf8_complete_prefix("ab", 2), 2);
    assert_int_equal(kiln_utf8_complete_prefix("ab\xE4", 3), 2);         /* lead of 3 */
    assert_int_equal(kiln_utf8_complete_prefix("ab\xE4\xBD", 4), 2);     /* 2 of 3 */
    assert_int_equal(kiln_utf8_complete_prefix("ab\xE4\xBD\xA0", 5), 5); /* complete */
    assert_int_equal(kiln_utf8_complete_prefix("\xF0\x9F\x98", 3), 0);
    assert_int_equal(kiln_utf8_complete_prefix("a\x80", 2), 2);          /* can never complete: released (as U+FFFD) */
    assert_int_equal(kiln_utf8_complete_prefix("a\xE0\x80", 3), 3);      /* E0 80 is not a valid prefix */
}

/* Feeds pieces one by one, collecting what each step releases. */
static void stream(kiln_detok *d, const char *const *pieces, int n, char *out, size_t cap, int *stopped_at) {
    kiln_sbuf b = {0};
    *stopped_at = -1;
    for (int i = 0; i < n; i++) {
        size_t before = b.len;
        if (kiln_detok_push(d, pieces[i], strlen(pieces[i])) && *stopped_at < 0) *stopped_at = i;
        kiln_detok_take(d, 0, &b);
        assert_true(kiln_utf8_valid(b.p ? b.p : "", b.len)); /* every release is valid UTF-8 */
        (void)before;
        if (*stopped_at >= 0) break;
    }
    kiln_detok_take(d, 1, &b);
    assert_true(b.len < cap);
    memcpy(out, b.p ? b.p : "", b.len);
    out[b.len] = 0;
    kiln_sbuf_free(&b);
}

static void test_detok_split_characters(void **st) {
    (void)st;
    /* "你好😀" arriving one byte per token (SentencePiece <0xNN> byte fallback) */
    const char *p[] = {"x", "\xE4", "\xBD", "\xA0", "\xE5", "\xA5", "\xBD", "\xF0", "\x9F", "\x98", "\x80", "!"};
    kiln_detok d = {0};
    kiln_sbuf b = {0};
    size_t lens[12];
    for (int i = 0; i < 12; i++) {
        kiln_detok_push(&d, p[i], strlen(p[i]));
        kiln_detok_take(&d, 0, &b);
        lens[i] = b.len;
    }
    /* nothing is released in the middle of a character */
    size_t want[12] = {1, 1, 1, 4, 4, 4, 7, 7, 7, 7, 11, 12};
    for (int i = 0; i < 12; i++) assert_int_equal(lens[i], want[i]);
    assert_string_equal(b.p, "x\xE4\xBD\xA0\xE5\xA5\xBD\xF0\x9F\x98\x80!");
    kiln_sbuf_free(&b);
    kiln_detok_free(&d);
    /* an unfinished character at the end becomes one U+FFFD on the final take */
    kiln_detok d2 = {0};
    const char *q[] = {"ok", "\xE4\xBD"};
    char out[64];
    int s;
    stream(&d2, q, 2, out, sizeof out, &s);
    assert_string_equal(out, "ok" FFFD);
    kiln_detok_free(&d2);
}

static void test_detok_stop_strings(void **st) {
    (void)st;
    char out[128];
    int s;
    /* a stop string spread over three tokens: the text ends right before it */
    kiln_detok d = {0};
    d.stops[0] = "\n\nUser:";
    d.stop_len[0] = 7;
    d.stops[1] = "END";
    d.stop_len[1] = 3;
    d.n_stops = 2;
    const char *p[] = {"Hello", " there.", "\n", "\nUs", "er:", " more"};
    stream(&d, p, 6, out, sizeof out, &s);
    assert_string_equal(out, "Hello there.");
    assert_int_equal(s, 4);
    assert_true(d.stopped);
    kiln_detok_free(&d);
    /* a held-back tail that turns out not to be a stop string is released */
    kiln_detok d2 = {0};
    d2.stops[0] = "END";
    d2.stop_len[0] = 3;
    d2.n_stops = 1;
    kiln_sbuf b = {0};
    kiln_detok_push(&d2, "the EN", 6);
    kiln_detok_take(&d2, 0, &b);
    assert_int_equal(b.len, 4); /* "the " — "EN" may start "END" */
    kiln_detok_push(&d2, "D", 1);
    assert_true(d2.stopped);
    kiln_detok_take(&d2, 1, &b);
    assert_string_equal(b.p, "the ");
    kiln_sbuf_free(&b);
    kiln_detok_free(&d2);
    kiln_detok d3 = {0};
    d3.stops[0] = "END";
    d3.stop_len[0] = 3;
    d3.n_stops = 1;
    const char *q[] = {"the EN", "emy", " ENDS"};
    stream(&d3, q, 3, out, sizeof out, &s);
    assert_string_equal(out, "the ENemy ");
    kiln_detok_free(&d3);
    /* the earliest of two matching stop strings wins */
    kiln_detok d4 = {0};
    d4.stops[0] = "cd";
    d4.stop_len[0] = 2;
    d4.stops[1] = "bc";
    d4.stop_len[1] = 2;
    d4.n_stops = 2;
    const char *r[] = {"abcd"};
    stream(&d4, r, 1, out, sizeof out, &s);
    assert_string_equal(out, "a");
    kiln_detok_free(&d4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_repair_unicode_examples),
        cmocka_unit_test(test_complete_prefix),
        cmocka_unit_test(test_detok_split_characters),
        cmocka_unit_test(test_detok_stop_strings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
