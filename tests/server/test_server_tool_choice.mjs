// test_server_tool_choice.mjs — tool_choice naming a function is decoded under that function's
// parameters schema (issue 22; vLLM's behaviour): whatever the model would write, the answer is one
// call of that function whose arguments are a JSON document of its schema. A GLM-4.6-templated
// random-weight model with the DeepSeek-V3 tokenizer (it never writes a tool call by itself), 20
// sampled seeds through the official `openai` client: tool_calls[0] names the function, its
// arguments validate against the schema with ajv (an independent validator), content is null,
// finish_reason "stop" (OpenAI's, for a forced function); streamed, the client's assembled call
// equals the non-streamed one of the same seed. A function without parameters gets any JSON object.
// "required" (vLLM's form): the output is a JSON list [{"name", "arguments"}] under a grammar whose
// names are the declared functions and whose arguments follow the chosen function's schema; the
// answer carries those calls (finish_reason "tool_calls"), streamed as one tool_calls delta.
// The Anthropic API's tool_choice {"type": "tool"} and {"type": "any"} map to these and answer
// tool_use blocks (the official @anthropic-ai/sdk client, streamed and not).
// A schema kiln cannot decode under, and response_format next to a named function, are 400s naming
// the parameter.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import Ajv from 'ajv';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, client, makeTokenizerModel, SHARED } from './lib.mjs';

const TOK = path.join(SHARED, 'tokenizers', 'deepseek-v3');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-toolchoice-'));
const model = makeTokenizerModel(dir, 'glm', TOK, path.join(SHARED, 'tokenizers', 'templates', 'glm-4.6.jinja'));
const srv = await startServer(['--model-name', 'glm'], { model });
const ai = client(srv);
test.after(async () => { assert.equal(await srv.stop(), 0); fs.rmSync(dir, { recursive: true }); });

const WEATHER = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 1, maxLength: 16 },
    days: { type: 'integer' },
    unit: { enum: ['celsius', 'fahrenheit'] },
  },
  required: ['city', 'days', 'unit'],
  additionalProperties: false,
};
const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: WEATHER } },
  { type: 'function', function: { name: 'ping' } },
];
const validate = new Ajv({ strict: false }).compile(WEATHER);
const ask = (extra) => ({ model: 'glm', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: TOOLS, max_tokens: 120, temperature: 1, ...extra });

