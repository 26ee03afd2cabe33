/* anthropic.h — the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens) on top of
 * the chat-completion machinery: a request is validated and translated into the equivalent chat
 * completion body (system → a system message, tool_result blocks → tool messages, tool_use blocks →
 * assistant tool_calls, thinking blocks → reasoning_content, tools / tool_choice / thinking →
 * tools / tool_choice / parallel_tool_calls / chat_template_kwargs), and the split output
 * (chat_output.h) is answered as Anthropic content blocks (docs/SERVER.md, "Anthropic Messages API"). */
#ifndef KILN_SERVER_ANTHROPIC_H
#define KILN_SERVER_ANTHROPIC_H
#include "server/server_internal.h"

/* Translates an Anthropic body into a chat-completion body (*out, a new reference). count_only:
 * the /count_tokens shape (no max_tokens). Returns 0 with err (naming the Anthropic parameter) on a
 * bad request. */
int kiln_anthropic_request(kiln_server *s, const char *body, size_t len, int count_only, json_t **out, kiln_oai_error *err);
/* {"type": "error", "error": {"type": ..., "message": ...}} with Anthropic's error types for e's status. */
json_t *kiln_anthropic_error_json(const kiln_oai_error *e);
/* "toolu_…" for a parser's call id (GLM's chatcmpl-tool- ids re-prefixed; Kimi's kept: its template
 * and clients read "functions.NAME:IDX" back). *out malloc'ed. */
char *kiln_anthropic_tool_id(const char *call_id);
/* A tool call's arguments as the tool_use block's input object ({} when they are not a JSON object). */
json_t *kiln_anthropic_tool_input(const char *arguments);
#endif
