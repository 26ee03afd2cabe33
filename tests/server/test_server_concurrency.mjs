// test_server_concurrency.mjs — continuous batching under load: 32 concurrent streaming clients ×
// 4 requests with distinct prompts. Every request completes exactly once, each greedy output is
// identical to the same request run alone (sequentially, and spot-checked against `kiln run`), the
// KV pages held by requests go back to zero, and the server's peak RSS is reported.
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, kilnRun, metrics, waitMetrics, MODEL_ID } from './lib.mjs';

const CLIENTS = 32, PER_CLIENT = 4, MAX_TOKENS = 24;
const names = ['Lily', 'Tom', 'Sue', 'Ben', 'Max', 'Amy', 'Tim', 'Sam'];
const things = ['a red ball', 'a big dog', 'a little bird', 'a shiny car', 'a green frog', 'a tall tree', 'a yellow cat', 'a blue boat',
  'a funny hat', 'a soft bed', 'a small box', 'a sweet cake', 'a brave bear', 'a kind fish', 'a pink flower', 'a happy duck'];
const prompts = [];
for (let i = 0; i < CLIENTS * PER_CLIENT; i++)
  prompts.push(`${names[i % 8]} had ${things[Math.floor(i / 8) % 16]}. One day`);
assert.equal(new Set(prompts).size, prompts.length, 'distinct prompts');

// a KV pool small enough that 32 long-running sequences must share it (preemption may happen)
const srv = await startServer(['--max-batch', '32', '--max-queue', '128']);
const ai = client(srv);
test.after(async () => { assert.equal(await srv.stop(), 0); });

test('32 concurrent streaming clients × 4 requests: each output equals its sequential run', async () => {
  // sequential reference, one request at a time
  const seq = [];
  for (const p of prompts) {
    const r = await ai.completions.create({ model: MODEL_ID, prompt: p, max_tokens: MAX_TOKENS, temperature: 0 });
    seq.push(r.choices[0].text);
  }
  for (const i of [0, 37, 127]) assert.equal(seq[i], kilnRun(prompts[i], MAX_TOKENS).text, `sequential run ${i} equals kiln run`);
  const before = await metrics(srv);

  const got = new Array(prompts.length).fill(null);
  const ids = new Set();
  let done = 0;
  const t0 = Date.now();
  await Promise.all(Array.from({ length: CLIENTS }, async (_, c) => {
    for (let k = 0; k < PER_CLIENT; k++) {
      const i = c * PER_CLIENT + k;
      const chat = i % 2 === 1; // half chat (prompt rendered by the built-in template), half completions
      const stream = chat
        ? await ai.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: prompts[i] }], max_tokens: MAX_TOKENS, temperature: 0,
          stream: true, stream_options: { include_usage: true } })
        : await ai.completions.create({ model: MODEL_ID, prompt: prompts[i], max_tokens: MAX_TOKENS, temperature: 0, stream: true,
          stream_options: { include_usage: true } });
      let text = '', finishes = 0, usage = null, id = null;
      for await (const ch of stream) {
        id ??= ch.id;
        assert.equal(ch.id, id, 'one id per stream');
        if (ch.usage) usage = ch.usage;
        const ch0 = ch.choices[0];
        if (!ch0) continue;
        text += chat ? (ch0.delta.content ?? '') : ch0.text;
        if (ch0.finish_reason) finishes++;
      }
      assert.equal(finishes, 1, `request ${i} finished exactly once`);
      assert.ok(!ids.has(id), 'distinct ids');
      ids.add(id);
      assert.equal(usage.completion_tokens, MAX_TOKENS);
      assert.equal(got[i], null, `request ${i} completed once`);
      got[i] = { text, chat };
      done++;
    }
  }));
  const secs = (Date.now() - t0) / 1000;
  assert.equal(done, prompts.length);
  // chat requests: compare with a sequential chat run of the same messages
  for (let i = 0; i < prompts.length; i++) {
    if (!got[i].chat) { assert.equal(got[i].text, seq[i], `completion ${i} equals its sequential run`); continue; }
    const r = await ai.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: prompts[i] }], max_tokens: MAX_TOKENS, temperature: 0 });
    assert.equal(got[i].text, r.choices[0].message.content, `chat ${i} equals its sequential run`);
  }
  const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0 && x['kiln_running_requests'] === 0 && x['kiln_queue_depth'] === 0);
  assert.equal(m['kiln_kv_pages_used'], 0, 'KV pages back to zero in use');
  assert.equal(m['kiln_kv_pages_free'] + m['kiln_kv_pages_cached_idle'], m['kiln_kv_pages']);
  const steps = m['kiln_scheduler_steps_total'] - before['kiln_scheduler_steps_total'];
  const toks = m['kiln_generation_tokens_total'] - before['kiln_generation_tokens_total'];
  // continuous batching: steps ran several sequences at once (how many depends on client speed)
  const wide = m['kiln_batch_size_steps_count'] - m['kiln_batch_size_steps_bucket{le="3"}'];
  assert.ok(wide > 0 && toks > steps, `batching: ${toks} tokens in ${steps} steps, ${wide} steps with >= 4 sequences`);
  console.log(`# 128 streaming requests in ${secs.toFixed(2)} s, ${toks} tokens in ${steps} steps (${(toks / steps).toFixed(1)} per step), ` +
    `preemptions ${m['kiln_preemptions_total']}, peak RSS ${(m['kiln_process_peak_rss_bytes'] / 1048576).toFixed(1)} MiB`);
});

