/* chat.c — chat messages → prompt text.
 *
 * HOOK (chat templates): when the tokenizer helper's Jinja interpreter lands
 * (src/tokenizer/chat_template.h), models that ship a chat template (tokenizer_config.json
 * "chat_template", GGUF tokenizer.chat_template) are rendered with it here, with
 * add_generation_prompt = true. Until then, and for checkpoints without a template, the built-in
 * plain template below is used (docs/SERVER.md):
 *     for each message:  "<role>: <content>\n"
 *     then:              "assistant:"
 * Validation (roles, content types) is the same either way. */
#include "server/server_internal.h"
#include <string.h>

static const char *roles[] = {"system", "developer", "user", "assistant", "tool", NULL};

int kiln_server_render_chat(kiln_server *s, json_t *messages, kiln_sbuf *out, kiln_oai_error *err) {
    (void)s;
    char param[64];
    size_t n = json_array_size(messages);
    for (size_t i = 0; i < n; i++) {
        json_t *msg = json_array_get(messages, i);
        snprintf(param, sizeof param, "messages[%zu]", i);
        if (!json_is_object(msg)) return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s must be an object", param);
        json_t *role = json_object_get(msg, "role");
        if (!role || !json_is_string(role))
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.role must be a string", param);
        int known = 0;
        for (int r = 0; roles[r]; r++) known |= strcmp(json_string_value(role), roles[r]) == 0;
        if (!known)
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", "invalid_value",
                                 "%s.role '%.64s' is not one of system, developer, user, assistant, tool", param, json_string_value(role));
        json_t *c = json_object_get(msg, "content");
        kiln_sbuf_puts(out, json_string_value(role));
        kiln_sbuf_puts(out, ": ");
        if (!c || json_is_null(c)) {
            if (strcmp(json_string_value(role), "assistant") != 0)
                return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.content is required", param);
        } else if (json_is_string(c)) {
            kiln_sbuf_put(out, json_string_value(c), json_string_length(c));
        } else if (json_is_array(c)) {
            for (size_t k = 0; k < json_array_size(c); k++) {
                json_t *part = json_array_get(c, k), *type = json_object_get(part, "type"), *text = json_object_get(part, "text");
                if (!json_is_object(part) || !json_is_string(type) || strcmp(json_string_value(type), "text") != 0 || !json_is_string(text))
                    return kiln_oai_fail(err, 400, "invalid_request_error", "messages", "unsupported_parameter",
                                         "%s.content[%zu]: only {\"type\": \"text\", \"text\": \"...\"} parts are supported", param, k);
                kiln_sbuf_put(out, json_string_value(text), json_string_length(text));
            }
        } else {
            return kiln_oai_fail(err, 400, "invalid_request_error", "messages", NULL, "%s.content must be a string or an array of text parts", param);
        }
        kiln_sbuf_puts(out, "\n");
    }
    kiln_sbuf_puts(out, "assistant:");
    return 1;
}
