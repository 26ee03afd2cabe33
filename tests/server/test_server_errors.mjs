// test_server_errors.mjs — table-driven bad requests: each gets its documented HTTP status and an
// OpenAI-shaped error {"error": {"message", "type", "param", "code"}}, and the server keeps serving
// (a good request and /health succeed after every row). The server runs with an API key and a
// 64 KiB body limit. Statuses are documented in docs/SERVER.md.
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, raw, waitMetrics, MODEL_ID } from './lib.mjs';
import OpenAI from 'openai';

const KEY = 'sk-test-0123456789abcdef';
const srv = await startServer(['--api-key', KEY, '--max-body', '64K']);
test.after(async () => { assert.equal(await srv.stop(), 0); });
const auth = { authorization: `Bearer ${KEY}` };
const good = { model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 4, temperature: 0 };
const chat = { model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 4 };
const J = (o) => JSON.stringify(o);
const C = '/v1/completions', CH = '/v1/chat/completions';

// [name, path, body (string | Buffer), expected status, expected param (undefined = don't check), expected code, extra headers/method]
const rows = [
  ['malformed JSON', C, '{"model": "stories260K", "prompt": ', 400, null],
  ['trailing garbage', C, J(good) + 'xyz', 400, null],
  ['body is an array', C, '[1, 2, 3]', 400, null],
  ['empty body', C, '', 400, null],
  ['model missing', C, J({ prompt: 'x' }), 400, 'model'],
  ['model not a string', C, J({ ...good, model: 7 }), 400, 'model'],
  ['unknown model', C, J({ ...good, model: 'gpt-9' }), 404, 'model', 'model_not_found'],
  ['unknown model (chat)', CH, J({ ...chat, model: 'nope' }), 404, 'model', 'model_not_found'],
  ['prompt missing', C, J({ model: MODEL_ID }), 400, 'prompt'],
  ['prompt wrong type', C, J({ ...good, prompt: { text: 'x' } }), 400, 'prompt'],
  ['prompt token id out of range', C, J({ ...good, prompt: [1, 99999] }), 400, 'prompt', 'invalid_value'],
  ['a prompt list with an entry neither a string nor ids', C, J({ ...good, prompt: ['a', { text: 'b' }] }), 400, 'prompt'],
  ['messages missing', CH, J({ model: MODEL_ID }), 400, 'messages'],
  ['messages empty', CH, J({ ...chat, messages: [] }), 400, 'messages'],
  ['messages not an array', CH, J({ ...chat, messages: 'hello' }), 400, 'messages'],
  ['message without role', CH, J({ ...chat, messages: [{ content: 'x' }] }), 400, 'messages'],
  ['message with unknown role', CH, J({ ...chat, messages: [{ role: 'wizard', content: 'x' }] }), 400, 'messages', 'invalid_value'],
  ['message content wrong type', CH, J({ ...chat, messages: [{ role: 'user', content: 42 }] }), 400, 'messages'],
  ['image content part', CH, J({ ...chat, messages: [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'x' } }] }] }), 400, 'messages'],
  ['max_tokens wrong type', C, J({ ...good, max_tokens: 'ten' }), 400, 'max_tokens'],
  ['max_tokens negative', C, J({ ...good, max_tokens: -5 }), 400, 'max_tokens', 'invalid_value'],
  ['max_tokens zero', C, J({ ...good, max_tokens: 0 }), 400, 'max_tokens', 'invalid_value'],
  ['max_tokens huge', C, J({ ...good, max_tokens: 1e9 }), 400, 'max_tokens', 'invalid_value'],
  ['max_tokens beyond context with the prompt', C, J({ ...good, max_tokens: 510 }), 400, 'max_tokens', 'context_length_exceeded'],
  ['max_completion_tokens negative', CH, J({ ...chat, max_completion_tokens: -1 }), 400, 'max_completion_tokens', 'invalid_value'],
  ['prompt longer than the context', C, J({ ...good, prompt: Array(600).fill(5) }), 400, 'prompt', 'context_length_exceeded'],
  ['temperature wrong type', C, J({ ...good, temperature: 'hot' }), 400, 'temperature'],
  ['temperature out of range', C, J({ ...good, temperature: 5 }), 400, 'temperature', 'invalid_value'],
  ['top_p out of range', C, J({ ...good, top_p: 1.5 }), 400, 'top_p', 'invalid_value'],
  ['min_p out of range', C, J({ ...good, min_p: 1.5 }), 400, 'min_p', 'invalid_value'],
  ['min_p wrong type', C, J({ ...good, min_p: 'some' }), 400, 'min_p'],
  ['seed wrong type', C, J({ ...good, seed: 'abc' }), 400, 'seed'],
  ['stream wrong type', C, J({ ...good, stream: 'yes' }), 400, 'stream'],
  ['stream_options without stream', C, J({ ...good, stream_options: { include_usage: true } }), 400, 'stream_options'],
  ['stop wrong type', C, J({ ...good, stop: 5 }), 400, 'stop'],
  ['too many stops', C, J({ ...good, stop: ['a', 'b', 'c', 'd', 'e'] }), 400, 'stop', 'invalid_value'],
  ['n = 17 (above the cap of 16)', C, J({ ...good, n: 17 }), 400, 'n', 'invalid_value'],
  ['n = 0 (chat)', CH, J({ ...chat, n: 0 }), 400, 'n', 'invalid_value'],
  ['logprobs out of range (completions)', C, J({ ...good, logprobs: 9 }), 400, 'logprobs', 'invalid_value'],
  ['top_logprobs without logprobs', CH, J({ ...chat, top_logprobs: 3 }), 400, 'top_logprobs'],
  ['top_logprobs too many', CH, J({ ...chat, logprobs: true, top_logprobs: 50 }), 400, 'top_logprobs', 'invalid_value'],
  ['tools are unsupported', CH, J({ ...chat, tools: [{ type: 'function', function: { name: 'f' } }] }), 400, 'tools', 'unsupported_parameter'],
  ['duplicate keys', C, '{"model":"stories260K","prompt":"a","prompt":"b"}', 400, null],
  ['invalid UTF-8 in a string', C, Buffer.concat([Buffer.from('{"model":"stories260K","prompt":"bad '), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]), 400, null],
  ['invalid UTF-8 in a message', CH, Buffer.concat([Buffer.from('{"model":"stories260K","messages":[{"role":"user","content":"'), Buffer.from([0xc3, 0x28]), Buffer.from('"}]}')]), 400, null],
  ['oversized body', C, J({ ...good, prompt: 'x'.repeat(100 * 1024) }), 413, null, 'request_too_large'],
  ['bad API key', C, J(good), 401, null, 'invalid_api_key', { authorization: 'Bearer sk-wrong' }],
  ['API key of another length', C, J(good), 401, null, 'invalid_api_key', { authorization: `Bearer ${KEY}x` }],
  ['no API key', C, J(good), 401, null, 'invalid_api_key', { authorization: '' }],
  ['API key on /v1/models too', '/v1/models', undefined, 401, null, 'invalid_api_key', { authorization: 'Bearer nope', method: 'GET' }],
  ['unknown route', '/v1/embeddings', J(good), 404, null, 'not_found'],
  ['wrong method', C, undefined, 405, null, 'method_not_allowed', { method: 'GET' }],
];

