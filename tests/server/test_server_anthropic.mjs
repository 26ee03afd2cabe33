// test_server_anthropic.mjs — the Anthropic Messages API (POST /v1/messages, /v1/messages/count_tokens)
// through the official @anthropic-ai/sdk client, on the tiny GLM-4.6-templated model of
// test_server_tools.mjs (DeepSeek-V3 tokenizer, output forced with --test-forced-output so that
// the GLM format reaches the parsers). Checked: a tool round trip (tools → thinking + tool_use blocks,
// stop_reason tool_use, input objects typed by the schema → tool_result → an end_turn text answer),
// the same message streamed (message_start … message_stop, assembled by the SDK's MessageStream),
// the conversion of the history matching the equivalent chat completion's prompt, count_tokens,
// x-api-key authentication, stop_sequence, max_tokens, and errors in Anthropic's shape.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import Anthropic from '@anthropic-ai/sdk';
import { startServer, client, raw, glmTemplatedModel } from './lib.mjs';

const { dir, model } = glmTemplatedModel('kiln-anthropic-');

const CALL_OUT = '<think>I should look the weather up.</think>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n'
  + '<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>';
const ANSWER_OUT = '<think>Sunny.</think>It will be sunny in Paris. END and more';
const KEY = 'sk-test-anthropic';
const servers = [];
async function serve(out, extra = []) {
  const srv = await startServer(['--model-name', 'glm-tiny', '--api-key', KEY, '--test-forced-output', out, ...extra], { model });
  servers.push(srv);
  return srv;
}
const sCall = await serve(CALL_OUT);
const sAnswer = await serve(ANSWER_OUT);
test.after(async () => {
  for (const s of servers) assert.equal(await s.stop(), 0);
  fs.rmSync(dir, { recursive: true });
});
const anthropic = (srv, apiKey = KEY) => new Anthropic({ baseURL: srv.url, apiKey, maxRetries: 0, timeout: 60000 });

const TOOLS = [{ name: 'get_weather', description: 'Weather of a city', input_schema: { type: 'object',
  properties: { city: { type: 'string' }, days: { type: 'integer' } }, required: ['city'] } }];
const MSGS = [{ role: 'user', content: 'Weather in Paris for 2 days?' }];

test('tool_use round trip: thinking, tool_use with a typed input, stop_reason tool_use, then the answer', async () => {
  const ai = anthropic(sCall);
  const m = await ai.messages.create({ model: 'glm-tiny', max_tokens: 200, system: 'You are terse.', messages: MSGS, tools: TOOLS });
  assert.equal(m.type, 'message');
  assert.equal(m.role, 'assistant');
  assert.match(m.id, /^msg_[0-9a-f]{32}$/);
  assert.equal(m.model, 'glm-tiny');
  assert.equal(m.stop_reason, 'tool_use');
  assert.equal(m.stop_sequence, null);
  assert.deepEqual(m.content.map((b) => b.type), ['thinking', 'tool_use']);
  assert.equal(m.content[0].thinking, 'I should look the weather up.');
  const tu = m.content[1];
  assert.match(tu.id, /^toolu_[0-9a-f]{32}$/);
  assert.equal(tu.name, 'get_weather');
  assert.deepEqual(tu.input, { city: 'Paris', days: 2 });
  assert.ok(m.usage.input_tokens > 50);
  assert.ok(m.usage.output_tokens > 10);
  assert.equal(m.usage.cache_read_input_tokens + m.usage.input_tokens > 50, true);

  const history = [...MSGS, { role: 'assistant', content: m.content },
    { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu.id, content: 'sunny, 24 C' }] }];
  const a = await anthropic(sAnswer).messages.create({ model: 'glm-tiny', max_tokens: 200, system: 'You are terse.', messages: history, tools: TOOLS });
  assert.equal(a.stop_reason, 'end_turn');
  assert.deepEqual(a.content.map((b) => b.type), ['thinking', 'text']);
  assert.equal(a.content[1].text, 'It will be sunny in Paris. END and more');
  // the translated conversation is the chat completion the same history asks for (same prompt tokens)
  const oa = await client(sAnswer, KEY).chat.completions.create({ model: 'glm-tiny', tools: TOOLS.map((t) => ({ type: 'function', function: { name: t.name, description: t.description, parameters: t.input_schema } })),
    messages: [{ role: 'system', content: 'You are terse.' }, ...MSGS,
      { role: 'assistant', content: null, reasoning_content: 'I should look the weather up.', tool_calls: [{ id: tu.id, type: 'function', function: { name: 'get_weather', arguments: JSON.stringify(tu.input) } }] },
      { role: 'tool', tool_call_id: tu.id, content: 'sunny, 24 C' }] });
  assert.equal(a.usage.input_tokens + a.usage.cache_read_input_tokens, oa.usage.prompt_tokens);
  const ct = await anthropic(sAnswer).messages.countTokens({ model: 'glm-tiny', system: 'You are terse.', messages: history, tools: TOOLS });
  assert.equal(ct.input_tokens, oa.usage.prompt_tokens);
});