test('a KV pool too small for the batch: preemption keeps outputs identical and frees every page', async () => {
  // a budget of at most 20 pages of 16 tokens (stories260K's f32 K+V is >= 10240 bytes a page):
  // 8 concurrent requests of ~14 + 40 tokens need 32, so some are preempted and recomputed.
  const small = await startServer(['--kv-mem', String(20 * 10240 + 20 * 64), '--max-batch', '8']);
  try {
    const c = client(small);
    const ps = prompts.slice(0, 8);
    const ref = [];
    for (const p of ps) ref.push((await c.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 40, temperature: 0 })).choices[0].text);
    // The 8 requests overlap only if they reach the server together; on a loaded machine they can
    // arrive one by one (each is done in milliseconds) and nothing is preempted: then the round is
    // repeated (every round checks the outputs), up to 6 times, until one preempted.
    let m;
    for (let round = 0; round < 6; round++) {
      const out = await Promise.all(ps.map((p) => c.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 40, temperature: 0 })));
      out.forEach((r, i) => assert.equal(r.choices[0].text, ref[i], `request ${i} under preemption (round ${round})`));
      m = await waitMetrics(small, (x) => x['kiln_kv_pages_used'] === 0);
      if (m['kiln_preemptions_total'] > 0) break;
    }
    assert.ok(m['kiln_kv_pages'] < 32, `pool of ${m['kiln_kv_pages']} pages`);
    console.log(`# small pool: ${m['kiln_kv_pages']} pages, preemptions ${m['kiln_preemptions_total']}, evictions ${m['kiln_prefix_cache_evictions_total']}`);
    assert.ok(m['kiln_preemptions_total'] > 0, 'the small pool forced preemption');
  } finally {
    assert.equal(await small.stop(), 0);
  }
});

test('chunked prefill: a long prompt does not stall a running stream', async () => {
  // --step-tokens 8: a 400-token prompt is prefilled 7 tokens a step (the stream's decode token goes
  // first in every step), so over ~57 steps that each also advance the stream; without chunking it
  // would be one step during which the stream waits. The long prompt is sent as soon as the stream
  // has its first token; on a loaded machine the stream may end first (then the try is repeated).
  const s2 = await startServer(['--max-batch', '4', '--step-tokens', '8', '--no-prefix-cache']);
  try {
    const c = client(s2);
    const long = Array.from({ length: 400 }, (_, i) => 3 + ((i * 37) % 500));
    const two = (m) => m['kiln_batch_size_steps_bucket{le="3"}'] - m['kiln_batch_size_steps_bucket{le="1"}'];
    let shared = 0, steps = 0;
    for (let attempt = 0; attempt < 3 && shared < 40; attempt++) {
      const m0 = await metrics(s2);
      const stream = await c.completions.create({ model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 480, temperature: 0, ignore_eos: true, stream: true });
      const it = stream[Symbol.asyncIterator]();
      await it.next();
      const b = c.completions.create({ model: MODEL_ID, prompt: long, max_tokens: 1, temperature: 0 });
      let chunks = 1;
      for (let r = await it.next(); !r.done; r = await it.next()) chunks++;
      const bb = await b;
      const m1 = await metrics(s2);
      assert.equal(bb.usage.prompt_tokens, 400);
      assert.ok(chunks > 400);
      shared = two(m1) - two(m0);
      steps = m1['kiln_scheduler_steps_total'] - m0['kiln_scheduler_steps_total'];
    }
    assert.ok(shared >= 40, `${shared} of ${steps} steps ran the stream's token together with a prompt chunk`);
    console.log(`# chunked prefill: ${shared} steps carried a decode token and a prompt chunk`);
  } finally {
    assert.equal(await s2.stop(), 0);
  }
});