test('bad requests: documented status + OpenAI error JSON, and the server keeps serving', async () => {
  for (const [name, path, body, status, param, code, extra = {}] of rows) {
    const { method = 'POST', ...hdrs } = extra;
    const headers = { ...auth, ...hdrs };
    if (headers.authorization === '') delete headers.authorization;
    const r = await raw(srv, path, { method, body, headers });
    assert.equal(r.status, status, `${name}: status ${r.status} ${r.text.slice(0, 200)}`);
    assert.ok(r.json && r.json.error, `${name}: error JSON`);
    const e = r.json.error;
    assert.deepEqual(Object.keys(e).sort(), ['code', 'message', 'param', 'type'], `${name}: error fields`);
    assert.equal(typeof e.message, 'string');
    assert.ok(e.message.length > 0);
    assert.equal(typeof e.type, 'string');
    if (param !== undefined) assert.equal(e.param, param, `${name}: param`);
    if (code !== undefined) assert.equal(e.code, code, `${name}: code`);
    if (status === 401) assert.equal(r.headers.get('www-authenticate'), 'Bearer');
    // still serving
    const ok = await raw(srv, C, { body: J(good), headers: auth });
    assert.equal(ok.status, 200, `after ${name}: ${ok.text}`);
    assert.equal(ok.json.usage.completion_tokens, 4);
  }
  // (the metrics snapshot is published at the end of each scheduler step)
  const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0);
  assert.ok(m['kiln_requests_total{code="400"}'] >= rows.filter((r) => r[3] === 400).length);
  assert.equal(m['kiln_requests_total{code="413"}'], 1);
});

test('the official client: errors map to its exception classes; the right key works', async () => {
  const bad = client(srv, 'sk-wrong');
  await assert.rejects(bad.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
  const ai = client(srv, KEY);
  await assert.rejects(ai.completions.create({ ...good, model: 'nope' }), (e) => e instanceof OpenAI.NotFoundError && e.code === 'model_not_found');
  await assert.rejects(ai.chat.completions.create({ ...chat, max_tokens: -1 }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'max_tokens');
  const r = await ai.chat.completions.create(chat);
  assert.equal(r.usage.completion_tokens, 4);
  // /health and /metrics need no key
  assert.equal((await raw(srv, '/health', { method: 'GET' })).status, 200);
});

test('--api-key-file and constant-time key check accept only the exact key', async () => {
  const fs = await import('node:fs');
  const os = await import('node:os');
  const path = await import('node:path');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-key-'));
  const f = path.join(dir, 'key');
  fs.writeFileSync(f, 'sk-from-file\n');
  const s2 = await startServer(['--api-key-file', f]);
  try {
    assert.equal((await raw(s2, '/v1/models', { method: 'GET', headers: { authorization: 'Bearer sk-from-file' } })).status, 200);
    // (trailing spaces are not part of an HTTP header value, so 'sk-from-file ' would be the key)
    for (const k of ['sk-from-fil', 'sk-from-filE', 'sk-from-file0', 'Sk-from-file', '']) {
      assert.equal((await raw(s2, '/v1/models', { method: 'GET', headers: { authorization: `Bearer ${k}` } })).status, 401, `key ${JSON.stringify(k)}`);
    }
  } finally {
    assert.equal(await s2.stop(), 0);
    fs.rmSync(dir, { recursive: true });
  }
});
