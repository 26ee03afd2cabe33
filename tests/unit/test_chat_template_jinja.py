#!/usr/bin/python3
"""test_chat_template_jinja.py — kiln's chat template interpreter against Python's jinja2.

The reference is jinja2 set up as Hugging Face transformers' apply_chat_template does
(ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loopcontrols + a
{% generation %} pass-through), tojson = json.dumps(ensure_ascii=False, indent, separators,
sort_keys), raise_exception, strftime_now; render(messages, tools, documents=None,
add_generation_prompt, **special_tokens_map, **kwargs)). For every case `$KILN chat-template` must
print byte for byte what jinja2 renders, or both must fail.

Templates: DeepSeek-V3 and Qwen3 (tokenizer_config.json of $SHARED/tokenizers), GLM-4.6 and Kimi K2
($SHARED/tokenizers/templates), over many conversations (system messages, multi-turn, tool
definitions, assistant tool calls, tool results, reasoning_content, list contents, Unicode,
add_generation_prompt true/false, enable_thinking), plus feature snippets for the filters, tests,
methods and whitespace rules the interpreter implements, and unsupported constructs (kiln must
fail naming the construct and its line).

Exit 77 when jinja2 or the kiln binary is missing."""
import json
import os
import random
import subprocess
import sys
import tempfile
from datetime import datetime

try:
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("jinja2 is not installed")
    sys.exit(77)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN") or os.path.join(ROOT, "kiln")
SHARED = os.environ.get("SHARED") or os.path.join(os.path.dirname(ROOT), "shared")
if not os.access(KILN, os.X_OK):
    print(f"kiln binary not found at {KILN}")
    sys.exit(77)
TOK = os.path.join(SHARED, "tokenizers")


# ---- the reference: jinja2 as transformers sets it up -------------------------------------------
class AssistantTracker(Extension):
    """transformers' {% generation %} tag: renders its body (as a call block)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_support"), [], [], body).set_lineno(lineno)

    def _generation_support(self, caller):
        return caller()


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


ENV = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
ENV.filters["tojson"] = tojson
ENV.globals["raise_exception"] = raise_exception
ENV.globals["strftime_now"] = strftime_now


def special_tokens_map(cfg):
    """transformers' tokenizer.special_tokens_map: the special tokens that are set, as strings."""
    out = {}
    for k in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        v = cfg.get(k)
        if isinstance(v, dict):
            v = v.get("content")
        if isinstance(v, str):
            out[k] = v
    extra = cfg.get("additional_special_tokens")
    if extra:
        out["additional_special_tokens"] = [e["content"] if isinstance(e, dict) else e for e in extra]
    return out


def py_render(source, messages, tools, agp, variables):
    try:
        t = ENV.from_string(source)
        return True, t.render(messages=messages, tools=tools, documents=None, add_generation_prompt=agp, **variables)
    except Exception as e:  # noqa: BLE001 - any failure counts as "jinja2 fails"
        return False, f"{type(e).__name__}: {e}"


TMP = tempfile.mkdtemp(prefix="kiln_ct_")
_counter = [0]


def tmpfile(text, suffix):
    _counter[0] += 1
    p = os.path.join(TMP, f"f{_counter[0]}{suffix}")
    with open(p, "w", encoding="utf-8") as f:
        f.write(text)
    return p


def kiln_render(path, messages, tools, agp, extra, template=None):
    args = [KILN, "chat-template", path, "--messages", tmpfile(json.dumps(messages, ensure_ascii=False), ".json")]
    if tools is not None:
        args += ["--tools", tmpfile(json.dumps(tools, ensure_ascii=False), ".json")]
    if not agp:
        args.append("--no-generation-prompt")
    if template is not None:
        args += ["--template", template]
    if extra:
        args += ["--extra", tmpfile(json.dumps(extra, ensure_ascii=False), ".json")]
    r = subprocess.run(args, capture_output=True)
    if r.returncode != 0:
        return False, r.stderr.decode("utf-8", "replace").strip()
    return True, r.stdout.decode("utf-8")


FAILS = []
COUNTS = {"match": 0, "both_fail": 0}
PENDING = []  # cases rendered by one `kiln chat-template --batch` run


