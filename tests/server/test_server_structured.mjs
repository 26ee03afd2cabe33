// test_server_structured.mjs — structured output (response_format json_object / json_schema) through
// the official `openai` client: stories260K (a story model: left alone it writes no JSON) for 100
// seeds with sampling at temperature 1 and greedily, and a tiny random-weight model with the
// DeepSeek-V3 tokenizer (129k tokens, multi-byte pieces) for a few seeds — every valid document is
// the grammar's doing. Each output is checked by independent parsers: JSON.parse and the ajv JSON
// Schema validator (npm); finish_reason stop. Also: a schema kiln cannot follow is a 400 naming it;
// json_object gives an object; streaming.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import Ajv from 'ajv';
import { startServer, client, raw, KILN, SHARED } from './lib.mjs';

const TOK = path.join(SHARED, 'tokenizers', 'deepseek-v3');
if (!fs.existsSync(path.join(TOK, 'tokenizer.json'))) { console.log('SKIP: no $SHARED/tokenizers/deepseek-v3'); process.exit(77); }
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-json-'));
const model = path.join(dir, 'm');
const mk = spawnSync(KILN, ['mkmodel', '--arch', 'llama', '--dim', '32', '--ffn', '64', '--layers', '1', '--heads', '2', '--kv-heads', '1',
  '--vocab', '129280', '--seq', '1024', model], { encoding: 'utf8' });
assert.equal(mk.status, 0, mk.stderr);
for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(TOK, f), path.join(model, f));
const srv = await startServer(['--model-name', 'm', '--max-batch', '16'], { model });
const ai = client(srv);
const stories = await startServer(['--model-name', 'm', '--max-batch', '16', '--kv-mem', '32M', '--max-conn-per-ip', '256', '--max-queue', '128']);
test.after(async () => { assert.equal(await srv.stop(), 0); assert.equal(await stories.stop(), 0); fs.rmSync(dir, { recursive: true }); });

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 12 },
    age: { type: 'integer' },
    score: { type: 'number' },
    ok: { type: 'boolean' },
    kind: { enum: ['cat', 'dog', 42, null] },
    tags: { type: 'array', items: { type: 'string', maxLength: 4 }, minItems: 1, maxItems: 3 },
    nested: { type: 'object', properties: { x: { type: 'integer' }, note: { type: 'null' } }, required: ['x', 'note'], additionalProperties: false },
  },
  required: ['name', 'age', 'score', 'ok', 'kind', 'tags', 'nested'],
  additionalProperties: false,
};
const validate = new Ajv({ strict: false }).compile(SCHEMA);
const MSG = [{ role: 'user', content: 'Describe a pet as JSON.' }];
const RF = { type: 'json_schema', json_schema: { name: 'pet', schema: SCHEMA, strict: true } };

async function checkSeeds(api, seeds) {
  const outs = await Promise.all(seeds.map((seed) => api.chat.completions.create({ model: 'm', messages: MSG, response_format: RF, temperature: 1, seed, max_tokens: 400 })));
  const distinct = new Set();
  for (const r of outs) {
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', c.message.content);
    const doc = JSON.parse(c.message.content);
    assert.ok(validate(doc), JSON.stringify(validate.errors) + ' ' + c.message.content);
    assert.deepEqual(Object.keys(doc), Object.keys(SCHEMA.properties), 'properties in declaration order');
    distinct.add(c.message.content);
  }
  assert.ok(distinct.size > seeds.length * 0.9, `the seeds give different documents (${distinct.size} distinct)`);
  const greedy = await api.chat.completions.create({ model: 'm', messages: MSG, response_format: RF, temperature: 0, max_tokens: 400 });
  assert.ok(validate(JSON.parse(greedy.choices[0].message.content)));
}

test('json_schema: 100 seeds of stories260K, every output valid against the schema (ajv)', async () => {
  await checkSeeds(client(stories), Array.from({ length: 100 }, (_, i) => i + 1));
});

test('json_schema: the 129k-token DeepSeek-V3 vocabulary, a few seeds', async () => {
  await checkSeeds(ai, [1, 2, 3, 4]);
});

test('json_object: an object; streamed chunks concatenate to a valid one', async () => {
  const schema = { type: 'object', properties: { a: { type: 'string', maxLength: 5 }, b: { type: 'array', items: { type: 'integer' }, maxItems: 2 } }, required: ['a', 'b'] };
  const stream = await ai.chat.completions.create({ model: 'm', messages: MSG, stream: true, max_tokens: 200, seed: 7,
    response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } });
  let text = '', finish = null;
  for await (const ch of stream) { text += ch.choices[0]?.delta?.content ?? ''; finish = ch.choices[0]?.finish_reason ?? finish; }
  assert.equal(finish, 'stop');
  assert.ok(new Ajv({ strict: false }).validate(schema, JSON.parse(text)), text);
  // json_object: the document starts as an object (random weights may not close it within max_tokens)
  const o = await ai.chat.completions.create({ model: 'm', messages: MSG, response_format: { type: 'json_object' }, max_tokens: 30, seed: 3 });
  assert.ok(o.choices[0].message.content.startsWith('{'), o.choices[0].message.content);
});

test('schemas kiln cannot follow: 400 naming response_format', async () => {
  for (const schema of [{ type: 'object', properties: { a: { anyOf: [{ type: 'string' }] } } }, { type: 'string', pattern: 'x' }, { type: 'tuple' }]) {
    const r = await raw(srv, '/v1/chat/completions', { body: JSON.stringify({ model: 'm', messages: MSG, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } }) });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.param, 'response_format');
  }
  const bad = await raw(srv, '/v1/chat/completions', { body: JSON.stringify({ model: 'm', messages: MSG, response_format: { type: 'yaml' } }) });
  assert.equal(bad.status, 400);
  assert.equal(bad.json.error.param, 'response_format');
});
