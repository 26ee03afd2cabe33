// test_server_responses.mjs — OpenAI's Responses API (POST /v1/responses) through the official
// `openai` client's responses.create / responses.stream, on the tiny GLM-4.6-templated model of
// test_server_anthropic.mjs (DeepSeek-V3 tokenizer, output forced with --test-forced-output so that
// the GLM format reaches the parsers). Checked: a function-call round trip (tools → reasoning +
// function_call items with typed arguments → function_call_output → a message answer), the
// translated conversation equal to the chat completion the same history asks for (same prompt
// tokens), the same response streamed and assembled by the SDK's ResponseStream (every event type
// it checks, sequence numbers in order), instructions, max_output_tokens (status incomplete),
// reasoning.effort none, text.format json_schema, and errors naming the parameter.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { startServer, client, raw, glmTemplatedModel } from './lib.mjs';

const { dir, model } = glmTemplatedModel('kiln-responses-');

const CALL_OUT = '<think>I should look the weather up.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n'
  + '<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>';
const ANSWER_OUT = '<think>Sunny.</think>It will be sunny in Paris.';
const JSON_OUT = '{"city": "Paris", "days": 2}';
const KEY = 'sk-test-responses';
const servers = [];
async function serve(out) {
  const srv = await startServer(['--model-name', 'glm-tiny', '--api-key', KEY, '--test-forced-output', out], { model });
  servers.push(srv);
  return srv;
}
const sCall = await serve(CALL_OUT);
const sAnswer = await serve(ANSWER_OUT);
const sJson = await serve(JSON_OUT);
test.after(async () => {
  for (const s of servers) assert.equal(await s.stop(), 0);
  fs.rmSync(dir, { recursive: true });
});

const TOOLS = [{ type: 'function', name: 'get_weather', description: 'Weather of a city', strict: false,
  parameters: { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } }];
const INPUT = [{ role: 'user', content: 'Weather in Paris for 2 days?' }];

test('function-call round trip: reasoning and function_call items, then function_call_output and the answer', async () => {
  const r = await client(sCall, KEY).responses.create({ model: 'glm-tiny', instructions: 'You are terse.', input: INPUT, tools: TOOLS, max_output_tokens: 200 });
  assert.equal(r.object, 'response');
  assert.match(r.id, /^resp_[0-9a-f]{32}$/);
  assert.equal(r.status, 'completed');
  assert.equal(r.model, 'glm-tiny');
  assert.equal(r.instructions, 'You are terse.');
  assert.equal(r.max_output_tokens, 200);
  assert.deepEqual(r.output.map((o) => o.type), ['reasoning', 'function_call']);
  assert.equal(r.output[0].content[0].type, 'reasoning_text');
  assert.equal(r.output[0].content[0].text, 'I should look the weather up.');
  const fc = r.output[1];
  assert.match(fc.call_id, /^call_[0-9a-f]{32}$/);
  assert.match(fc.id, /^fc_[0-9a-f]{32}$/);
  assert.equal(fc.name, 'get_weather');
  assert.equal(fc.status, 'completed');
  assert.deepEqual(JSON.parse(fc.arguments), { city: 'Paris', days: 2 }, 'arguments typed by the schema');
  assert.equal(r.output_text, '', 'no message text');
  assert.ok(r.usage.input_tokens > 50 && r.usage.output_tokens > 10);
  assert.equal(r.usage.total_tokens, r.usage.input_tokens + r.usage.output_tokens);
  assert.ok(r.usage.output_tokens_details.reasoning_tokens > 0);

  // the round trip: the previous output items go back as input, with the tool's result
  const history = [...INPUT, ...r.output, { type: 'function_call_output', call_id: fc.call_id, output: 'sunny, 24 C' }];
  const a = await client(sAnswer, KEY).responses.create({ model: 'glm-tiny', instructions: 'You are terse.', input: history, tools: TOOLS });
  assert.equal(a.status, 'completed');
  assert.deepEqual(a.output.map((o) => o.type), ['reasoning', 'message']);
  assert.equal(a.output_text, 'It will be sunny in Paris.');
  assert.equal(a.output[1].role, 'assistant');
  assert.match(a.output[1].id, /^msg_[0-9a-f]{32}$/);
  // the translation is the chat completion the same history asks for: the same prompt tokens
  const oa = await client(sAnswer, KEY).chat.completions.create({ model: 'glm-tiny',
    tools: TOOLS.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.parameters } })),
    messages: [{ role: 'system', content: 'You are terse.' }, ...INPUT,
      { role: 'assistant', content: null, reasoning_content: 'I should look the weather up.',
        tool_calls: [{ id: fc.call_id, type: 'function', function: { name: 'get_weather', arguments: fc.arguments } }] },
      { role: 'tool', tool_call_id: fc.call_id, content: 'sunny, 24 C' }] });
  assert.equal(a.usage.input_tokens, oa.usage.prompt_tokens);
});

