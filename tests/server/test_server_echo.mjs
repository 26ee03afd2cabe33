// test_server_echo.mjs — /v1/completions `echo` (OpenAI's legacy completions, vLLM): the prompt
// comes back before the completion, and with `logprobs` every prompt token's log-probability.
// The reference is llama2.c itself: shared/models/stories260K/expected/greedy_logits_f32.bin holds
// its logits along its greedy path from BOS, so feeding that path as the prompt must give, at each
// position, log_softmax(llama2.c's logits of the position before)[token]. The server runs 48-token
// steps, so a 200-token prompt is scored over several chunked-prefill steps.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { startServer, client, raw, MODEL, MODEL_ID } from './lib.mjs';

const srv = await startServer(['--step-tokens', '48']);
const ai = client(srv);
test.after(async () => { assert.equal(await srv.stop(), 0, 'the server exits 0 on SIGTERM'); });

const V = 512;
const trace = fs.readFileSync(path.join(MODEL, 'expected', 'greedy_tokens.txt'), 'utf8').split('\n')
  .filter((l) => /^\d/.test(l)).map((l) => l.split(/\s+/).map(Number));
const ids = trace.slice(0, 200).map((r) => r[1]); // llama2.c's greedy path: BOS, then each argmax
const buf = fs.readFileSync(path.join(MODEL, 'expected', 'greedy_logits_f32.bin'));
const logits = new Float32Array(buf.buffer, buf.byteOffset, buf.length / 4);

// log_softmax of llama2.c's logits row p, in float64
function logSoftmax(p) {
  const row = Array.from(logits.subarray(p * V, (p + 1) * V));
  const mx = Math.max(...row);
  const lse = mx + Math.log(row.reduce((s, x) => s + Math.exp(x - mx), 0));
  return row.map((x) => x - lse);
}
const ref = ids.map((_, p) => logSoftmax(p));

function checkPromptLogprobs(lp, prompt, k) {
  assert.equal(lp.token_logprobs[0], null, 'the first token has no log-probability');
  assert.equal(lp.top_logprobs[0], null);
  assert.equal(lp.text_offset[0], 0);
  for (let i = 1; i < prompt.length; i++) {
    const want = ref[i - 1][prompt[i]];
    assert.ok(Math.abs(lp.token_logprobs[i] - want) < 1e-4, `position ${i}: ${lp.token_logprobs[i]} vs llama2.c ${want}`);
    const tops = Object.values(lp.top_logprobs[i]).sort((a, b) => b - a);
    const best = [...ref[i - 1]].sort((a, b) => b - a).slice(0, k);
    assert.equal(tops.length, k, `position ${i}: ${k} alternatives`);
    for (let j = 0; j < k; j++) assert.ok(Math.abs(tops[j] - best[j]) < 1e-4, `position ${i}, alternative ${j}`);
    assert.equal(lp.text_offset[i], lp.text_offset[i - 1] + Buffer.byteLength(lp.tokens[i - 1]));
  }
}

test('echo with logprobs and max_tokens 0: every prompt token scored as llama2.c scores it', async () => {
  const r = await ai.completions.create({ model: MODEL_ID, prompt: ids, echo: true, logprobs: 5, max_tokens: 0 });
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'length');
  assert.equal(r.usage.prompt_tokens, ids.length);
  assert.equal(r.usage.completion_tokens, 0);
  assert.equal(c.logprobs.tokens.length, ids.length, 'one entry per prompt token, none generated');
  assert.equal(c.logprobs.tokens.join(''), c.text, 'the echoed text is the prompt tokens\' text');
  checkPromptLogprobs(c.logprobs, ids, 5);
  // the same again: the prompt's pages are in the prefix cache now, but a scored prompt is computed whole
  const again = await ai.completions.create({ model: MODEL_ID, prompt: ids, echo: true, logprobs: 5, max_tokens: 0 });
  assert.deepEqual(again.choices[0].logprobs.token_logprobs, c.logprobs.token_logprobs);
});