def compare(label, py, kl, expect_error=None):
    pok, pout = py
    kok, kout = kl
    if pok and kok and pout == kout:
        COUNTS["match"] += 1
        return
    if not pok and not kok:
        if expect_error and expect_error not in kout:
            FAILS.append(f"{label}: kiln's error does not mention {expect_error!r}: {kout}")
            return
        COUNTS["both_fail"] += 1
        return
    if pok and kok:
        i = next((k for k in range(min(len(pout), len(kout))) if pout[k] != kout[k]), min(len(pout), len(kout)))
        FAILS.append(f"{label}: output differs at char {i}\n  jinja2: {pout[max(0, i - 60):i + 60]!r}\n"
                     f"  kiln:   {kout[max(0, i - 60):i + 60]!r}")
    elif pok:
        FAILS.append(f"{label}: kiln failed but jinja2 rendered {pout[:200]!r}\n  kiln: {kout}")
    else:
        FAILS.append(f"{label}: jinja2 failed ({pout}) but kiln rendered {kout[:200]!r}")


def check(label, kiln_path, source, messages, tools=None, agp=True, extra=None, special=None, template=None,
          expect_error=None, cli=False):
    """Queues a case for the batch run (cli=True: also runs it as its own `kiln chat-template`)."""
    extra = extra or {}
    variables = dict(special or {})
    variables.update(extra)
    py = py_render(source, messages, tools, agp, variables)
    req = {"path": kiln_path, "messages": messages, "add_generation_prompt": agp}
    if tools is not None:
        req["tools"] = tools
    if extra:
        req["extra"] = extra
    if template is not None:
        req["template"] = template
    PENDING.append((label, py, req, expect_error))
    if cli:
        compare(label + " (cli)", py, kiln_render(kiln_path, messages, tools, agp, extra, template), expect_error)


def run_batch():
    path = tmpfile("\n".join(json.dumps(req, ensure_ascii=False) for _, _, req, _ in PENDING) + "\n", ".jsonl")
    r = subprocess.run([KILN, "chat-template", "--batch", path], capture_output=True)
    lines = r.stdout.decode("utf-8").splitlines()
    if r.returncode != 0 or len(lines) != len(PENDING):
        FAILS.append(f"batch run failed (rc={r.returncode}, {len(lines)} of {len(PENDING)} results): "
                     f"{r.stderr.decode('utf-8', 'replace')[:500]}")
        return
    for (label, py, _, expect_error), line in zip(PENDING, lines):
        res = json.loads(line)
        compare(label, py, (res["ok"], res["text"] if res["ok"] else res["error"]), expect_error)
    PENDING.clear()


# ---- conversations --------------------------------------------------------------------------------
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city (°C).",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\" or 東京"},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "web_search", "description": "Search the web.\nReturns the top results.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string"}, "top_k": {"type": "number", "default": 5.0},
        "threshold": {"type": "number", "default": 0.25}, "safe": {"type": "boolean", "default": True},
        "filters": {"type": "object", "properties": {"site": {"type": ["string", "null"]}}},
        "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["query"]}}}
CALC = {"type": "function", "function": {"name": "calc", "parameters": {
    "type": "object", "properties": {"expr": {"type": "string", "pattern": "^[0-9+*/() -]+$"}}}}}
TOOLS = [WEATHER, SEARCH, CALC]


