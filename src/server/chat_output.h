/* chat_output.h — the assistant's generated text split into reasoning, content and tool calls, as
 * vLLM's reasoning and tool-call parsers split it, streamed or whole (docs/SERVER.md, "Tools and
 * reasoning").
 *
 * Reasoning (kiln_reasoning_parser below): a leading "<think>" is dropped; from there everything
 * up to "</think>" is reasoning, the rest content; reasoning never closed stays reasoning (content
 * null), as vLLM's deepseek_r1 parser has it.
 * Tool calls, in the content after the reasoning:
 *   KILN_TOOLS_GLM45 (GLM-4.5 / 4.6 / 4.7 / 5.x): "<tool_call>NAME" then pairs
 *     "<arg_key>K</arg_key>" "<arg_value>V</arg_value>" (whitespace, or a literal "\n", between
 *     them), then "</tool_call>". Content is the text before the first "<tool_call>"; text after
 *     or between calls is dropped. Keys and values are trimmed; a value stays a string when the
 *     request's tool declares that parameter {"type": "string"}, otherwise it is read as JSON,
 *     then as a Python literal (True / False / None, a quoted string), else kept as a string.
 *     Arguments are the object serialised as Python's json.dumps(ensure_ascii=False) writes it
 *     ({"k": v, "k2": v2}); ids "chatcmpl-tool-" + 32 hex digits from the OS CSPRNG.
 *   KILN_TOOLS_KIMI_K2: "<|tool_calls_section_begin|>" then calls "<|tool_call_begin|>
 *     functions.NAME:IDX <|tool_call_argument_begin|> {JSON} <|tool_call_end|>"; the id is the
 *     "functions.NAME:IDX" string itself, the name its part before ':' after the last '.', the
 *     arguments the text between the markers, trimmed. Content is the text before the section.
 * Content that is only whitespace becomes null when calls were found; with reasoning on, empty
 * content is null (vLLM). */
#ifndef KILN_SERVER_CHAT_OUTPUT_H
#define KILN_SERVER_CHAT_OUTPUT_H
#include "server/text.h"
#include <jansson.h>

typedef enum { KILN_TOOLS_NONE = 0, KILN_TOOLS_GLM45, KILN_TOOLS_KIMI_K2 } kiln_tool_parser;
/* THINK: reasoning when the prompt ends inside an opened "<think>" (templates that open it, as
 * GLM-4.7's and DeepSeek-R1's do) or when the output begins with "<think>" (GLM-4.5 / 4.6, Qwen3);
 * otherwise the output is all content. R1: vLLM's deepseek_r1 — the output is reasoning from its
 * start until "</think>", whatever the prompt. */
typedef enum { KILN_REASONING_NONE = 0, KILN_REASONING_THINK, KILN_REASONING_R1 } kiln_reasoning_parser;

/* "none", "glm45" (also "glm47", "glm4_moe"), "kimi_k2" → *out; -1 for another name. */
int kiln_tool_parser_from_name(const char *name, kiln_tool_parser *out);
const char *kiln_tool_parser_name(kiln_tool_parser p);
/* The parser a chat template's source implies: GLM's "<arg_key>", Kimi's
 * "<|tool_calls_section_begin|>" / "tool_declare", else NONE. */
kiln_tool_parser kiln_tool_parser_for_template(const char *template_source);
/* THINK when the template source mentions "<think>", else NONE. */
/* 1 when a rendered prompt ends inside an opened thinking block ("<think>" then only whitespace). */
int kiln_prompt_opens_think(const char *prompt, size_t n);
kiln_reasoning_parser kiln_reasoning_parser_for_template(const char *template_source);

typedef struct kiln_chat_out {
    kiln_tool_parser tools;        /* NONE: no tool-call parsing (no tools, or tool_choice "none") */
    kiln_reasoning_parser reasoning;
    const json_t *tool_defs;       /* the request's "tools" (borrowed): parameter types */
    const char *only_name;         /* tool_choice naming a function: calls of other names dropped */
    int single;                    /* parallel_tool_calls false: only the first call kept */
    int phase;                     /* internal: start, reasoning, content, tools */
    kiln_sbuf buf;                 /* text not yet classified */
    kiln_sbuf tools_text;          /* everything from the tool-call marker on (content if no call parses) */
    kiln_sbuf content, thought;    /* everything classified so far (for the whole message) */
    int saw_reasoning;
    json_t *calls;                 /* every call so far: [{id, type, function: {name, arguments}}] */
} kiln_chat_out;

/* What one push released: text to append to content / reasoning, and new calls (each with its
 * "index" among the message's calls). */
typedef struct kiln_chat_delta {
    kiln_sbuf content, reasoning;
    json_t *calls; /* NULL when none */
} kiln_chat_delta;

void kiln_chat_out_init(kiln_chat_out *o, kiln_tool_parser tools, kiln_reasoning_parser reasoning, int prompt_opened_think,
                        const json_t *tool_defs, const char *only_name, int single);
/* Feeds generated text; final = 1 at the end (releases what was held back). d receives what can be
 * sent now (cleared first). */
void kiln_chat_out_push(kiln_chat_out *o, const char *text, size_t n, int final, kiln_chat_delta *d);
/* The whole message's fields after the final push: content (string or null), reasoning_content
 * (a string, or NULL when reasoning parsing is off or found none) and tool_calls (NULL when none). */
json_t *kiln_chat_out_content(const kiln_chat_out *o);
json_t *kiln_chat_out_reasoning(const kiln_chat_out *o);
void kiln_chat_delta_free(kiln_chat_delta *d);
/* A JSON string of arbitrary bytes, invalid UTF-8 replaced by U+FFFD (kiln_utf8_repair). */
json_t *kiln_json_bytes_string(const char *s, size_t n);
/* 1 when piece[0..n) is one of the markers the parsers read ("<think>", "<tool_call>", "<arg_key>",
 * "<|tool_call_begin|>", ...): such tokens are kept when skip_special_tokens drops the others. */
int kiln_chat_marker(const char *piece, size_t n);
void kiln_chat_out_free(kiln_chat_out *o);
#endif
