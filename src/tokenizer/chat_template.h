/* chat_template.h — a Jinja-subset interpreter for the chat templates of tokenizer_config.json /
 * chat_template.jinja, rendering byte-identically to Python jinja2 3.1 set up as Hugging Face
 * transformers does (ImmutableSandboxedEnvironment, trim_blocks=True, lstrip_blocks=True, the
 * loopcontrols extension and transformers' {% generation %} tag, a `tojson` filter that is
 * json.dumps(ensure_ascii=False) keeping key order, and the globals raise_exception /
 * strftime_now). tests/unit/test_chat_template_jinja.py checks this against jinja2 itself.
 *
 * Supported: text, {{ }}, {% %}, {# #}, whitespace control (-, +), {% raw %}; statements if/elif/
 * else, for (tuple unpacking, `if` filter, else, loop.index/index0/revindex/revindex0/first/last/
 * length/previtem/nextitem/depth/cycle()), set (name, a, b = ..., ns.attr, block set with filters),
 * macro (defaults, keyword arguments, recursion), break/continue, with, filter blocks, print,
 * generation; expressions with Python values (None, bool, 64-bit int, float, str, list, tuple,
 * dict, namespace), literals (strings with Python escapes, 0x/0o/0b and _ in numbers), attribute /
 * item / slice access ([a:b:c], negative indices), + - * / // % ** ~, chained comparisons, in /
 * not in, and / or / not (returning operands), a if c else b.
 * Filters: abs attr batch capitalize center count d default dictsort e escape first float format
 * indent int items join last length list lower map max min reject rejectattr replace reverse round
 * safe select selectattr sort string sum title tojson trim unique upper wordcount.
 * Tests: boolean callable defined divisibleby eq equalto escaped even false filter float ge gt
 * greaterthan in integer iterable le lower lessthan lt mapping ne none number odd sameas sequence
 * string test true undefined upper (and ==, !=, <, <=, >, >= by name in select / reject).
 * str methods: startswith endswith split rsplit splitlines strip lstrip rstrip upper lower title
 * capitalize swapcase casefold replace find rfind index rindex count join isdigit isalpha isalnum
 * isspace islower isupper isdecimal isnumeric format ({} {0} {name} !r / !s, no format specs)
 * center ljust rjust zfill partition rpartition removeprefix removesuffix; dict: items keys values
 * get copy; list: index count copy. Globals: range, dict, namespace, raise_exception,
 * strftime_now. Mutating methods (list.append, dict.update, ...) and _private attributes are unsafe
 * as in the sandbox (an undefined value that fails when used).
 * Undefined values behave as jinja2's default Undefined: print as "", are false, iterate as empty,
 * and fail any other use with jinja2's message ("'dict object' has no attribute 'x'").
 * Anything else fails to parse (or render) with an error naming the construct and its line:
 * "<name>:<line>: unsupported construct '{% include %}'" (also 'filter NAME', 'test NAME',
 * 'str.encode', '*args', '{% for ... recursive %}'; integers beyond 64 bits fail as unsupported).
 * Limits: a render may use 256 MiB (then KILN_ERR_NOMEM), macros nest 100 deep, expressions 400,
 * range() makes at most 10^7 items. */
#ifndef KILN_TOKENIZER_CHAT_TEMPLATE_H
#define KILN_TOKENIZER_CHAT_TEMPLATE_H
#include "kiln.h"
#include <jansson.h>
#include <stddef.h>

typedef struct kiln_chat_template kiln_chat_template; /* parsed, read-only: renders may run in parallel */

/* Parses template source (UTF-8); name is used in error messages ("chat_template" if NULL). */
kiln_status kiln_chat_template_parse(const char *source, size_t len, const char *name,
                                     kiln_chat_template **out);
void kiln_chat_template_free(kiln_chat_template *t);

/* Renders with the variables transformers passes: messages (a JSON array of message objects),
 * tools (a JSON array, or NULL for None), add_generation_prompt, and every member of `extra` (a
 * JSON object or NULL: bos_token, eos_token, enable_thinking, ...). *out is malloc'ed and
 * NUL-terminated; *len (may be NULL) its length. */
kiln_status kiln_chat_template_render(const kiln_chat_template *t, const json_t *messages,
                                      const json_t *tools, int add_generation_prompt,
                                      const json_t *extra, char **out, size_t *len);

/* Parse + render in one call. */
kiln_status kiln_chat_template_apply(const char *source, const json_t *messages, const json_t *tools,
                                     int add_generation_prompt, const json_t *extra, char **out,
                                     size_t *len);
#endif