test('streaming: the SDK assembles the same response from the typed events', async () => {
  const stream = client(sCall, KEY).responses.stream({ model: 'glm-tiny', input: INPUT, tools: TOOLS, max_output_tokens: 200 });
  const events = [];
  stream.on('event', (e) => events.push(e));
  const r = await stream.finalResponse();
  const types = events.map((e) => e.type);
  assert.equal(types[0], 'response.created');
  assert.equal(types[1], 'response.in_progress');
  assert.equal(types.at(-1), 'response.completed');
  assert.deepEqual(events.map((e) => e.sequence_number), events.map((_, i) => i), 'sequence numbers 0, 1, 2, ...');
  for (const t of ['response.output_item.added', 'response.content_part.added', 'response.reasoning_text.delta', 'response.reasoning_text.done',
    'response.function_call_arguments.delta', 'response.function_call_arguments.done', 'response.output_item.done'])
    assert.ok(types.includes(t), t);
  assert.equal(r.status, 'completed');
  const kinds = r.output.map((o) => o.type);
  assert.equal(kinds[0], 'reasoning');
  assert.equal(kinds.at(-1), 'function_call');
  assert.equal(r.output[0].content[0].text, 'I should look the weather up.');
  assert.deepEqual(JSON.parse(r.output.at(-1).arguments), { city: 'Paris', days: 2 });
  for (const m of r.output.filter((o) => o.type === 'message')) assert.equal(m.content[0].text.trim(), '', 'only whitespace before the call');
  // a message streamed: output_text deltas add up to the text
  let deltas = '';
  const s2 = client(sAnswer, KEY).responses.stream({ model: 'glm-tiny', input: 'Weather?' });
  s2.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const r2 = await s2.finalResponse();
  assert.equal(deltas, 'It will be sunny in Paris.');
  assert.equal(r2.output_text, 'It will be sunny in Paris.');
});

test('max_output_tokens, reasoning.effort none, text.format json_schema', async () => {
  const ai = client(sAnswer, KEY);
  const cut = await ai.responses.create({ model: 'glm-tiny', input: 'Weather?', max_output_tokens: 3 });
  assert.equal(cut.status, 'incomplete');
  assert.deepEqual(cut.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(cut.usage.output_tokens, 3);
  const off = await ai.responses.create({ model: 'glm-tiny', input: 'Weather?', reasoning: { effort: 'none' } });
  assert.deepEqual(off.output.map((o) => o.type), ['message'], 'no reasoning split with thinking off');
  assert.ok(off.output_text.startsWith('<think>Sunny.</think>'));
  const schema = { type: 'object', properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city', 'days'], additionalProperties: false };
  const js = await client(sJson, KEY).responses.create({ model: 'glm-tiny', input: 'Weather?', text: { format: { type: 'json_schema', name: 'w', schema, strict: true } } });
  assert.deepEqual(JSON.parse(js.output_text), { city: 'Paris', days: 2 });
  assert.equal(js.text.format.type, 'json_schema');
});

test('tool_choice naming the function: one function_call item with the constrained arguments, whole and streamed', async () => {
  const ai = client(sJson, KEY);
  const req = { model: 'glm-tiny', input: INPUT, tools: TOOLS, tool_choice: { type: 'function', name: 'get_weather' } };
  const r = await ai.responses.create(req);
  assert.deepEqual(r.output.map((o) => o.type), ['function_call']);
  assert.equal(r.output[0].name, 'get_weather');
  assert.deepEqual(JSON.parse(r.output[0].arguments), { city: 'Paris', days: 2 });
  assert.deepEqual(r.tool_choice, { type: 'function', name: 'get_weather' }, 'the request\'s tool_choice repeated');
  const s = await ai.responses.stream(req).finalResponse();
  assert.deepEqual(s.output.map((o) => o.type), ['function_call']);
  assert.equal(s.output[0].arguments, r.output[0].arguments);
});

test('errors name the parameter; the server keeps serving', async () => {
  await assert.rejects(client(sCall, 'wrong').responses.create({ model: 'glm-tiny', input: 'x' }), (e) => e.status === 401);
  const bad = [
    [{ input: 'x', previous_response_id: 'resp_1' }, 'previous_response_id'],
    [{}, 'input'],
    [{ input: [{ role: 'tool', content: 'x' }] }, 'input'],
    [{ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }, 'input'],
    [{ input: [{ type: 'web_search_call' }] }, 'input'],
    [{ input: 'x', tools: [{ type: 'web_search' }] }, 'tools'],
    [{ input: 'x', tool_choice: 'sometimes' }, 'tool_choice'],
    [{ input: 'x', max_output_tokens: 0 }, 'max_output_tokens'],
    [{ input: 'x', text: { format: { type: 'xml' } } }, 'text'],
  ];
  for (const [body, param] of bad) {
    const r = await raw(sCall, '/v1/responses', { body: JSON.stringify({ model: 'glm-tiny', ...body }), headers: { authorization: `Bearer ${KEY}` } });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, param, r.text);
  }
  const ig = await raw(sAnswer, '/v1/responses', { body: JSON.stringify({ model: 'glm-tiny', input: 'x', store: false, include: [], frobnicate: 1 }),
    headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(ig.status, 200);
  assert.equal(ig.headers.get('x-kiln-ignored-fields'), 'store, include, frobnicate', 'fields that changed nothing are listed');
  const nf = await raw(sCall, '/v1/responses', { body: JSON.stringify({ model: 'other', input: 'x' }), headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(nf.status, 404);
  assert.equal((await fetch(`${sCall.url}/health`)).status, 200, 'still serving');
});
