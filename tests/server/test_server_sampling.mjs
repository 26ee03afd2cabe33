// test_server_sampling.mjs — the sampling parameters beyond temperature / top_p, through the
// official `openai` client on stories260K: presence / frequency penalty (OpenAI semantics: output
// tokens only) checked step by step against the model's raw distribution (the same server without
// penalties, fed the generated ids as a prompt), vLLM's repetition_penalty, logit_bias, and the
// 400s for bad values.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, client, raw, KILN, MODEL, MODEL_ID } from './lib.mjs';

const srv = await startServer();
const ai = client(srv);
test.after(async () => { assert.equal(await srv.stop(), 0, 'the server exits 0 on SIGTERM'); });

// piece → id from the llama2.c tokenizer file itself (independent of the server): per token
// float score, int32 length, bytes; byte-fallback pieces <0xHH> render as that byte.
const pieceId = new Map();
{
  const b = fs.readFileSync(path.join(MODEL, 'tok512.bin'));
  let o = 4;
  for (let id = 0; o < b.length; id++) {
    o += 4;
    const n = b.readInt32LE(o);
    o += 4;
    let p = b.subarray(o, o + n).toString('latin1');
    const m = p.match(/^<0x([0-9A-F]{2})>$/);
    if (m) p = String.fromCharCode(parseInt(m[1], 16));
    pieceId.set(p, id);
    o += n;
  }
}
const idOf = (piece) => { assert.ok(pieceId.has(piece), `piece ${JSON.stringify(piece)} in tok512.bin`); return pieceId.get(piece); };

function promptIds(text) {
  const r = spawnSync(KILN, ['tokenize', MODEL, '--json', text], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout).ids;
}

const PROMPT = 'Once upon a time';
const N = 40;

// greedy + logprobs 5 on a token-id prompt: { tokens, lps, tops }
async function greedy(prompt, extra = {}) {
  const r = await ai.completions.create({ model: MODEL_ID, prompt, max_tokens: N, temperature: 0, logprobs: 5, ...extra });
  const lp = r.choices[0].logprobs;
  return { text: r.choices[0].text, tokens: lp.tokens, lps: lp.token_logprobs, tops: lp.top_logprobs, usage: r.usage };
}

test('greedy without penalties repeats tokens (the baseline the penalties change)', async () => {
  const g = await greedy(PROMPT);
  assert.ok(new Set(g.tokens).size < g.tokens.length, 'some token repeats in the greedy text');
});

for (const [fp, pp] of [[2, 0], [0, 2], [1.5, 0.5], [-1, 0]]) {
  test(`frequency_penalty ${fp}, presence_penalty ${pp}: each greedy step is the argmax of raw logits − penalty over output tokens`, async () => {
    const ids = promptIds(PROMPT);
    const g = await greedy(ids, { frequency_penalty: fp, presence_penalty: pp });
    const base = await greedy(ids);
    if (fp > 0 || pp > 0) assert.notEqual(g.text, base.text, 'the penalty changes the greedy text');
    const count = new Map();
    let checked = 0, compared = 0;
    for (let k = 0; k < g.tokens.length; k++) {
      // the raw distribution at this step: no penalties, prompt = prompt ids + generated ids so far
      const gen = g.tokens.slice(0, k).map(idOf);
      const r = await ai.completions.create({ model: MODEL_ID, prompt: [...ids, ...gen], max_tokens: 1, temperature: 0, logprobs: 5 });
      const rawTop = r.choices[0].logprobs.top_logprobs[0];
      const pen = (t) => { const c = count.get(t) || 0; return fp * c + pp * (c > 0 ? 1 : 0); };
      const cand = Object.entries(rawTop).map(([t, lp]) => [t, lp - pen(t)]).sort((a, b) => b[1] - a[1]);
      const fifth = Math.min(...Object.values(rawTop));
      // penalties ≥ 0 only lower logits: a token outside the raw top 5 cannot beat the best
      // penalized candidate when that one is still ≥ the raw 5th; negative penalties: only when
      // the best raw token was never generated and stays first
      const decidable = (fp >= 0 && pp >= 0) ? cand[0][1] >= fifth && cand[0][1] - cand[1][1] > 1e-4 : false;
      if (decidable) { assert.equal(g.tokens[k], cand[0][0], `step ${k}`); checked++; }
      // logprobs are those of the penalized distribution: differences between two tokens of both
      // top-5 lists equal the raw differences minus the penalty differences
      const mine = g.tops[k];
      const both = Object.keys(mine).filter((t) => t in rawTop);
      for (let i = 1; i < both.length; i++) {
        const a = both[0], b = both[i];
        assert.ok(Math.abs((mine[a] - mine[b]) - ((rawTop[a] - pen(a)) - (rawTop[b] - pen(b)))) < 2e-3, `step ${k}: logprob of ${a} vs ${b}`);
        compared++;
      }
      assert.ok(Math.abs(g.lps[k] - mine[g.tokens[k]]) < 1e-6 || !(g.tokens[k] in mine), 'token_logprobs agrees with top_logprobs');
      count.set(g.tokens[k], (count.get(g.tokens[k]) || 0) + 1);
    }
    if (fp >= 0 && pp >= 0) assert.ok(checked >= N / 2, `at least half the steps decidable (${checked})`);
    assert.ok(compared >= N, `logprob differences compared (${compared})`);
  });
}

