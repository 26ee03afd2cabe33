// test_server_chat_template.mjs — chat through the model's own chat template: a tiny random-weight
// llama (kiln mkmodel) carrying the Qwen3 tokenizer files from $SHARED/tokenizers/qwen3. The prompt
// the server builds must be the ids an independent pipeline gives — the template rendered by Python
// jinja2 set up as transformers does, tokenized by the npm @huggingface/tokenizers package — which
// shows in usage.prompt_tokens and in a greedy completion of those ids equal to the chat's output.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { Tokenizer } from '@huggingface/tokenizers';
import { startServer, client, KILN, SHARED } from './lib.mjs';

const TOK = path.join(SHARED, 'tokenizers', 'qwen3');
if (!fs.existsSync(path.join(TOK, 'tokenizer_config.json'))) {
  console.log('SKIP: no $SHARED/tokenizers/qwen3');
  process.exit(77);
}
const PY = process.env.PY || '/usr/bin/python3';
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln-chat-'));
const model = path.join(dir, 'm');
const mk = spawnSync(KILN, ['mkmodel', '--arch', 'llama', '--dim', '32', '--ffn', '64', '--layers', '1', '--heads', '2', '--kv-heads', '1',
  '--vocab', '151936', '--seq', '256', model], { encoding: 'utf8' });
assert.equal(mk.status, 0, mk.stderr);
for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(TOK, f), path.join(model, f));
const cfg = JSON.parse(fs.readFileSync(path.join(TOK, 'tokenizer_config.json'), 'utf8'));
const tok = new Tokenizer(JSON.parse(fs.readFileSync(path.join(TOK, 'tokenizer.json'), 'utf8')), cfg);

// transformers' apply_chat_template environment, in Python's jinja2
const RENDER = `
import json, sys
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.ext import loopcontrols
cfg = json.load(open(sys.argv[1]))
env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters['tojson'] = lambda x, indent=None, ensure_ascii=False, separators=None, sort_keys=False: json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
def raise_exception(m): raise Exception(m)
env.globals['raise_exception'] = raise_exception
kw = dict(messages=json.loads(sys.argv[2]), add_generation_prompt=True, bos_token=cfg.get('bos_token'), eos_token=cfg.get('eos_token'))
kw.update(json.loads(sys.argv[3]))
out = env.from_string(cfg['chat_template']).render(**kw)
if len(sys.argv) > 4:  # continue_final_message, as transformers' apply_chat_template cuts the text
    final = kw['messages'][-1]['content']
    loc = out.rindex(final.strip())
    out = out[:loc + len(final.lstrip())] if out[loc:loc + len(final.lstrip())] == final else out[:loc + len(final.strip())]
sys.stdout.write(out)
`;
function referenceIds(messages, kwargs = {}, cont = false) {
  const r = spawnSync(PY, ['-c', RENDER, path.join(TOK, 'tokenizer_config.json'), JSON.stringify(messages), JSON.stringify(kwargs), ...(cont ? ['cont'] : [])],
    { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return tok.encode(r.stdout, { add_special_tokens: false }).ids;
}

const srv = await startServer(['--model-name', 'q'], { model });
const ai = client(srv);
test.after(async () => {
  assert.equal(await srv.stop(), 0);
  fs.rmSync(dir, { recursive: true });
});

test('the start-up summary names the model\'s own template', () => {
  assert.match(srv.log(), /chat template: the model's own/);
});

const cases = [
  ['one user turn', [{ role: 'user', content: 'Hello there' }], undefined],
  ['system + multi-turn', [{ role: 'system', content: 'You are kind.' }, { role: 'user', content: 'Hi' },
    { role: 'assistant', content: 'Hello! How can I help?' }, { role: 'user', content: 'Tell me a story about a cat.' }], undefined],
  ['text parts, non-ASCII', [{ role: 'user', content: [{ type: 'text', text: 'Grüße, ' }, { type: 'text', text: '你好 😀' }] }], undefined],
  ['chat_template_kwargs', [{ role: 'user', content: 'Hello there' }], { enable_thinking: false }],
];

for (const [name, messages, kwargs] of cases) {
  test(`template prompt ids equal the jinja2 + HF tokenizers reference: ${name}`, async () => {
    // text parts are concatenated into one string content before the template sees them
    const refMsgs = messages.map((m) => (Array.isArray(m.content) ? { ...m, content: m.content.map((p) => p.text).join('') } : m));
    const ids = referenceIds(refMsgs, kwargs ?? {});
    const body = { model: 'q', messages, max_tokens: 6, temperature: 0 };
    if (kwargs) body.chat_template_kwargs = kwargs;
    const chat = await ai.chat.completions.create(body);
    assert.equal(chat.usage.prompt_tokens, ids.length, 'prompt token count');
    const comp = await ai.completions.create({ model: 'q', prompt: ids, max_tokens: 6, temperature: 0 });
    assert.equal(chat.choices[0].message.content, comp.choices[0].text, 'greedy output from the same ids');
  });
}

test('enable_thinking changes the rendered prompt as the template says', async () => {
  const m = [{ role: 'user', content: 'Hello there' }];
  const a = await ai.chat.completions.create({ model: 'q', messages: m, max_tokens: 1 });
  const b = await ai.chat.completions.create({ model: 'q', messages: m, max_tokens: 1, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(a.usage.prompt_tokens, referenceIds(m).length);
  assert.equal(b.usage.prompt_tokens, referenceIds(m, { enable_thinking: false }).length);
  assert.notEqual(a.usage.prompt_tokens, b.usage.prompt_tokens);
});

test('chat_template_kwargs must be an object', async () => {
  await assert.rejects(ai.chat.completions.create({ model: 'q', messages: [{ role: 'user', content: 'x' }], chat_template_kwargs: 5 }),
    (e) => e.status === 400 && e.param === 'chat_template_kwargs');
});

test('add_generation_prompt false and continue_final_message (a prefill) render as transformers does', async () => {
  const tokenize = async (body) => {
    const r = await fetch(`${srv.url}/tokenize`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'q', ...body }) });
    assert.equal(r.status, 200);
    return (await r.json()).tokens;
  };
  const user = [{ role: 'user', content: 'Tell me a story.' }];
  assert.deepEqual(await tokenize({ messages: user, add_generation_prompt: false }), referenceIds(user, { add_generation_prompt: false }));
  for (const pre of ['Once upon a time', 'Once upon a time, ', '  Sure:\n']) {
    const msgs = [...user, { role: 'assistant', content: pre }];
    const ids = referenceIds(msgs, { add_generation_prompt: false }, true);
    assert.deepEqual(await tokenize({ messages: msgs, continue_final_message: true, add_generation_prompt: false }), ids, JSON.stringify(pre));
    // the chat continues from there: its output is the greedy completion of those ids
    const chat = await ai.chat.completions.create({ model: 'q', messages: msgs, continue_final_message: true, max_tokens: 5, temperature: 0 });
    assert.equal(chat.usage.prompt_tokens, ids.length);
    const comp = await ai.completions.create({ model: 'q', prompt: ids, max_tokens: 5, temperature: 0 });
    assert.equal(chat.choices[0].message.content, comp.choices[0].text);
  }
  await assert.rejects(ai.chat.completions.create({ model: 'q', messages: user, continue_final_message: true, add_generation_prompt: true, max_tokens: 1 }),
    (e) => e.status === 400 && e.param === 'continue_final_message');
});
