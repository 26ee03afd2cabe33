// test_server_tools.mjs — tool calls and reasoning through the official `openai` npm client, on tiny
// random-weight models carrying the DeepSeek-V3 tokenizer ($SHARED/tokenizers/deepseek-v3) and the
// published GLM-4.6 and Kimi K2 chat templates ($SHARED/tokenizers/templates). The model's output is
// forced with the server's test hook (--test-forced-output: the tokens of a text, then the end id)
// so that the parsers read the families' real formats through the real tokenizer and streaming
// detokenizer. Checked:
//   - a GLM round trip: tools → tool_calls (arguments typed by the tool's schema, reasoning split into
//     reasoning_content, finish_reason tool_calls, reasoning_tokens counted), streamed deltas the
//     client assembles into the same call, then the history with the assistant's tool_calls and the
//     tool result rendered exactly as Python jinja2 renders the published template with the arguments
//     parsed into a mapping (vLLM's preprocessing), tokenized by @huggingface/tokenizers;
//   - a Kimi K2 round trip: ids "functions.NAME:IDX", arguments verbatim, content before the section;
//   - tool_choice none (no parsing), a named function (one call of it, finish_reason stop; its arguments
//     are decoded under its schema: test_server_tool_choice.mjs),
//     parallel_tool_calls false, enable_thinking false (no reasoning split), and bad requests (400
//     naming the parameter);
//   - skip_special_tokens (special tokens out of the text by default), /tokenize and /detokenize
//     against @huggingface/tokenizers, CORS headers and preflight.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Tokenizer } from '@huggingface/tokenizers';
import { startServer, client, raw, makeTokenizerModel, SHARED } from './lib.mjs';

const TOK = path.join(SHARED, 'tokenizers', 'deepseek-v3');
const TPL = path.join(SHARED, 'tokenizers', 'templates');
if (!fs.existsSync(path.join(TOK, 'tokenizer.json')) || !fs.existsSync(path.join(TPL, 'glm-4.6.jinja'))) {
  console.log('SKIP: no $SHARED/tokenizers/deepseek-v3 or templates');
  process.exit(77);
}
const PY = process.env.PY || '/usr/bin/python3';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-tools-'));
const makeModel = (name, template) => makeTokenizerModel(dir, name, TOK, path.join(TPL, template));
const glm = makeModel('glm', 'glm-4.6.jinja');
const kimi = makeModel('kimi', 'kimi-k2.jinja');
const cfg = JSON.parse(fs.readFileSync(path.join(TOK, 'tokenizer_config.json'), 'utf8'));
const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(TOK, 'tokenizer.json'), 'utf8')), cfg);

