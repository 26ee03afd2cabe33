// test_server_sampling.mjs — the sampling parameters beyond temperature / top_p, through the
// official `openai` client on stories260K: presence / frequency penalty (OpenAI semantics: output
// tokens only) checked step by step against the model's raw distribution (the same server without
// penalties, fed the generated ids as a prompt), vLLM's repetition_penalty, logit_bias, n > 1
// (choices, indices, usage, seeds, streaming, prefix sharing, cancellation, queue full) and the
// 400s for bad values.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { startServer, client, raw, metrics, waitMetrics, KILN, MODEL, MODEL_ID } from './lib.mjs';

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

test('min_p 1 keeps only the most likely token: seeded sampling at temperature 1 is the greedy text; min_p 0 is off', async () => {
  const g = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 0 });
  for (const seed of [3, 4]) {
    const m = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 1, seed, min_p: 1 });
    assert.equal(m.choices[0].text, g.choices[0].text, `seed ${seed}`);
  }
  const a = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 0.9, seed: 77 });
  const b = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 0.9, seed: 77, min_p: 0 });
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

// ---- n > 1 ----
async function streamChoices(stream) {
  const text = {}, finish = {}, role = {};
  let usage = null;
  for await (const ch of stream) {
    if (ch.usage) usage = ch.usage;
    for (const c of ch.choices) {
      text[c.index] = (text[c.index] ?? '') + (c.delta ? (c.delta.content ?? '') : (c.text ?? ''));
      if (c.delta?.role) role[c.index] = (role[c.index] ?? 0) + 1;
      if (c.finish_reason) { assert.equal(finish[c.index], undefined, `one finish_reason for choice ${c.index}`); finish[c.index] = c.finish_reason; }
    }
  }
  return { text, finish, role, usage };
}

test('n = 3 at temperature 0: three identical choices, index 0..2, usage counts the prompt once', async () => {
  const one = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 12, temperature: 0 });
  const r = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 12, temperature: 0, n: 3, logprobs: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of r.choices) {
    assert.equal(c.text, one.choices[0].text);
    assert.equal(c.finish_reason, 'length');
    assert.equal(c.logprobs.tokens.length, 12);
  }
  assert.equal(r.usage.prompt_tokens, one.usage.prompt_tokens);
  assert.equal(r.usage.completion_tokens, 3 * one.usage.completion_tokens);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  const msgs = [{ role: 'user', content: 'Hi' }];
  const c1 = await ai.chat.completions.create({ model: MODEL_ID, messages: msgs, max_tokens: 10, temperature: 0 });
  const c3 = await ai.chat.completions.create({ model: MODEL_ID, messages: msgs, max_tokens: 10, temperature: 0, n: 3 });
  assert.deepEqual(c3.choices.map((c) => c.index), [0, 1, 2]);
  for (const c of c3.choices) assert.equal(c.message.content, c1.choices[0].message.content);
  assert.equal(c3.usage.prompt_tokens, c1.usage.prompt_tokens);
  assert.equal(c3.usage.completion_tokens, 3 * c1.usage.completion_tokens);
});

test('n = 2 with a seed: reproducible, and choice i is the n = 1 request with seed + i', async () => {
  const req = { model: MODEL_ID, prompt: PROMPT, max_tokens: 30, temperature: 1, seed: 4242 };
  const a = await ai.completions.create({ ...req, n: 2 });
  const b = await ai.completions.create({ ...req, n: 2 });
  assert.deepEqual(a.choices.map((c) => c.text), b.choices.map((c) => c.text));
  assert.notEqual(a.choices[0].text, a.choices[1].text, 'the two choices sample differently');
  for (let i = 0; i < 2; i++) {
    const single = await ai.completions.create({ ...req, seed: 4242 + i });
    assert.equal(a.choices[i].text, single.choices[0].text, `choice ${i} = seed + ${i}`);
  }
  // chat, streaming: the same texts as non-streaming
  const msgs = [{ role: 'user', content: 'Tell me a story' }];
  const ns = await ai.chat.completions.create({ model: MODEL_ID, messages: msgs, max_tokens: 25, temperature: 1, seed: 9, n: 2 });
  const st = await streamChoices(await ai.chat.completions.create({ model: MODEL_ID, messages: msgs, max_tokens: 25, temperature: 1, seed: 9, n: 2, stream: true, stream_options: { include_usage: true } }));
  for (let i = 0; i < 2; i++) {
    assert.equal(st.text[i], ns.choices[i].message.content);
    assert.equal(st.finish[i], ns.choices[i].finish_reason);
    assert.equal(st.role[i], 1, 'one role chunk per choice');
  }
  assert.deepEqual(st.usage, ns.usage);
});