test('lm-evaluation-harness loglikelihood request: [[ids]], echo, logprobs 1, max_tokens 1, greedy', async () => {
  const ctxlen = 120, cont = ids.slice(0, 160); // context = the first 120 tokens, continuation = the next 40
  const r = await ai.completions.create({ model: MODEL_ID, prompt: [cont], echo: true, logprobs: 1, max_tokens: 1, temperature: 0, seed: 1234 });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.token_logprobs.length, cont.length + 1, 'the prompt, then the one generated token');
  // what the harness reads: token_logprobs[ctxlen:-1] and whether each is the top alternative
  const got = lp.token_logprobs.slice(ctxlen, -1), tops = lp.top_logprobs.slice(ctxlen, -1);
  let sum = 0;
  for (let i = 0; i < got.length; i++) {
    sum += ref[ctxlen + i - 1][cont[ctxlen + i]];
    assert.equal(got[i], Math.max(...Object.values(tops[i])), `the greedy path's token ${ctxlen + i} is the top alternative`);
  }
  assert.ok(Math.abs(got.reduce((a, b) => a + b, 0) - sum) < 1e-3, 'the continuation\'s log-likelihood');
  // the generated token follows the greedy path too, with its text after the prompt's
  assert.equal(r.choices[0].text, lp.tokens.join(''));
  assert.equal(lp.text_offset[cont.length], Buffer.byteLength(lp.tokens.slice(0, -1).join('')));
});

test('echo of a string prompt: the string as sent, then the same completion as without echo', async () => {
  const prompt = 'Once upon a time, a little dog';
  const plain = await ai.completions.create({ model: MODEL_ID, prompt, max_tokens: 12, temperature: 0 });
  const echoed = await ai.completions.create({ model: MODEL_ID, prompt, max_tokens: 12, temperature: 0, echo: true });
  assert.equal(echoed.choices[0].text, prompt + plain.choices[0].text);
  assert.equal(echoed.choices[0].logprobs, null);
  assert.equal(echoed.usage.completion_tokens, 12);
  const alone = await ai.completions.create({ model: MODEL_ID, prompt, max_tokens: 0, echo: true });
  assert.equal(alone.choices[0].text, prompt);
  assert.equal(alone.usage.completion_tokens, 0);
  // generated tokens' offsets continue after the echoed text
  const lp = (await ai.completions.create({ model: MODEL_ID, prompt, max_tokens: 4, temperature: 0, echo: true, logprobs: 0 })).choices[0].logprobs;
  const n = lp.tokens.length;
  assert.equal(lp.text_offset[n - 4], Buffer.byteLength(prompt));
  assert.deepEqual(lp.top_logprobs.slice(1, 3), [{}, {}], 'logprobs 0: no alternatives');
});

test('streaming echo: the prompt (with its logprobs) first, then the completion; equal to non-streaming', async () => {
  const prompt = ids.slice(0, 60);
  const req = { model: MODEL_ID, prompt, echo: true, logprobs: 2, max_tokens: 6, temperature: 0 };
  const whole = (await ai.completions.create(req)).choices[0];
  let text = '', first = null, entries = [], finish = null;
  for await (const ch of await ai.completions.create({ ...req, stream: true })) {
    const c = ch.choices[0];
    if (!c) continue;
    if (first === null) first = c;
    text += c.text;
    if (c.logprobs) entries.push(...c.logprobs.token_logprobs);
    if (c.finish_reason) finish = c.finish_reason;
  }
  assert.equal(first.logprobs.tokens.length, prompt.length, 'the first chunk is the prompt');
  checkPromptLogprobs(first.logprobs, prompt, 2);
  assert.equal(text, whole.text);
  assert.deepEqual(entries, whole.logprobs.token_logprobs);
  assert.equal(finish, 'length');
  // max_tokens 0, streamed: the prompt chunk, then the finish
  const chunks = [];
  for await (const ch of await ai.completions.create({ model: MODEL_ID, prompt: 'Hello', echo: true, max_tokens: 0, stream: true })) chunks.push(ch);
  assert.deepEqual(chunks.map((ch) => [ch.choices[0].text, ch.choices[0].finish_reason]), [['Hello', null], ['', 'length']]);
});

