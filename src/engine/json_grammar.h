/* json_grammar.h — structured output: which generated texts are (prefixes of) JSON documents of a
 * response_format (docs/SERVER.md, "Structured output"). A compiled grammar is read-only and shared;
 * each choice advances its own parser state, byte by byte, and the sampler keeps only the tokens
 * whose bytes keep the state alive (scheduler.c: the sampled token checked first, the whole
 * vocabulary masked only when it is refused).
 *
 * Grammars: json_object — any JSON object; json_schema — the subset of JSON Schema that OpenAI's
 * strict mode takes: type object (properties, emitted in declaration order, all of them, no others),
 * array (items, minItems, maxItems), string (minLength, maxLength, enum), integer, number, boolean,
 * null, enum and const of any JSON values, nested to 24 levels. Output is compact JSON (no whitespace
 * outside strings, so a model cannot stall in whitespace); numbers have at most 15 digits in each
 * part. Unsupported keywords (anyOf, $ref, patterns, formats, …) are refused at compile time with a
 * message naming the schema path, never silently ignored. */
#ifndef KILN_ENGINE_JSON_GRAMMAR_H
#define KILN_ENGINE_JSON_GRAMMAR_H
#include "kiln.h"
#include <stddef.h>
#include <stdint.h>

typedef struct kiln_jg kiln_jg;

#define KILN_JG_DEPTH 26
typedef struct kiln_jg_frame {
    const struct kiln_jg_node *node;
    uint8_t kind, phase;
    uint16_t pos;             /* literal: bytes matched; string: escape state */
    uint32_t count;           /* array items / object properties done / string length */
    uint64_t alive;           /* literal: the options still matching */
} kiln_jg_frame;
typedef struct kiln_jg_state {
    int depth;                /* frames in use; 0 with done = 1: the document is complete */
    int done, dead;
    kiln_jg_frame f[KILN_JG_DEPTH];
} kiln_jg_state;

/* schema_json: a JSON Schema (json_schema), or NULL for json_object. Errors name the schema path. */
kiln_status kiln_jg_compile(const char *schema_json, kiln_jg **out);
/* tool_choice "required" (vLLM's form): a JSON array of at least one (exactly one when single)
 * {"name": NAME, "arguments": ARGS} whose NAME is one of the request's tools (tools_json: its
 * "tools" array, at most 64) and ARGS a document of that tool's parameters schema (any object when
 * it has none). Errors name tools[i].function.parameters. */
kiln_status kiln_jg_compile_tools(const char *tools_json, int single, kiln_jg **out);
void kiln_jg_free(kiln_jg *g);
void kiln_jg_start(const kiln_jg *g, kiln_jg_state *st);
/* Feeds bytes; returns 1 while the text so far is a prefix of a valid document, 0 once it cannot be
 * (the state is then dead). */
int kiln_jg_feed(kiln_jg_state *st, const char *bytes, size_t n);
/* Inside a string, between characters (no escape or multi-byte character pending): how many more
 * characters the string may take (its maxLength left; INT32_MAX when unbounded). -1 elsewhere. A
 * token of plain characters (printable ASCII but '"' and '\\') of length len then keeps the state
 * alive exactly when len <= that room: the mask needs no feed for it. */
int kiln_jg_plain_room(const kiln_jg_state *st);
/* 1 when the text so far is a whole valid document (then only the end of generation may follow). */
int kiln_jg_done(const kiln_jg_state *st);
#endif
