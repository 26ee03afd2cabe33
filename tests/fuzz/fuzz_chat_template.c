/* fuzz_chat_template — the Jinja-subset chat-template interpreter: parse, then render with the
 * messages (a JSON array; a fixed conversation when the part is not one), tools (when the
 * messages part is an object {"messages": [...], "tools": [...]}) and extra variables.
 * Input: template FUZZ_SPLIT messages JSON FUZZ_SPLIT extra JSON object. */
#include "fuzz_common.h"
#include "tokenizer/chat_template.h"

static const char default_messages[] =
    "[{\"role\":\"system\",\"content\":\"Be brief.\"},{\"role\":\"user\",\"content\":\"Hello\"},"
    "{\"role\":\"assistant\",\"content\":\"Hi!\",\"tool_calls\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"x\":1}}}]},"
    "{\"role\":\"tool\",\"content\":\"42\"},{\"role\":\"user\",\"content\":\"Thanks\"}]";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part p[3];
    fuzz_split(data, size, p, 3);
    kiln_chat_template *t = NULL;
    if (fuzz_note("parse", kiln_chat_template_parse((const char *)p[0].p, p[0].n, "fuzz", &t)) != KILN_OK) return 0;
    json_t *msgs = json_loadb((const char *)p[1].p, p[1].n, 0, NULL), *tools = NULL;
    if (json_is_object(msgs)) {
        tools = json_incref(json_object_get(msgs, "tools"));
        json_t *m = json_incref(json_object_get(msgs, "messages"));
        json_decref(msgs);
        msgs = m;
    }
    if (!json_is_array(msgs)) { json_decref(msgs); msgs = json_loads(default_messages, 0, NULL); }
    if (tools && !json_is_array(tools)) { json_decref(tools); tools = NULL; }
    json_t *extra = json_loadb((const char *)p[2].p, p[2].n, 0, NULL);
    if (!json_is_object(extra)) {
        json_decref(extra);
        extra = json_pack("{s:s,s:s,s:b}", "bos_token", "<s>", "eos_token", "</s>", "enable_thinking", 0);
    }
    char *out = NULL;
    size_t len = 0;
    if (fuzz_note("render", kiln_chat_template_render(t, msgs, tools, (int)(size & 1), extra, &out, &len)) == KILN_OK && strlen(out) > len) abort();
    free(out);
    json_decref(msgs);
    json_decref(tools);
    json_decref(extra);
    kiln_chat_template_free(t);
    return 0;
}