test('a large frequency penalty stops the greedy repetition', async () => {
  const g = await greedy(PROMPT, { frequency_penalty: 2, presence_penalty: 2 });
  const base = await greedy(PROMPT);
  const reps = (t) => t.length - new Set(t).size;
  assert.ok(reps(g.tokens) < reps(base.tokens), `fewer repeated tokens (${reps(g.tokens)} < ${reps(base.tokens)})`);
});

test('repetition_penalty (vLLM): 1 = off, > 1 changes greedy and lowers repeated prompt tokens', async () => {
  const base = await greedy(PROMPT);
  assert.equal((await greedy(PROMPT, { repetition_penalty: 1 })).text, base.text);
  const g = await greedy(PROMPT, { repetition_penalty: 1.8 });
  assert.notEqual(g.text, base.text);
  // chat too: the parameter is accepted and applies there as well
  const c = await ai.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 20, temperature: 0, repetition_penalty: 1.8 });
  const c0 = await ai.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 20, temperature: 0 });
  assert.notEqual(c.choices[0].message.content, c0.choices[0].message.content);
});

test('penalties at 0 and repetition_penalty 1 leave seeded sampling unchanged', async () => {
  const a = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 0.9, seed: 77 });
  const b = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 0.9, seed: 77, presence_penalty: 0, frequency_penalty: 0, repetition_penalty: 1 });
  assert.equal(a.choices[0].text, b.choices[0].text);
});

test('logit_bias +100 forces a token at temperature 0 (completions and chat)', async () => {
  const id = idOf(' do');
  const g = await greedy(PROMPT, { logit_bias: { [id]: 100 } });
  assert.deepEqual(g.tokens, Array(N).fill(' do'));
  for (const lp of g.lps) assert.ok(lp > -1e-3, `the forced token's logprob is ~0 (${lp})`);
  const c = await ai.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 5, temperature: 0, logit_bias: { [id]: 100 } });
  assert.equal(c.choices[0].message.content, ' do do do do do');
});

test('logit_bias -100 bans the greedy token: the first token becomes the raw runner-up', async () => {
  const base = await greedy(PROMPT);
  const ranked = Object.entries(base.tops[0]).sort((a, b) => b[1] - a[1]);
  assert.equal(ranked[0][0], base.tokens[0]);
  const g = await greedy(PROMPT, { logit_bias: { [idOf(base.tokens[0])]: -100 } });
  assert.equal(g.tokens[0], ranked[1][0]);
  assert.ok(!g.tokens.includes(base.tokens[0]), 'the banned token never appears');
  // a small bias that keeps the order changes nothing; an empty object is no bias
  assert.equal((await greedy(PROMPT, { logit_bias: {} })).text, base.text);
});

const C = '/v1/completions', CH = '/v1/chat/completions';
const good = { model: MODEL_ID, prompt: 'Hi', max_tokens: 2 };
const chat = { model: MODEL_ID, messages: [{ role: 'user', content: 'Hi' }], max_tokens: 2 };
const bad = [
  ['presence_penalty 2.5', C, { ...good, presence_penalty: 2.5 }, 'presence_penalty', '2.5'],
  ['presence_penalty -3 (chat)', CH, { ...chat, presence_penalty: -3 }, 'presence_penalty', '-3'],
  ['frequency_penalty 2.01', C, { ...good, frequency_penalty: 2.01 }, 'frequency_penalty', '2.01'],
  ['frequency_penalty a string', CH, { ...chat, frequency_penalty: '1' }, 'frequency_penalty', 'number'],
  ['repetition_penalty 0', C, { ...good, repetition_penalty: 0 }, 'repetition_penalty', '0'],
  ['repetition_penalty -1', CH, { ...chat, repetition_penalty: -1 }, 'repetition_penalty', '-1'],
  ['logit_bias not an object', C, { ...good, logit_bias: [1, 2] }, 'logit_bias', 'object'],
  ['logit_bias key not an integer', CH, { ...chat, logit_bias: { abc: 1 } }, 'logit_bias', 'abc'],
  ['logit_bias key negative', C, { ...good, logit_bias: { '-1': 1 } }, 'logit_bias', '-1'],
  ['logit_bias key a fraction', C, { ...good, logit_bias: { '1.5': 1 } }, 'logit_bias', '1.5'],
  ['logit_bias key = vocab', C, { ...good, logit_bias: { 512: 1 } }, 'logit_bias', '512'],
  ['logit_bias value 101', CH, { ...chat, logit_bias: { 5: 101 } }, 'logit_bias', '101'],
  ['logit_bias value -100.5', C, { ...good, logit_bias: { 5: -100.5 } }, 'logit_bias', '-100.5'],
  ['logit_bias value a string', C, { ...good, logit_bias: { 5: 'x' } }, 'logit_bias', 'number'],
  ['logit_bias 301 entries', C, { ...good, logit_bias: Object.fromEntries([...Array(301).keys()].map((i) => [i, 1])) }, 'logit_bias', '301'],
];
for (const [name, route, body, param, inMsg] of bad) {
  test(`400: ${name}`, async () => {
    const r = await raw(srv, route, { body: JSON.stringify(body) });
    assert.equal(r.status, 400, r.text);
    assert.equal(r.json.error.type, 'invalid_request_error');
    assert.equal(r.json.error.param, param);
    assert.ok(r.json.error.message.includes(param) && r.json.error.message.includes(inMsg), r.json.error.message);
  });
}