// transformers' apply_chat_template environment in Python's jinja2 (as test_server_chat_template.mjs)
const RENDER = `
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters['tojson'] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(m): raise Exception(m)
env.globals['raise_exception'] = raise_exception
cfg = json.load(open(sys.argv[1]))
kw = dict(messages=json.loads(sys.argv[3]), tools=json.loads(sys.argv[4]), add_generation_prompt=True, bos_token=cfg.get('bos_token'), eos_token=cfg.get('eos_token'))
sys.stdout.write(env.from_string(open(sys.argv[2]).read()).render(**kw))
`;
function referenceIds(template, messages, tools) {
  const r = spawnSync(PY, ['-c', RENDER, path.join(TOK, 'tokenizer_config.json'), path.join(TPL, template), JSON.stringify(messages), JSON.stringify(tools)],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return tok.encode(r.stdout, { add_special_tokens: false }).ids;
}

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather of a city', parameters: { type: 'object',
    properties: { city: { type: 'string' }, days: { type: 'integer' }, zip: { type: 'string' } }, required: ['city'] } } },
  { type: 'function', function: { name: 'search', description: 'Web search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } },
];
const GLM_OUT = '<think>The user asks for the weather, so I call the tool.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n'
  + '<arg_value>東京</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>zip</arg_key>\n<arg_value>01234</arg_value>\n'
  + '</tool_call>\n<tool_call>search\n<arg_key>q</arg_key>\n<arg_value>Tokyo events</arg_value>\n</tool_call>';
const GLM_ANSWER = '<think>The tool said sunny.</think>\nIt will be sunny in Tokyo.';
const KIMI_OUT = 'Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>'
  + '{"city": "Beijing", "days": 2}<|tool_call_end|><|tool_calls_section_end|>';

const servers = [];
async function serve(model, out) {
  const srv = await startServer(['--model-name', 'm', '--test-forced-output', out], { model });
  servers.push(srv);
  return srv;
}
const SPECIAL_OUT = 'A<｜begin▁of▁sentence｜>B';
const gTools = await serve(glm, GLM_OUT);
const gAnswer = await serve(glm, GLM_ANSWER);
const kTools = await serve(kimi, KIMI_OUT);
const sSpecial = await (async () => {
  const srv = await startServer(['--model-name', 'm', '--test-forced-output', SPECIAL_OUT, '--cors-origin', 'https://app.example'], { model: glm });
  servers.push(srv);
  return srv;
})();
test.after(async () => {
  for (const s of servers) assert.equal(await s.stop(), 0);
  fs.rmSync(dir, { recursive: true });
});

const USER = [{ role: 'user', content: 'What is the weather in Tokyo for 3 days?' }];

test('the start-up summary names the parsers chosen from the templates', () => {
  assert.match(gTools.log(), /tool calls glm45, reasoning <think>/);
  assert.match(kTools.log(), /tool calls kimi_k2, reasoning none/);
});

test('GLM: tool_calls, reasoning_content, finish_reason, reasoning tokens', async () => {
  const r = await client(gTools).chat.completions.create({ model: 'm', messages: USER, tools: TOOLS });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, null, 'whitespace before the first call is no content');
  assert.equal(c.message.reasoning_content, 'The user asks for the weather, so I call the tool.');
  assert.equal(c.message.tool_calls.length, 2);
  const [a, b] = c.message.tool_calls;
  assert.equal(a.type, 'function');
  assert.match(a.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
  assert.notEqual(a.id, b.id);
  assert.equal(a.function.name, 'get_weather');
  // typed by the schema: zip stays a string, days becomes an integer; json.dumps spacing
  assert.equal(a.function.arguments, '{"city": "東京", "days": 3, "zip": "01234"}');
  assert.deepEqual(JSON.parse(b.function.arguments), { q: 'Tokyo events' });
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens > 5);
  assert.ok(r.usage.completion_tokens_details.reasoning_tokens < r.usage.completion_tokens);
});