test('streaming: the event sequence, assembled by the SDK', async () => {
  const stream = anthropic(sCall).messages.stream({ model: 'glm-tiny', max_tokens: 200, messages: MSGS, tools: TOOLS });
  const events = [];
  stream.on('streamEvent', (e) => events.push(e.type));
  const m = await stream.finalMessage();
  assert.equal(events[0], 'message_start');
  assert.equal(events.at(-1), 'message_stop');
  assert.equal(events.at(-2), 'message_delta');
  assert.ok(events.includes('content_block_start') && events.includes('content_block_delta') && events.includes('content_block_stop'));
  assert.equal(m.stop_reason, 'tool_use');
  const types = m.content.map((b) => b.type);
  assert.equal(types[0], 'thinking');
  assert.equal(types.at(-1), 'tool_use');
  assert.equal(m.content[0].thinking, 'I should look the weather up.');
  assert.deepEqual(m.content.at(-1).input, { city: 'Paris', days: 2 });
  for (const b of m.content.filter((x) => x.type === 'text')) assert.equal(b.text.trim(), '', 'only whitespace before the call');
  assert.ok(m.usage.output_tokens > 10);
});

test('stop_sequences, max_tokens, thinking disabled', async () => {
  const ai = anthropic(sAnswer);
  const st = await ai.messages.create({ model: 'glm-tiny', max_tokens: 200, messages: MSGS, stop_sequences: ['END'] });
  assert.equal(st.stop_reason, 'stop_sequence');
  assert.equal(st.stop_sequence, 'END');
  assert.equal(st.content.at(-1).text, 'It will be sunny in Paris. ');
  const mt = await ai.messages.create({ model: 'glm-tiny', max_tokens: 3, messages: MSGS });
  assert.equal(mt.stop_reason, 'max_tokens');
  assert.equal(mt.usage.output_tokens, 3);
  const off = await ai.messages.create({ model: 'glm-tiny', max_tokens: 200, messages: MSGS, thinking: { type: 'disabled' } });
  assert.deepEqual(off.content.map((b) => b.type), ['text'], 'no thinking split when thinking is disabled');
  assert.ok(off.content[0].text.startsWith('<think>Sunny.</think>'));
});

test('a final assistant message is a prefill: the prompt continues it (continue_final_message)', async () => {
  const msgs = [...MSGS, { role: 'assistant', content: 'It will be' }];
  const m = await anthropic(sAnswer).messages.create({ model: 'glm-tiny', max_tokens: 50, messages: msgs, thinking: { type: 'disabled' } });
  const cont = await client(sAnswer, KEY).chat.completions.create({ model: 'glm-tiny', messages: msgs, continue_final_message: true, max_tokens: 1,
    chat_template_kwargs: { enable_thinking: false, thinking: false } });
  const closed = await client(sAnswer, KEY).chat.completions.create({ model: 'glm-tiny', messages: msgs, max_tokens: 1,
    chat_template_kwargs: { enable_thinking: false, thinking: false } });
  assert.equal(m.usage.input_tokens + m.usage.cache_read_input_tokens, cont.usage.prompt_tokens, 'the prompt ends inside the assistant turn');
  assert.notEqual(cont.usage.prompt_tokens, closed.usage.prompt_tokens);
  assert.equal(m.content[0].text, ANSWER_OUT, 'the answer is the generated continuation alone (the prefill is not repeated)');
});

test('authentication and errors in Anthropic\'s shape', async () => {
  await assert.rejects(anthropic(sCall, 'wrong').messages.create({ model: 'glm-tiny', max_tokens: 5, messages: MSGS }),
    (e) => e.status === 401 && e.error?.type === 'error' && e.error.error.type === 'authentication_error');
  const bad = [
    [{ messages: MSGS }, /max_tokens/],
    [{ max_tokens: 5, messages: [{ role: 'system', content: 'x' }] }, /messages\.0\.role/],
    [{ max_tokens: 5, messages: [{ role: 'user', content: [{ type: 'image', source: {} }] }] }, /messages\.0\.content\.0/],
    [{ max_tokens: 5, messages: MSGS, tools: [{ name: 'x' }] }, /tools\.0\.input_schema/],
    [{ max_tokens: 5, messages: MSGS, tool_choice: { type: 'sometimes' } }, /tool_choice\.type/],
  ];
  for (const [body, re] of bad) {
    const r = await raw(sCall, '/v1/messages', { body: JSON.stringify({ model: 'glm-tiny', ...body }), headers: { 'x-api-key': KEY } });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.type, 'error');
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.match(r.json.error.message, re);
  }
  const nf = await raw(sCall, '/v1/messages', { body: JSON.stringify({ model: 'other', max_tokens: 5, messages: MSGS }), headers: { 'x-api-key': KEY } });
  assert.equal(nf.status, 404);
  assert.equal(nf.json.error.type, 'not_found_error');
  assert.equal((await fetch(`${sCall.url}/health`)).status, 200, 'still serving');
});
