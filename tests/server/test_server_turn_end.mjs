// test_server_turn_end.mjs — the chat template's end-of-turn tokens end generation (issue 22): a
// random-weight model (kiln mkmodel: its config's end id is 2) with the DeepSeek-V3 tokenizer and its
// own template, whose assistant turns end with the special token <｜end▁of▁sentence｜> (id 1), and
// whose output is forced (--test-forced-output) to run past that token: the answer stops there,
// with finish_reason "stop" and the marker not in the content; the start-up summary names the token
// added. (<｜User｜> is in the template too, but DeepSeek-V3's vocabulary does not mark it special:
// not added.) The same tokenizer under the GLM-4.6 template adds none (GLM's <|user|> is
// not a token of that vocabulary: only the model's own special tokens count).
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { startServer, client, makeTokenizerModel, SHARED } from './lib.mjs';

const TOK = path.join(SHARED, 'tokenizers', 'deepseek-v3');
const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'kiln_turn_'));
test.after(() => fs.rmSync(dir, { recursive: true, force: true }));

const makeModel = (name, template) => makeTokenizerModel(dir, name, TOK, template && path.join(SHARED, 'tokenizers', 'templates', template));

test('DeepSeek-V3 template: <｜end▁of▁sentence｜> ends the answer', async () => {
  const m = makeModel('ds', null);
  const srv = await startServer(['--test-forced-output', 'Hello there<｜end▁of▁sentence｜>leaked text'], { model: m });
  try {
    assert.match(srv.log(), /end-of-turn tokens: <｜end▁of▁sentence｜> \(1\)\n/, 'the start-up summary names the added token');
    const ai = client(srv);
    const r = await ai.chat.completions.create({ model: 'ds', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 40 });
    assert.equal(r.choices[0].message.content, 'Hello there');
    assert.equal(r.choices[0].finish_reason, 'stop');
    let text = '', finish = null;
    for await (const ch of await ai.chat.completions.create({ model: 'ds', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 40, stream: true })) {
      const c = ch.choices[0];
      if (!c) continue;
      text += c.delta.content ?? '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(text, 'Hello there');
    assert.equal(finish, 'stop');
    const c = await ai.completions.create({ model: 'ds', prompt: 'Hi', max_tokens: 40 });
    assert.equal(c.choices[0].text, 'Hello there', 'completions stop there too');
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('GLM-4.6 template over a vocabulary without its markers adds none', async () => {
  const m = makeModel('glm', 'glm-4.6.jinja');
  const srv = await startServer([], { model: m });
  try {
    assert.match(srv.log(), /end-of-turn tokens: none added/);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