test('echo with n = 2: every choice carries the prompt and its logprobs', async () => {
  const prompt = ids.slice(0, 100);
  const r = await ai.completions.create({ model: MODEL_ID, prompt, echo: true, logprobs: 1, max_tokens: 3, temperature: 0.8, seed: 7, n: 2 });
  assert.equal(r.choices.length, 2);
  for (const c of r.choices) {
    checkPromptLogprobs(c.logprobs, prompt, 1);
    assert.equal(c.logprobs.tokens.length, prompt.length + 3);
  }
  assert.equal(r.usage.completion_tokens, 6);
});

test('echo errors: max_tokens 0 needs echo; values are checked', async () => {
  let r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: 'Hi', max_tokens: 0 }) });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'max_tokens');
  r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: 'Hi', echo: 'yes' }) });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'echo');
  r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: 'Hi', echo: true, max_tokens: -1 }) });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'max_tokens');
  r = await raw(srv, '/v1/chat/completions', { body: JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], echo: 1 }) });
  assert.equal(r.status, 400);
  assert.equal(r.json.error.param, 'echo');
  const h = await raw(srv, '/health', { method: 'GET' });
  assert.equal(h.status, 200, 'still serving');
});

test('several prompts in one request: n choices each, index = prompt × n + place, as each alone', async () => {
  const prompts = ['Once upon a time', 'The cat sat', ids.slice(0, 30)];
  const r = await ai.completions.create({ model: MODEL_ID, prompt: prompts, n: 2, max_tokens: 10, temperature: 0 });
  assert.equal(r.choices.length, 6);
  let promptTokens = 0;
  for (let k = 0; k < prompts.length; k++) {
    const alone = await ai.completions.create({ model: MODEL_ID, prompt: prompts[k], max_tokens: 10, temperature: 0 });
    promptTokens += alone.usage.prompt_tokens;
    for (let j = 0; j < 2; j++) {
      const c = r.choices.find((x) => x.index === k * 2 + j);
      assert.equal(c.text, alone.choices[0].text, `prompt ${k}, choice ${j}: greedy, as the prompt alone`);
    }
  }
  assert.equal(r.usage.prompt_tokens, promptTokens, 'each prompt counted once');
  assert.equal(r.usage.completion_tokens, 60);
  // streamed: every choice's chunks carry its index; the texts equal the non-streamed ones
  const texts = new Map();
  for await (const ch of await ai.completions.create({ model: MODEL_ID, prompt: prompts, n: 2, max_tokens: 10, temperature: 0, stream: true })) {
    for (const c of ch.choices) texts.set(c.index, (texts.get(c.index) ?? '') + c.text);
  }
  assert.deepEqual([...texts.keys()].sort(), [0, 1, 2, 3, 4, 5]);
  for (const c of r.choices) assert.equal(texts.get(c.index), c.text);
});

test('several prompts with echo and logprobs: each prompt scored on its own', async () => {
  const prompts = [ids.slice(0, 50), ids.slice(0, 90), ids.slice(0, 20)];
  const r = await ai.completions.create({ model: MODEL_ID, prompt: prompts, echo: true, logprobs: 3, max_tokens: 0 });
  assert.equal(r.choices.length, 3);
  for (const c of r.choices) {
    assert.equal(c.logprobs.tokens.length, prompts[c.index].length);
    checkPromptLogprobs(c.logprobs, prompts[c.index], 3);
  }
});