test('n = 3 streaming completions: each index streams its own text and finish; usage once at the end', async () => {
  const ns = await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 20, temperature: 0.8, seed: 5, n: 3, stop: ['.'] });
  const st = await streamChoices(await ai.completions.create({ model: MODEL_ID, prompt: PROMPT, max_tokens: 20, temperature: 0.8, seed: 5, n: 3, stop: ['.'], stream: true, stream_options: { include_usage: true } }));
  assert.deepEqual(Object.keys(st.text).sort(), ['0', '1', '2']);
  for (let i = 0; i < 3; i++) {
    assert.equal(st.text[i], ns.choices[i].text);
    assert.equal(st.finish[i], ns.choices[i].finish_reason);
    assert.ok(!st.text[i].includes('.'));
  }
  assert.equal(st.usage.completion_tokens, ns.usage.completion_tokens);
  assert.equal(st.usage.prompt_tokens, ns.usage.prompt_tokens);
});

test('n = 3: the siblings reuse the first choice\'s prompt pages from the prefix cache', async () => {
  const prompt = 'The purple kangaroo hopped over seven sleepy turtles while a tiny robot sang about lemons and the moon, and everyone laughed at the silly noisy parade in the big green park';
  const P = promptIds(prompt).length;
  assert.ok(P > 33, `prompt of ${P} tokens spans full pages`);
  const before = await metrics(srv);
  const r = await ai.completions.create({ model: MODEL_ID, prompt, max_tokens: 4, temperature: 0, n: 3 });
  assert.equal(r.choices.length, 3);
  const after = await metrics(srv);
  const pages = Math.floor((P - 1) / 16); // full pages a request can reuse (one prompt token is always computed)
  assert.equal(r.usage.prompt_tokens_details.cached_tokens, 0, 'the first choice computed the prompt');
  assert.equal(after['kiln_prefix_cache_hit_tokens_total'] - before['kiln_prefix_cache_hit_tokens_total'], 2 * pages * 16, 'each sibling reused every full prompt page');
  assert.equal(after['kiln_prompt_tokens_total'] - before['kiln_prompt_tokens_total'], 3 * P);
});

test('n = 3: a client that disconnects mid-stream cancels all three; pages freed', async () => {
  const before = await metrics(srv);
  const ctl = new AbortController();
  const res = await fetch(`${srv.base}/completions`, {
    method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: MODEL_ID, prompt: PROMPT, max_tokens: 480, temperature: 0, ignore_eos: true, stream: true, n: 3 }),
  });
  assert.equal(res.status, 200);
  const reader = res.body.getReader();
  await reader.read();
  ctl.abort();
  const key = 'kiln_requests_finished_total{reason="cancelled"}';
  const m = await waitMetrics(srv, (x) => x[key] - before[key] === 3, 5000);
  assert.equal(m['kiln_kv_pages_used'], 0, 'pages freed');
  assert.equal(m['kiln_client_disconnects_total'] - before['kiln_client_disconnects_total'], 1, 'one disconnect');
  assert.equal(m['kiln_requests_finished_total{reason="length"}'], before['kiln_requests_finished_total{reason="length"}']);
});

test('n larger than the free queue: 429 for the whole request, nothing left queued', async () => {
  const small = await startServer(['--max-batch', '1', '--max-queue', '1']);
  try {
    const r = await raw(small, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: 'Hi', max_tokens: 4, n: 3 }) });
    assert.equal(r.status, 429);
    assert.equal(r.json.error.code, 'rate_limit_exceeded');
    assert.equal(r.headers.get('retry-after'), '1');
    const m = await waitMetrics(small, (x) => x['kiln_running_requests'] === 0 && x['kiln_queue_depth'] === 0, 3000);
    assert.equal(m['kiln_kv_pages_used'], 0);
    const ok = await client(small).completions.create({ model: MODEL_ID, prompt: 'Hi', max_tokens: 4, temperature: 0, n: 2 });
    assert.equal(ok.choices.length, 2);
    assert.equal(ok.usage.completion_tokens, 8);
  } finally {
    assert.equal(await small.stop(), 0);
  }
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
  ['n 17', C, { ...good, n: 17 }, 'n', '17'],
  ['n 0 (chat)', CH, { ...chat, n: 0 }, 'n', '0'],
  ['n 2.5', C, { ...good, n: 2.5 }, 'n', 'integer'],
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