def tool_call(name, args, as_string, idx=0):
    return {"id": f"call_{idx}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False) if as_string else args}}


def conversations(args_as_string, content_none=False):
    """A list of (label, messages, tools, extra) covering the chat features. args_as_string: tool call
    arguments as JSON text (else objects); content_none: assistant tool-call messages have content
    None (DeepSeek-V3's template expects it) instead of text."""
    S = content_none
    sysm = {"role": "system", "content": "You are a helpful assistant."}
    conv = []
    conv.append(("user", [{"role": "user", "content": "Hello!"}], None, None))
    conv.append(("system+user", [sysm, {"role": "user", "content": "What is 2+2?"}], None, None))
    conv.append(("multi-turn", [sysm, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
                                {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken cross the road?"},
                                {"role": "user", "content": "Why?"}], None, None))
    conv.append(("no-system multi-turn", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                          {"role": "user", "content": "c"}, {"role": "assistant", "content": "d"}], None, None))
    conv.append(("two systems", [sysm, {"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Why is the sky blue?"}], None, None))
    conv.append(("unicode", [{"role": "system", "content": "Réponds en français. 日本語もOK 🚀"},
                             {"role": "user", "content": "Ünïcödé \"quotes\" 'single' back\\slash\ttab\nnewline 中文 😀👍🏽"},
                             {"role": "assistant", "content": "D'accord — «très bien» ✅"},
                             {"role": "user", "content": "   leading and trailing spaces   \n\n"}], None, None))
    conv.append(("reasoning_content", [{"role": "user", "content": "Solve x+1=3"},
                                       {"role": "assistant", "content": "x = 2", "reasoning_content": "Subtract 1 from both sides.\n"},
                                       {"role": "user", "content": "And x+2=5?"}], None, None))
    conv.append(("reasoning last", [{"role": "user", "content": "Solve x+1=3"},
                                    {"role": "assistant", "content": "x = 2", "reasoning_content": "\nSubtract 1.\n"}], None, None))
    conv.append(("inline think", [{"role": "user", "content": "Q1"},
                                  {"role": "assistant", "content": "<think>\nLet me think.\n</think>\n\nThe answer is 42."},
                                  {"role": "user", "content": "Q2"},
                                  {"role": "assistant", "content": "<think>short</think>Yes."}], None, None))
    conv.append(("tools defined", [sysm, {"role": "user", "content": "Weather in Paris?"}], TOOLS, None))
    conv.append(("tools no system", [{"role": "user", "content": "Search for kiln."}], [SEARCH], None))
    conv.append(("tools empty list", [{"role": "user", "content": "hi"}], [], None))
    conv.append(("tool call + result", [sysm, {"role": "user", "content": "Weather in Paris and Tokyo?"},
                                        {"role": "assistant", "content": None if S else "",
                                         "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2}, args_as_string, 0)]},
                                        {"role": "tool", "tool_call_id": "call_0", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"},
                                        {"role": "assistant", "content": "It is 21.5 °C and clear in Paris."}], TOOLS, None))
    conv.append(("parallel tool calls", [{"role": "user", "content": "Weather in Paris and 東京?"},
                                         {"role": "assistant", "content": None if S else "",
                                          "tool_calls": [tool_call("get_weather", {"city": "Paris"}, args_as_string, 0),
                                                         tool_call("get_weather", {"city": "東京", "unit": "celsius"}, args_as_string, 1)]},
                                         {"role": "tool", "content": "18"}, {"role": "tool", "content": "25"}], TOOLS, None))
    conv.append(("tool result last", [{"role": "user", "content": "calc 6*7"},
                                      {"role": "assistant", "content": None if S else "Let me compute.",
                                       "tool_calls": [tool_call("calc", {"expr": "6*7"}, args_as_string, 0)]},
                                      {"role": "tool", "content": "42"}], [CALC], None))
    conv.append(("tool args nested", [{"role": "user", "content": "search"},
                                      {"role": "assistant", "content": None if S else "",
                                       "tool_calls": [tool_call("web_search", {"query": "a \"quoted\" query\n", "top_k": 3,
                                                                               "threshold": 0.5, "safe": False, "filters": {"site": None},
                                                                               "tags": ["x", "ÿ", "😀"]}, args_as_string, 0)]},
                                      {"role": "tool", "content": "[]"},
                                      {"role": "assistant", "content": "Nothing found."},
                                      {"role": "user", "content": "ok"}], [SEARCH], None))
    conv.append(("tool_response in user", [{"role": "user", "content": "<tool_response>\nx\n</tool_response>"},
                                           {"role": "assistant", "content": "ok"}], None, None))
    conv.append(("empty content", [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}], None, None))
    conv.append(("long", [sysm] + [m for i in range(12) for m in (
        {"role": "user", "content": f"question {i} " + "word " * (i % 5)},
        {"role": "assistant", "content": f"answer {i}" + (" <think>r</think>" if i % 4 == 3 else "")})], None, None))
    conv.append(("list content", [{"role": "user", "content": [{"type": "text", "text": "Describe "}, {"type": "text", "text": "this."}]},
                                  {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]}], None, None))
    conv.append(("image content", [{"role": "user", "content": [{"type": "image", "image": "x.png"}, {"type": "text", "text": "What is it?"}]}], None, None))
    conv.append(("extra keys", [{"role": "user", "content": "hi", "name": "bob", "weight": 1.5},
                                {"role": "assistant", "content": "hey", "refusal": None}], None, None))
    conv.append(("no messages", [], None, None))
    conv.append(("enable_thinking false", [{"role": "user", "content": "Quick question"}], None, {"enable_thinking": False}))
    conv.append(("enable_thinking true", [{"role": "user", "content": "Quick question"}], None, {"enable_thinking": True}))
    conv.append(("nothink suffix", [{"role": "user", "content": "Quick /nothink"}], None, {"enable_thinking": False}))
    conv.append(("system only", [sysm], None, None))
    # random conversations from a fixed seed
    rng = random.Random(1234)
    words = ["alpha", "β", "γάμμα", "中文", "😀", "x", "\n", "  ", "\"q\"", "back\\slash", "tab\t", "{json}", "<tag>", "1.5e-7", "naïve"]
    for k in range(14):
        msgs = []
        if rng.random() < 0.5:
            msgs.append({"role": "system", "content": " ".join(rng.choice(words) for _ in range(rng.randint(1, 6)))})
        for t in range(rng.randint(1, 5)):
            msgs.append({"role": "user", "content": " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))})
            r = rng.random()
            if r < 0.3:
                city = rng.choice(["Paris", "東京", "São Paulo"])
                msgs.append({"role": "assistant", "content": None if S else "", "tool_calls": [tool_call("get_weather", {"city": city}, args_as_string, t)]})
                msgs.append({"role": "tool", "content": json.dumps({"temp": rng.randint(-5, 35), "city": city}, ensure_ascii=False)})
                msgs.append({"role": "assistant", "content": "Done: " + city})
            elif r < 0.5:
                msgs.append({"role": "assistant", "content": "sure", "reasoning_content": rng.choice(words) + " because"})
            elif r < 0.9:
                msgs.append({"role": "assistant", "content": " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))})
        conv.append((f"random {k}", msgs, TOOLS if rng.random() < 0.4 else None, None))
    return conv


def load_cfg(name):
    with open(os.path.join(TOK, name, "tokenizer_config.json"), encoding="utf-8") as f:
        return json.load(f)


def run_templates():
    targets = []
    for name in ("deepseek-v3", "qwen3"):
        cfg = load_cfg(name)
        targets.append((name, os.path.join(TOK, name), cfg["chat_template"], special_tokens_map(cfg)))
    for name in ("glm-4.6", "kimi-k2"):
        p = os.path.join(TOK, "templates", name + ".jinja")
        with open(p, encoding="utf-8") as f:
            targets.append((name, p, f.read(), {}))
    for name, path, source, special in targets:
        # DeepSeek-V3 joins arguments as text; GLM-4.6 iterates them as a mapping; Qwen3 takes both
        modes = {"deepseek-v3": [True], "glm-4.6": [False], "qwen3": [False, True], "kimi-k2": [False]}[name]
        for as_string in modes:
            for label, msgs, tools, extra in conversations(as_string, name == "deepseek-v3"):
                for agp in (True, False):
                    check(f"{name} [{label}] args_str={as_string} agp={agp}", path, source, msgs, tools, agp, extra, special,
                          cli=label in ("system+user", "tool call + result", "enable_thinking false"))
        # the other argument form: jinja2 and kiln must agree (render or both fail)
        for label, msgs, tools, extra in conversations(not modes[0], name == "deepseek-v3")[12:16]:
            check(f"{name} [{label}] other args form", path, source, msgs, tools, True, extra, special)


# ---- feature snippets -------------------------------------------------------------------------------
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks, comments, raw
    "a\n  {% if true %}\n  b\n  {% endif %}\nc\n",
    "a  {%- if true -%}  b  {%- endif -%}  c",
    "x {{- ' y ' -}} z\n\n{{ 'w' }}\n",
    "  {# comment #}\nline\n{#- c -#}  after",
    "{% raw %}{{ not rendered }} {% if %}{% endraw %}!",
    "  {%+ if true %}kept{% endif %}\n",
    "{% if true +%}\nkeep newline{% endif %}",
    "\t\t{% for i in range(2) %}\n\t\t{{ i }}\n\t\t{% endfor %}\n",
    "{{ 'a' }}\n{{ 'b' }}\n",
    "line\r\nwith crlf\r\n{% if true %}\r\nx\r\n{% endif %}\r\n",
    "trailing newline kept once\n\n",
    # literals and printing
    "{{ 1 }} {{ -2 }} {{ 3.0 }} {{ 1e3 }} {{ 0.1 + 0.2 }} {{ 1/3 }} {{ 10 ** 18 }} {{ 2 ** -1 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789012.5 }}",
    "{{ none }} {{ true }} {{ false }} {{ None }} {{ True }}",
    "{{ [1, 'a', none, true, 2.5, {'k': 'v'}] }} {{ (1, 2) }} {{ (1,) }} {{ {'a': [1, {'b': none}]} }}",
    "{{ 'it\\'s' }} {{ \"say \\\"hi\\\"\" }} {{ ['it\\'s', 'a\"b', 'both\\'\"', 'back\\\\slash', 'new\\nline', 'tab\\t', '\\x01'] }}",
    "{{ '\\u00e9\\U0001F600\\x41\\101' }} {{ 'a' 'b' \"c\" }}",
    "{{ 0x1f }} {{ 0o17 }} {{ 0b101 }} {{ 1_000 }} {{ 1_0.5e1_0 }}",
    # arithmetic and operators
    "{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % -3 }} {{ -7 % 3 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 2 * 3 + 4 }} {{ 2 * (3 + 4) }} {{ 'ab' * 3 }} {{ [1] * 2 }}",
    "{{ 'a' ~ 1 ~ none ~ true ~ [1] }} {{ 'x' + 'y' }} {{ [1] + [2, 3] }} {{ -(3) }} {{ +4 }} {{ not 1 }}",
    "{{ 1 < 2 < 3 }} {{ 1 < 3 < 2 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 1 != 2 }} {{ 'ab' in 'cabd' }} {{ 3 not in [1, 2] }} {{ 'k' in {'k': 1} }}",
    "{{ 0 or 'default' }} {{ 'x' and 'y' }} {{ '' and 'y' }} {{ none or none }} {{ 'a' if false }}|{{ 'a' if true else 'b' }}",
    "{{ True + 1 }} {{ 10 / 4 }} {{ 2 ** 10 }} {{ 2.0 ** 0.5 }}",
    # variables, scoping, namespaces, loops
    "{% set x = 1 %}{% for i in range(3) %}{{ x }}{% set x = x + 10 %}{{ x }};{% endfor %}{{ x }}",
    "{% set ns = namespace(n=0, s='') %}{% for i in range(5) %}{% set ns.n = ns.n + i %}{% set ns.s = ns.s ~ i %}{% endfor %}{{ ns.n }} {{ ns.s }}",
    "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c, d = [3, 4] %}{{ c + d }}",
    "{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }}{% if not loop.last %}, {% endif %}{% endfor %}",
    "{% for x in [3, 4, 5] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}",
    "{% for x in 'abc' %}[{{ loop.previtem }}{{ x }}{{ loop.nextitem }}]{% endfor %}",
    "{% for x in [1, 2, 3, 4] if x is even %}{{ x }}{{ loop.length }}{% else %}none{% endfor %}",
    "{% for x in [] %}{{ x }}{% else %}empty{% endfor %}",
    "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 4 %}{% break %}{% endif %}{{ x }}{% endfor %}",
    "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ a }}{{ b }} {% endfor %}{{ loop.index }};{% endfor %}",
    "{% for x in [1, 2, 3] %}{{ loop.cycle('odd', 'even') }} {% endfor %}",
    "{% for x in {'b': 1, 'a': 2} %}{{ x }}{% endfor %}",
    "{% if 0 %}a{% elif '' %}b{% elif [1] %}c{% else %}d{% endif %}",
    "{% with a = 5, b = 'x' %}{{ a }}{{ b }}{% endwith %}{{ a }}",
    "{% set block %}inner {{ 1 + 1 }}{% endset %}[{{ block }}]",
    "{% set up | upper %}shout{% endset %}{{ up }}",
    "{% filter upper %}filtered {{ 'text' }}{% endfilter %}",
    "{% generation %}generated {{ 1 }}{% endgeneration %}",
    # macros
    "{% macro greet(name, greeting='Hello') %}{{ greeting }}, {{ name }}!{% endmacro %}{{ greet('Ann') }} {{ greet('Bo', greeting='Hi') }} {{ greet(name='Cy') }}",
    "{% macro m(x) -%}\n  <{{ x }}>\n{%- endmacro %}{{ m(1) }}{{ m([1, 2]) }}{{ m(none) }}",
    "{% set g = 1 %}{% macro show() %}{{ g }}{% endmacro %}{% set g = 2 %}{{ show() }}",
    "{% macro rec(n) %}{% if n > 0 %}{{ n }}{{ rec(n - 1) }}{% endif %}{% endmacro %}{{ rec(5) }}",
    "{% macro m(a) %}{{ a is defined }}{% endmacro %}{{ m() }}",
    # tests
    "{{ 1 is number }}{{ 1.5 is float }}{{ 1 is integer }}{{ true is boolean }}{{ true is number }}{{ 'a' is string }}{{ {} is mapping }}{{ [] is iterable }}{{ 'x' is iterable }}{{ 1 is iterable }}{{ [] is sequence }}",
    "{{ x is defined }}{{ x is undefined }}{{ none is none }}{{ none is defined }}{{ 3 is odd }}{{ 4 is even }}{{ 9 is divisibleby 3 }}{{ 9 is divisibleby(4) }}{{ true is true }}{{ 0 is false }}",
    "{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 2 is gt 1 }}{{ 2 is ge 2 }}{{ 1 is lt 2 }}{{ 1 is le 0 }}{{ 'a' is in 'abc' }}{{ 2 is in [1, 2] }}{{ 'abc' is lower }}{{ 'ABC' is upper }}{{ none is sameas none }}{{ f is callable }}",
    "{{ 'upper' is filter }}{{ 'nope' is filter }}{{ 'odd' is test }}{{ range is callable }}{{ (1, 2) is sequence }}",
    # filters
    "{{ 'abc'|length }} {{ [1, 2]|count }} {{ {'a': 1}|length }} {{ 'héllo'|length }} {{ x|length }}",
    "{{ x|default('d') }} {{ none|default('d') }} {{ ''|default('d', true) }} {{ 0|d('z', boolean=true) }} {{ 'v'|d('z') }}",
    "{{ [3, 1, 2]|sort }} {{ [3, 1, 2]|sort(reverse=true) }} {{ ['b', 'A', 'c']|sort }} {{ ['b', 'A', 'c']|sort(case_sensitive=true) }} {{ [{'n': 2}, {'n': 1}]|sort(attribute='n') }}",
    "{{ [1, 2, 2, 3, 1]|unique|list }} {{ ['A', 'a', 'b']|unique|list }} {{ [1, 2, 3]|reverse|list }} {{ 'abc'|reverse }} {{ 'abc'|list }} {{ {'a': 1}|list }}",
    "{{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ [{'n': 'x'}, {'n': 'y'}]|join('-', attribute='n') }} {{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ []|first }}",
    "{{ messages|map(attribute='role')|list }} {{ messages|map(attribute='missing', default='?')|list }} {{ ['a', 'b']|map('upper')|list }} {{ [1.6, 2.4]|map('round')|list }}",
    "{{ messages|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} {{ messages|rejectattr('role', 'eq', 'user')|list|length }} {{ [0, 1, 2, '', 'a']|select|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [1, 5, 10]|select('gt', 3)|list }}",
    "{{ messages|selectattr('content')|list|length }}",
    "{{ {'b': 1, 'a': 2}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }} {{ {'b': 1, 'a': 2}|dictsort(reverse=true) }} {{ {'b': 1, 'a': 2}|items|list }}",
    "{{ 'Hello World'|upper }} {{ 'Hello World'|lower }} {{ 'hello wORLD-foo(bar)'|title }} {{ 'hELLO there'|capitalize }} {{ '  pad  '|trim }} {{ 'xxhixx'|trim('x') }}",
    "{{ 'a-b-c'|replace('-', '+') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 3|string ~ 'x' }} {{ [1]|string }} {{ '<a href=\"x\">&\\'</a>'|e }} {{ '<b>'|escape }} {{ '<i>'|safe }}",
    "{{ '42'|int }} {{ '42.7'|int }} {{ 'x'|int }} {{ 'x'|int(7) }} {{ 3.99|int }} {{ '0x1A'|int(0, 16) }} {{ 'ff'|int(base=16) }} {{ '3.5'|float }} {{ 'x'|float }} {{ 2|float }} {{ ' 1_000 '|int }}",
    "{{ -3|abs }} {{ -2.5|abs }} {{ 2.5|round }} {{ 3.5|round }} {{ 2.675|round(2) }} {{ 3|round }} {{ 1.2345|round(2, 'ceil') }} {{ 1.2399|round(2, 'floor') }} {{ 1234|round(-2) }}",
    "{{ [1, 2, 3]|sum }} {{ [1.5, 2]|sum }} {{ [{'v': 1}, {'v': 2}]|sum(attribute='v') }} {{ [1, 2]|sum(start=10) }} {{ [3, 1, 2]|min }} {{ [3, 1, 2]|max }} {{ ['b', 'A']|min }} {{ []|max }}",
    "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ [1, 2, 3]|batch(2, 'x')|list }}",
    "{{ 'a\nb\n\nc'|indent }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent(2, blank=true) }}|{{ 'a\nb'|indent('> ') }}|{{ 'x'|indent(first=true) }}",
    "{{ 'one two  three\nfour'|wordcount }} {{ 'abc'|center(9) }}|{{ 'ab'|center(7) }}| {{ '%s-%05.1f-%d-%x-%r%%'|format('a', 3.14159, 7, 255, 'q') }}",
    "{{ {'a': 1, 'b': [1, 2.5, none, true], 'c': 'é\"\\n'}|tojson }}",
    "{{ {'b': 1, 'a': {'d': 2, 'c': 3}}|tojson(indent=2, sort_keys=true) }}",
    "{{ {'a': [1, {}], 'e': []}|tojson(indent=4) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ 'é😀\\x7f'|tojson(ensure_ascii=true) }}|{{ 'é\\x7f'|tojson }}",
    "{{ 1.0|tojson }} {{ 1e20|tojson }} {{ 0.1|tojson }} {{ -0.0|tojson }} {{ none|tojson }} {{ 'x'|tojson }} {{ (1, 2)|tojson }}",
    "{{ messages|tojson }}",
    "{{ {'k': 'v'}|attr('items') is callable }} {{ {'k': 'v'}|attr('k') is defined }}",
    # str methods
    "{{ 'a,b,,c'.split(',') }} {{ '  a b  c '.split() }} {{ 'a b c'.split(' ', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} {{ '  a b  c '.rsplit(None, 1) }} {{ 'x'.split('x') }}",
    "{{ 'l1\\nl2\\r\\nl3\\rl4\\n'.splitlines() }} {{ 'a\\nb\\n'.splitlines(true) }} {{ ''.splitlines() }}",
    "{{ '  x  '.strip() }}|{{ '  x  '.lstrip() }}|{{ '  x  '.rstrip() }}|{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'abcxcba'.strip('ab') }}",
    "{{ 'Hello'.startswith('He') }}{{ 'Hello'.endswith('lo') }}{{ 'Hello'.startswith(('x', 'H')) }}{{ 'Hello'.startswith('l', 2) }}{{ 'Hello'.endswith('l', 0, 4) }}",
    "{{ 'hello'.upper() }} {{ 'HeLLo'.lower() }} {{ 'hello world'.title() }} {{ 'hELLO'.capitalize() }} {{ 'HeLLo'.swapcase() }} {{ 'straße'.upper() }} {{ 'ÀÉÎ'.lower() }}",
    "{{ 'aXbXc'.replace('X', '-') }} {{ 'aXbXc'.replace('X', '-', 1) }} {{ 'abc'.replace('', '.') }} {{ 'héllo'.find('l') }} {{ 'héllo'.rfind('l') }} {{ 'abc'.find('z') }} {{ 'héllo'.index('o') }} {{ 'aaaa'.count('aa') }} {{ 'abc'.count('') }}",
    "{{ ', '.join(['a', 'b']) }} {{ ''.join('xyz') }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} {{ 'a1'.isalnum() }} {{ ' \\t'.isspace() }} {{ 'abc'.islower() }} {{ 'ABC'.isupper() }} {{ ''.isdigit() }} {{ '²'.isdigit() }} {{ '½'.isnumeric() }}",
    "{{ '{} and {}'.format('a', 'b') }} {{ '{1}{0}'.format('a', 'b') }} {{ '{x}!'.format(x=3) }} {{ '{{literal}}'.format() }} {{ '{!r}'.format('q') }}",
    "{{ 'ab'.center(6, '*') }} {{ 'ab'.ljust(4, '.') }} {{ 'ab'.rjust(4) }} {{ '-42'.zfill(6) }} {{ 'a=b=c'.partition('=') }} {{ 'a=b=c'.rpartition('=') }} {{ 'prefix_x'.removeprefix('prefix_') }} {{ 'x.txt'.removesuffix('.txt') }}",
    "{{ 'héllo'[1] }} {{ 'héllo'[-1] }} {{ 'héllo'[1:3] }} {{ 'héllo'[::-1] }} {{ 'héllo'[::2] }} {{ 'abc'[5] }}|{{ [1, 2, 3][-1] }} {{ [1, 2, 3][1:] }} {{ [1, 2, 3][:-1] }} {{ [1, 2, 3][::-1] }} {{ [1, 2, 3][10] }}|{{ (1, 2, 3)[1:] }}",
    # dict / list access and methods
    "{{ {'a': 1}.get('a') }} {{ {'a': 1}.get('b') }} {{ {'a': 1}.get('b', 2) }} {{ {'a': 1, 'b': 2}.keys()|list }} {{ {'a': 1, 'b': 2}.values()|list }} {{ {'a': 1}['a'] }} {{ {'a': 1}.a }} {{ {'a': 1}.b is defined }}",
    "{{ {'items': 'key'}['items'] }} {{ {'items': 'key'}.items() }} {{ [1, 2, 1].count(1) }} {{ [1, 2, 3].index(2) }} {{ messages[0].role }} {{ messages[0]['content'] }} {{ messages[-1].role }} {{ messages[9] is defined }}",
    "{{ none.attr is defined }} {{ 5.attr is defined }} {{ 'str'.nope is defined }}",
    # globals
    "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b='x') }} {{ namespace(a=1).a }} {{ namespace({'k': 2}).k }}",
    "{% if messages|length > 5 %}{{ raise_exception('too many messages') }}{% endif %}ok",
    "{{ strftime_now('%Y') | length }}",
    # add_generation_prompt, tools, documents, bos_token
    "{{ add_generation_prompt }} {{ tools }} {{ documents }} {{ tools is none }} {{ bos_token is defined }}",
]
# expected to fail in both (errors are data / template errors, not crashes)
ERROR_SNIPPETS = [
    ("{{ undefined_name.attr }}", "undefined"),
    ("{{ 1 + 'a' }}", "unsupported operand"),
    ("{{ 1 / 0 }}", "division"),
    ("{{ raise_exception('custom failure') }}", "custom failure"),
    ("{{ none + 1 }}", "unsupported operand"),
    ("{{ [1, 2].append(3) }}", "unsafe"),
    ("{{ {}.update({}) }}", "unsafe"),
    ("{{ 'x'.__class__.__name__ }}", "unsafe"),
    ("{{ x() }}", "undefined"),
    ("{{ 5() }}", "not callable"),
    ("{{ 1 < 'a' }}", "not supported"),
    ("{% for a, b in [1, 2] %}{% endfor %}", ""),
    ("{{ 'abc' | tojson(indent='x', bad=1) }}", "unexpected keyword"),
    ("{{ undefined_thing | tojson }}", "not JSON serializable"),
    ("{% set x.y = 1 %}", "non-namespace"),
    ("{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", "argument"),
    ("{{ 'a'.index('z') }}", "not found"),
    ("{{ messages[0].content.startswith(1) }}", ""),
    ("{{ 'a' in 1 }}", "not iterable"),
    ("{% for x in none %}{% endfor %}", "not iterable"),
]
# parse errors: kiln must fail naming the construct / problem and the line (jinja2 fails too)
UNSUPPORTED = [
    ("ok\n{% include 'other.html' %}", "2: unsupported construct '{% include %}'"),
    ("{% extends 'base' %}", "1: unsupported construct '{% extends %}'"),
    ("a\nb\n{% import 'x' as y %}", "3: unsupported construct '{% import %}'"),
    ("{% block body %}x{% endblock %}", "unsupported construct '{% block %}'"),
    ("{% call m() %}x{% endcall %}", "unsupported construct '{% call %}'"),
    ("{% do x.append(1) %}", "unsupported construct '{% do %}'"),
    ("\n\n\n{{ x|xmlattr }}", "4: unsupported construct 'filter xmlattr'"),
    ("{{ x is frobnicated }}", "1: unsupported construct 'test frobnicated'"),
    ("{% frob %}", "1: unsupported construct '{% frob %}' (unknown tag)"),
    ("{% for x in y %}", "unexpected end of template"),
    ("{% if x %}{% endfor %}", "unexpected"),
    ("{{ (1 }}", "unexpected"),
    ("{{ 'unterminated }}", "unterminated string"),
    ("{{ f(*args) }}", "unsupported construct '*args'"),
    ("{% for x in y recursive %}{% endfor %}", "recursive"),
    ("{{ 'x'.encode() }}", "unsupported construct 'str.encode'"),
]


def run_snippets():
    msgs = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello", "reasoning_content": None}, {"role": "user", "content": ""}]
    dummy = tmpfile("", ".jinja")
    for i, src in enumerate(SNIPPETS):
        t = tmpfile(src, ".jinja")
        check(f"snippet {i}: {src[:50]!r}", dummy, src, msgs, None, True, None, None, template=t)
    for i, (src, needle) in enumerate(ERROR_SNIPPETS):
        t = tmpfile(src, ".jinja")
        pok, pout = py_render(src, msgs, None, True, {})
        if pok:
            FAILS.append(f"error snippet {i} {src!r}: jinja2 did not fail (test is wrong): {pout!r}")
            continue
        check(f"error snippet {i}: {src!r}", dummy, src, msgs, None, True, None, None, template=t, expect_error=needle)
    for i, (src, needle) in enumerate(UNSUPPORTED):
        t = tmpfile(src, ".jinja")
        kok, kout = kiln_render(dummy, msgs, None, True, None, template=t) if i < 3 else (False, None)
        if not i < 3:
            PENDING.append((f"unsupported {i}", (False, "parse error"), {"path": dummy, "template": t, "messages": msgs}, needle))
            continue
        if kok or needle not in kout:
            FAILS.append(f"unsupported {i} {src!r}: want an error containing {needle!r}, got ok={kok}: {kout!r}")
        else:
            COUNTS["both_fail"] += 1


def main():
    run_templates()
    run_snippets()
    run_batch()
    total = COUNTS["match"] + COUNTS["both_fail"] + len(FAILS)
    for f in FAILS:
        print("FAIL", f)
    print(f"{total} cases: {COUNTS['match']} byte-identical renders, {COUNTS['both_fail']} agreed failures, "
          f"{len(FAILS)} mismatches")
    sys.exit(1 if FAILS else 0)


if __name__ == "__main__":
    main()