test('several prompts: bad entries are 400s naming prompt; more choices than the server queues, 429', async () => {
  const bad = async (body, param) => {
    const r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, max_tokens: 2, ...body }) });
    assert.equal(r.status, 400, JSON.stringify(body).slice(0, 80));
    assert.equal(r.json.error.param, param);
    return r.json.error.message;
  };
  assert.match(await bad({ prompt: ['a', 5] }, 'prompt'), /'prompt'\[1\]/);
  assert.match(await bad({ prompt: [[1, 2], [1, 99999]] }, 'prompt'), /'prompt'\[1\]\[1\]/);
  assert.match(await bad({ prompt: [[1], []] }, 'prompt'), /'prompt'\[1\] is an empty array/);
  await bad({ prompt: Array(257).fill('a') }, 'prompt');
  const r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, max_tokens: 2, prompt: Array(20).fill('a'), n: 5 }) });
  assert.equal(r.status, 429, 'as for n alone: the whole request is refused, nothing queued');
  assert.match(r.json.error.message, /100 more would exceed/);
});

test('vLLM prompt_logprobs: each prompt token with its logprob and rank, and the most likely ones', async () => {
  const prompt = ids.slice(0, 80);
  const r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt, max_tokens: 1, temperature: 0, prompt_logprobs: 3 }) });
  assert.equal(r.status, 200, r.text);
  const pl = r.json.choices[0].prompt_logprobs;
  assert.equal(pl.length, prompt.length);
  assert.equal(pl[0], null);
  for (let i = 1; i < prompt.length; i++) {
    const row = ref[i - 1], tok = prompt[i];
    const e = pl[i][String(tok)];
    assert.ok(Math.abs(e.logprob - row[tok]) < 1e-4, `position ${i}`);
    assert.equal(e.rank, 1 + row.filter((x) => x > row[tok]).length, `position ${i}: the rank among the vocabulary`);
    const best = row.map((x, id) => [x, id]).sort((a, b) => b[0] - a[0]).slice(0, 3);
    for (let k = 0; k < 3; k++) {
      const alt = pl[i][String(best[k][1])];
      assert.ok(alt && Math.abs(alt.logprob - best[k][0]) < 1e-4, `position ${i}: alternative ${k}`);
      if (best[k][1] !== tok) assert.equal(alt.rank, k + 1);
    }
    assert.ok(Object.keys(pl[i]).length <= 4);
    assert.equal(typeof e.decoded_token, 'string');
  }
  assert.equal(r.json.choices[0].logprobs, null, 'no output logprobs unless asked');
  // chat: the response's prompt_logprobs cover the rendered prompt
  const ch = await raw(srv, '/v1/chat/completions', { body: JSON.stringify({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hi there' }], max_tokens: 1, prompt_logprobs: 0 }) });
  assert.equal(ch.status, 200, ch.text);
  assert.equal(ch.json.prompt_logprobs.length, ch.json.usage.prompt_tokens);
  assert.equal(Object.keys(ch.json.prompt_logprobs[1]).length, 1, 'prompt_logprobs 0: the prompt token alone');
  const st = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: 'Hi', stream: true, prompt_logprobs: 1 }) });
  assert.equal(st.status, 400);
  assert.equal(st.json.error.param, 'prompt_logprobs');
});

test('chat echo (vLLM): a final assistant message comes back before the answer; with continue_final_message, the whole turn', async () => {
  const messages = [{ role: 'user', content: 'Tell me a story' }, { role: 'assistant', content: 'Once upon a time' }];
  const req = { model: MODEL_ID, messages, continue_final_message: true, max_tokens: 12, temperature: 0 };
  const plain = (await ai.chat.completions.create(req)).choices[0].message.content;
  const echoed = (await ai.chat.completions.create({ ...req, echo: true })).choices[0].message.content;
  assert.equal(echoed, 'Once upon a time' + plain);
  let streamed = '';
  for await (const ch of await ai.chat.completions.create({ ...req, echo: true, stream: true })) streamed += ch.choices[0]?.delta?.content ?? '';
  assert.equal(streamed, echoed);
  // the final message is not the assistant's: nothing to echo
  const user = [{ role: 'user', content: 'Tell me a story' }];
  const a = await ai.chat.completions.create({ model: MODEL_ID, messages: user, max_tokens: 6, temperature: 0 });
  const b = await ai.chat.completions.create({ model: MODEL_ID, messages: user, max_tokens: 6, temperature: 0, echo: true });
  assert.equal(b.choices[0].message.content, a.choices[0].message.content);
});