test('GLM: the same calls streamed, assembled by the client', async () => {
  const stream = await client(gTools).chat.completions.create({ model: 'm', messages: USER, tools: TOOLS, stream: true });
  let reasoning = '', content = '', finish = null;
  const calls = [];
  for await (const ch of stream) {
    const d = ch.choices[0]?.delta ?? {};
    reasoning += d.reasoning_content ?? '';
    content += d.content ?? '';
    for (const tc of d.tool_calls ?? []) {
      calls[tc.index] ??= { id: '', name: '', arguments: '' };
      if (tc.id) calls[tc.index].id = tc.id;
      if (tc.function?.name) calls[tc.index].name += tc.function.name;
      calls[tc.index].arguments += tc.function?.arguments ?? '';
    }
    if (ch.choices[0]?.finish_reason) finish = ch.choices[0].finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.equal(reasoning, 'The user asks for the weather, so I call the tool.');
  assert.equal(content.trim(), '');
  assert.ok(!content.includes('<'), 'no marker text leaks into content');
  assert.equal(calls.length, 2);
  assert.equal(calls[0].name, 'get_weather');
  assert.equal(calls[0].arguments, '{"city": "東京", "days": 3, "zip": "01234"}');
  assert.match(calls[0].id, /^chatcmpl-tool-[0-9a-f]{32}$/);
  // the client's own stream helper assembles the same message
  const runner = client(gTools).chat.completions.stream({ model: 'm', messages: USER, tools: TOOLS });
  const fin = await runner.finalChatCompletion();
  assert.equal(fin.choices[0].message.tool_calls[0].function.arguments, '{"city": "東京", "days": 3, "zip": "01234"}');
  assert.equal(fin.choices[0].message.tool_calls[1].function.name, 'search');
});

test('GLM: the tool result round trip renders the published template exactly', async () => {
  const first = await client(gTools).chat.completions.create({ model: 'm', messages: USER, tools: TOOLS });
  const calls = first.choices[0].message.tool_calls;
  const history = [...USER,
    { role: 'assistant', content: null, tool_calls: calls.map((t) => ({ id: t.id, type: 'function', function: t.function })) },
    { role: 'tool', tool_call_id: calls[0].id, content: 'sunny, 24 C' },
    { role: 'tool', tool_call_id: calls[1].id, content: 'a festival' }];
  const r = await client(gAnswer).chat.completions.create({ model: 'm', messages: history, tools: TOOLS });
  assert.equal(r.choices[0].finish_reason, 'stop');
  assert.equal(r.choices[0].message.content, '\nIt will be sunny in Tokyo.');
  assert.equal(r.choices[0].message.reasoning_content, 'The tool said sunny.');
  assert.equal(r.choices[0].message.tool_calls, undefined);
  // the reference: arguments parsed into mappings (vLLM's preprocessing), content null as ''
  const refHistory = history.map((m) => m.tool_calls
    ? { ...m, content: '', tool_calls: m.tool_calls.map((t) => ({ ...t, function: { name: t.function.name, arguments: JSON.parse(t.function.arguments) } })) }
    : m);
  const ids = referenceIds('glm-4.6.jinja', refHistory, TOOLS);
  assert.equal(r.usage.prompt_tokens, ids.length);
});

test('Kimi K2: ids functions.NAME:IDX, arguments verbatim, content before the section', async () => {
  const r = await client(kTools).chat.completions.create({ model: 'm', messages: USER, tools: TOOLS });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'tool_calls');
  assert.equal(c.message.content, 'Let me check.');
  assert.equal(c.message.reasoning_content, undefined, 'the K2 template has no thinking');
  assert.deepEqual(c.message.tool_calls, [{ id: 'functions.get_weather:0', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Beijing", "days": 2}' } }]);
  const stream = await client(kTools).chat.completions.create({ model: 'm', messages: USER, tools: TOOLS, stream: true });
  let content = '';
  const calls = [];
  for await (const ch of stream) {
    const d = ch.choices[0]?.delta ?? {};
    content += d.content ?? '';
    for (const tc of d.tool_calls ?? []) calls.push(tc);
  }
  assert.equal(content, 'Let me check.');
  assert.equal(calls.length, 1);
  assert.equal(calls[0].id, 'functions.get_weather:0');
  assert.equal(calls[0].function.arguments, '{"city": "Beijing", "days": 2}');
  // the prompt with tools is the published template's
  assert.equal(r.usage.prompt_tokens, referenceIds('kimi-k2.jinja', USER, TOOLS).length);
});

test('tool_choice none, a named function, parallel_tool_calls false, thinking off', async () => {
  const ai = client(gTools);
  const none = await ai.chat.completions.create({ model: 'm', messages: USER, tools: TOOLS, tool_choice: 'none' });
  assert.equal(none.choices[0].finish_reason, 'stop');
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.ok(none.choices[0].message.content.includes('<tool_call>get_weather'));
  const named = await ai.chat.completions.create({ model: 'm', messages: USER, tools: TOOLS, tool_choice: { type: 'function', function: { name: 'search' } } });
  assert.equal(named.choices[0].finish_reason, 'stop');
  assert.deepEqual(named.choices[0].message.tool_calls.map((t) => t.function.name), ['search']);
  const single = await ai.chat.completions.create({ model: 'm', messages: USER, tools: TOOLS, parallel_tool_calls: false });
  assert.deepEqual(single.choices[0].message.tool_calls.map((t) => t.function.name), ['get_weather']);
  const off = await ai.chat.completions.create({ model: 'm', messages: USER, tools: TOOLS, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(off.choices[0].message.reasoning_content, undefined);
  assert.equal(off.choices[0].message.tool_calls.length, 2);
  assert.equal(off.usage.completion_tokens_details.reasoning_tokens, 0);
});

test('bad tools requests: 400 naming the parameter', async () => {
  const bad = [
    [{ tools: [{ type: 'function', function: { name: 'bad name!' } }] }, 'tools'],
    [{ tools: [{ type: 'retrieval' }] }, 'tools'],
    [{ tools: TOOLS, tool_choice: 'sometimes' }, 'tool_choice'],
    [{ tools: TOOLS, tool_choice: { type: 'function', function: { name: 'nope' } } }, 'tool_choice'],
    [{ tool_choice: 'required' }, 'tool_choice'],
    [{ messages: [...USER, { role: 'assistant', content: null, tool_calls: [{ id: 'x', type: 'function', function: { name: 'search', arguments: '{not json' } }] }] }, 'messages'],
  ];
  for (const [body, param] of bad) {
    const r = await raw(gTools, '/v1/chat/completions', { body: JSON.stringify({ model: 'm', messages: USER, ...body }) });
    assert.equal(r.status, 400, JSON.stringify(body));
    assert.equal(r.json.error.param, param, r.text);
  }
  const h = await fetch(`${gTools.url}/health`);
  assert.equal(h.status, 200, 'still serving');
});

test('skip_special_tokens: special tokens leave no text unless asked for', async () => {
  const ai = client(sSpecial);
  const def = await ai.chat.completions.create({ model: 'm', messages: USER });
  assert.equal(def.choices[0].message.content, 'AB');
  const keep = await ai.chat.completions.create({ model: 'm', messages: USER, skip_special_tokens: false });
  assert.equal(keep.choices[0].message.content, SPECIAL_OUT);
  assert.equal(def.usage.completion_tokens, keep.usage.completion_tokens);
});

test('/tokenize and /detokenize agree with @huggingface/tokenizers', async () => {
  const text = 'Hello, 世界! Tool calls <tool_call> are text here.';
  const t = await raw(gTools, '/tokenize', { body: JSON.stringify({ model: 'm', prompt: text }) });
  assert.equal(t.status, 200, t.text);
  // add_special_tokens defaults to true: BOS first, as transformers' encode does for this tokenizer
  // (tokenizer_config.json add_bos_token); @huggingface/tokenizers applies only tokenizer.json
  const bosText = typeof cfg.bos_token === 'string' ? cfg.bos_token : cfg.bos_token.content;
  assert.equal(cfg.add_bos_token, true);
  assert.deepEqual(t.json.tokens, [tok.token_to_id(bosText), ...tok.encode(text, { add_special_tokens: false }).ids]);
  assert.equal(t.json.count, t.json.tokens.length);
  assert.equal(t.json.max_model_len, 2048);
  const t2 = await raw(gTools, '/tokenize', { body: JSON.stringify({ prompt: text, add_special_tokens: false }) });
  assert.deepEqual(t2.json.tokens, tok.encode(text, { add_special_tokens: false }).ids);
  const tm = await raw(gTools, '/tokenize', { body: JSON.stringify({ messages: USER, tools: TOOLS }) });
  assert.deepEqual(tm.json.tokens, referenceIds('glm-4.6.jinja', USER, TOOLS));
  const d = await raw(gTools, '/detokenize', { body: JSON.stringify({ tokens: t2.json.tokens }) });
  assert.equal(d.json.prompt, tok.decode(t2.json.tokens));
  assert.equal(d.json.prompt, text);
  const bad = await raw(gTools, '/detokenize', { body: JSON.stringify({ tokens: [1, 999999] }) });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'tokens');
});

test('CORS: the allowed origin on responses and preflights, nothing for others', async () => {
  const pre = await fetch(`${sSpecial.url}/v1/chat/completions`, { method: 'OPTIONS', headers: { Origin: 'https://app.example', 'Access-Control-Request-Method': 'POST' } });
  assert.equal(pre.status, 204);
  assert.equal(pre.headers.get('access-control-allow-origin'), 'https://app.example');
  assert.match(pre.headers.get('access-control-allow-headers'), /Authorization/);
  assert.match(pre.headers.get('access-control-allow-methods'), /POST/);
  const r = await fetch(`${sSpecial.url}/v1/models`, { headers: { Origin: 'https://app.example' } });
  assert.equal(r.headers.get('access-control-allow-origin'), 'https://app.example');
  const other = await fetch(`${sSpecial.url}/v1/models`, { headers: { Origin: 'https://evil.example' } });
  assert.equal(other.headers.get('access-control-allow-origin'), null);
  const none = await fetch(`${gTools.url}/v1/models`, { headers: { Origin: 'https://app.example' } });
  assert.equal(none.headers.get('access-control-allow-origin'), null, 'no --cors-origin: no CORS');
});

test('fields that change nothing are listed in X-Kiln-Ignored-Fields', async () => {
  const r = await raw(gTools, '/v1/chat/completions', { body: JSON.stringify({ model: 'm', messages: USER, max_tokens: 2, user: 'u-1', frobnicate: 3 }) });
  assert.equal(r.status, 200);
  assert.equal(r.headers.get('x-kiln-ignored-fields'), 'user, frobnicate');
  const plain = await raw(gTools, '/v1/chat/completions', { body: JSON.stringify({ model: 'm', messages: USER, max_tokens: 2 }) });
  assert.equal(plain.headers.get('x-kiln-ignored-fields'), null);
});