test('a named function: arguments of its schema, 20 seeds, streamed = whole', async () => {
  for (let seed = 1; seed <= 20; seed++) {
    const r = await ai.chat.completions.create(ask({ seed, tool_choice: { type: 'function', function: { name: 'get_weather' } } }));
    const m = r.choices[0].message;
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(m.content, null);
    assert.equal(m.tool_calls.length, 1);
    const call = m.tool_calls[0];
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
    const args = JSON.parse(call.function.arguments);
    assert.ok(validate(args), `seed ${seed}: ${call.function.arguments} ${JSON.stringify(validate.errors)}`);
    if (seed <= 3) { // streamed, the client assembles the same call
      let name = '', text = '', id = null, finish = null;
      for await (const ch of await ai.chat.completions.create(ask({ seed, stream: true, tool_choice: { type: 'function', function: { name: 'get_weather' } } }))) {
        const c = ch.choices[0];
        if (!c) continue;
        assert.ok(!c.delta.content, 'no content deltas (the role chunk\'s empty content aside)');
        for (const tc of c.delta.tool_calls || []) {
          assert.equal(tc.index, 0);
          if (tc.id) id = tc.id;
          if (tc.function?.name) name += tc.function.name;
          if (tc.function?.arguments) text += tc.function.arguments;
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      assert.equal(name, 'get_weather');
      assert.match(id, /^chatcmpl-tool-/);
      assert.equal(text, call.function.arguments, 'streamed arguments = non-streamed (same seed)');
      assert.equal(finish, 'stop');
    }
  }
});

test('a named function without parameters: a JSON object (json_object mode)', async () => {
  // a random model's strings rarely close, so the answer may end at max_tokens inside one: then the
  // arguments are an object's unfinished text; when it stops, they parse to an object
  const r = await ai.chat.completions.create(ask({ seed: 5, tool_choice: { type: 'function', function: { name: 'ping' } } }));
  const call = r.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'ping');
  assert.ok(call.function.arguments.startsWith('{'), call.function.arguments);
  if (r.choices[0].finish_reason === 'stop') {
    const v = JSON.parse(call.function.arguments);
    assert.ok(v && typeof v === 'object' && !Array.isArray(v), call.function.arguments);
  } else assert.equal(r.choices[0].finish_reason, 'length');
});

test('"required": a list of calls of the declared functions, their arguments of each schema', async () => {
  const byName = { get_weather: validate };
  let multi = 0, whole = 0;
  for (let seed = 1; seed <= 15; seed++) {
    const r = await ai.chat.completions.create(ask({ seed, tool_choice: 'required', max_tokens: 200 }));
    const c = r.choices[0];
    if (c.finish_reason === 'length') continue; // a random model's "ping" object may not close in time
    assert.equal(c.finish_reason, 'tool_calls');
    whole++;
    assert.equal(c.message.content, null);
    assert.ok(c.message.tool_calls.length >= 1);
    multi += c.message.tool_calls.length > 1;
    for (const call of c.message.tool_calls) {
      assert.ok(['get_weather', 'ping'].includes(call.function.name), call.function.name);
      assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
      const args = JSON.parse(call.function.arguments);
      if (byName[call.function.name]) assert.ok(byName[call.function.name](args), `seed ${seed}: ${call.function.arguments}`);
      else assert.ok(args && typeof args === 'object' && !Array.isArray(args));
    }
  }
  assert.ok(whole >= 5, `${whole} of 15 seeds gave whole call lists`);
  console.log(`# required: ${whole} of 15 seeds whole (${multi} with several calls)`);
  // parallel_tool_calls false: exactly one call; streamed, the client gets the same calls
  const one = await ai.chat.completions.create(ask({ seed: 3, tool_choice: 'required', parallel_tool_calls: false,
    tools: [TOOLS[0]], max_tokens: 200 }));
  assert.equal(one.choices[0].message.tool_calls.length, 1);
  assert.ok(validate(JSON.parse(one.choices[0].message.tool_calls[0].function.arguments)));
  const calls = [];
  let finish = null;
  for await (const ch of await ai.chat.completions.create(ask({ seed: 3, stream: true, tool_choice: 'required', parallel_tool_calls: false,
    tools: [TOOLS[0]], max_tokens: 200 }))) {
    const c = ch.choices[0];
    if (!c) continue;
    for (const tc of c.delta.tool_calls || []) calls[tc.index] = { name: tc.function.name, arguments: tc.function.arguments };
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.deepEqual(calls, [{ name: 'get_weather', arguments: one.choices[0].message.tool_calls[0].function.arguments }]);
});

test('Anthropic API: tool_choice tool and any give tool_use blocks of the schemas, streamed and not', async () => {
  const an = new Anthropic({ baseURL: srv.url, apiKey: 'none', maxRetries: 0, timeout: 60000 });
  const tools = [{ name: 'get_weather', description: 'Weather for a city', input_schema: WEATHER }];
  const base = { model: 'glm', max_tokens: 400, temperature: 0, messages: [{ role: 'user', content: 'Weather in Paris?' }], tools };
  // ("any" with parallel calls off: a random model would otherwise keep appending calls up to max_tokens)
  for (const tool_choice of [{ type: 'tool', name: 'get_weather' }, { type: 'any', disable_parallel_tool_use: true }]) {
    const m = await an.messages.create({ ...base, tool_choice });
    assert.equal(m.stop_reason, 'tool_use', JSON.stringify(m.content));
    const uses = m.content.filter((b) => b.type === 'tool_use');
    assert.ok(uses.length >= 1);
    assert.ok(m.content.every((b) => b.type === 'tool_use'), 'no text block');
    for (const u of uses) {
      assert.equal(u.name, 'get_weather');
      assert.ok(validate(u.input), JSON.stringify(u.input));
    }
    const stream = an.messages.stream({ ...base, tool_choice });
    const fin = await stream.finalMessage();
    assert.equal(fin.stop_reason, 'tool_use');
    const su = fin.content.filter((b) => b.type === 'tool_use');
    assert.ok(su.length >= 1 && su.every((u) => u.name === 'get_weather' && validate(u.input)), JSON.stringify(fin.content));
  }
});

test('400s: a schema kiln cannot decode under; response_format with a named function', async () => {
  const bad = [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { anyOf: [{ type: 'string' }, { type: 'integer' }] } } } } }];
  await assert.rejects(ai.chat.completions.create(ask({ tools: bad, tool_choice: { type: 'function', function: { name: 'f' } } })),
    (e) => e.status === 400 && e.param === 'tool_choice' && /parameters/.test(e.message) && /anyOf/.test(e.message));
  await assert.rejects(ai.chat.completions.create(ask({ tool_choice: { type: 'function', function: { name: 'get_weather' } }, response_format: { type: 'json_object' } })),
    (e) => e.status === 400 && e.param === 'response_format');
  await assert.rejects(ai.chat.completions.create(ask({ tools: bad, tool_choice: 'required' })),
    (e) => e.status === 400 && e.param === 'tool_choice' && /tools\[0\]\.function\.parameters/.test(e.message));
});
