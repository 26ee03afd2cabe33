// test_server_overload.mjs — limits and failure paths: 4× the queue limit at once (the excess gets
// 429 with Retry-After, the rest complete), a client that disconnects mid-stream has its pages
// freed at once (visible in /metrics), the per-request timeout, and graceful shutdown on SIGTERM
// (in-flight requests finish, new ones are refused, exit status 0).
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, metrics, waitMetrics, raw, MODEL_ID } from './lib.mjs';

test('overload: 4× the queue limit at once → excess 429, the rest complete', async () => {
  const QUEUE = 4, BATCH = 2;
  const srv = await startServer(['--max-batch', String(BATCH), '--max-queue', String(QUEUE)]);
  try {
    const N = 4 * QUEUE;
    // long generations so that all requests arrive while the first ones still run
    const body = (i) => JSON.stringify({ model: MODEL_ID, prompt: `Story number ${i}: Once upon a time`, max_tokens: 400, temperature: 0, ignore_eos: true });
    const res = await Promise.all(Array.from({ length: N }, (_, i) => raw(srv, '/v1/completions', { body: body(i) })));
    const ok = res.filter((r) => r.status === 200), busy = res.filter((r) => r.status === 429);
    assert.equal(ok.length + busy.length, N, `statuses: ${res.map((r) => r.status)}`);
    assert.ok(busy.length > 0, 'some requests were refused');
    assert.ok(ok.length >= QUEUE, `at least the queue's worth completed (${ok.length})`);
    for (const r of ok) assert.equal(r.json.usage.completion_tokens, 400);
    for (const r of busy) {
      assert.equal(r.headers.get('retry-after'), '1');
      assert.equal(r.json.error.code, 'rate_limit_exceeded');
      assert.equal(typeof r.json.error.message, 'string');
    }
    // the official client surfaces it as a RateLimitError
    const ai = client(srv);
    const flood = await Promise.allSettled(Array.from({ length: N }, (_, i) =>
      ai.completions.create({ model: MODEL_ID, prompt: `Again ${i}`, max_tokens: 400, temperature: 0, ignore_eos: true })));
    const rejected = flood.filter((x) => x.status === 'rejected');
    assert.ok(rejected.length > 0 && rejected.every((x) => x.reason.status === 429), 'client sees 429');
    const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0 && x['kiln_running_requests'] === 0);
    assert.equal(m['kiln_requests_total{code="429"}'], busy.length + rejected.length);
    console.log(`# overload: ${ok.length} completed, ${busy.length} got 429`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('a client that disconnects mid-stream has its pages freed at once', async () => {
  const srv = await startServer();
  try {
    const ctl = new AbortController();
    const res = await fetch(`${srv.base}/completions`, {
      method: 'POST', signal: ctl.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 500, temperature: 0, ignore_eos: true, stream: true }),
    });
    assert.equal(res.status, 200);
    assert.match(res.headers.get('content-type'), /text\/event-stream/);
    const reader = res.body.getReader();
    await reader.read(); // the first event: the request is running and holds pages
    const during = await metrics(srv);
    assert.ok(during['kiln_kv_pages_used'] > 0 || during['kiln_requests_finished_total{reason="length"}'] === 0);
    ctl.abort();
    const m = await waitMetrics(srv, (x) => x['kiln_requests_finished_total{reason="cancelled"}'] === 1, 3000);
    assert.equal(m['kiln_kv_pages_used'], 0, 'pages freed');
    assert.equal(m['kiln_client_disconnects_total'], 1);
    assert.equal(m['kiln_requests_finished_total{reason="length"}'], 0, 'the request did not run to its end');
    assert.ok(m['kiln_generation_tokens_total'] < 500);
    // a non-streaming request whose client goes away is cancelled too
    const ctl2 = new AbortController();
    const p = fetch(`${srv.base}/completions`, {
      method: 'POST', signal: ctl2.signal, headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: MODEL_ID, prompt: [1], max_tokens: 500, temperature: 0, ignore_eos: true }),
    }).catch((e) => e);
    await waitMetrics(srv, (x) => x['kiln_running_requests'] === 1 || x['kiln_generation_tokens_total'] > m['kiln_generation_tokens_total']);
    ctl2.abort();
    await p;
    const m2 = await waitMetrics(srv, (x) => x['kiln_requests_finished_total{reason="cancelled"}'] + x['kiln_requests_finished_total{reason="length"}'] === 2, 3000);
    assert.equal(m2['kiln_kv_pages_used'], 0);
    // still serving
    const ok = await client(srv).completions.create({ model: MODEL_ID, prompt: 'Hi', max_tokens: 4, temperature: 0 });
    assert.equal(ok.usage.completion_tokens, 4);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('per-request timeout → 504 (non-streaming) / error event (streaming), pages freed', async () => {
  const srv = await startServer(['--request-timeout', '0.005']);
  try {
    const r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: [1], max_tokens: 500, ignore_eos: true }) });
    assert.equal(r.status, 504);
    assert.equal(r.json.error.code, 'timeout');
    const s = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: [1], max_tokens: 500, ignore_eos: true, stream: true }) });
    assert.equal(s.status, 200);
    assert.match(s.text, /"code":"timeout"/);
    assert.match(s.text, /data: \[DONE\]\n\n$/);
    const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0);
    assert.equal(m['kiln_request_timeouts_total'], 2);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('graceful shutdown: in-flight requests finish, then the process exits 0', async () => {
  const srv = await startServer(['--shutdown-grace', '20']);
  const ai = client(srv);
  const inflight = ai.completions.create({ model: MODEL_ID, prompt: 'Once upon a time', max_tokens: 400, temperature: 0, ignore_eos: true, stream: true });
  const stream = await inflight;
  const it = stream[Symbol.asyncIterator]();
  await it.next(); // running
  const exited = srv.stop('SIGTERM');
  let text = '', finish = null;
  for (let r = await it.next(); !r.done; r = await it.next()) {
    text += r.value.choices[0]?.text ?? '';
    finish = r.value.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(finish, 'length', 'the in-flight stream ran to its end');
  assert.equal(await exited, 0);
  assert.match(srv.log(), /stopped/);
});
