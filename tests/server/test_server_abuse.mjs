// test_server_abuse.mjs — hostile clients on loopback, bounded in count and time: malformed and
// oversized bodies and headers, trickled headers and bodies (closed at their absolute deadline
// however slowly the bytes keep coming), 500 idle half-sent connections from several addresses,
// one address over its connection limit, mid-stream and mid-upload drops, 200 concurrent good
// requests. After each a good request is answered, /health answers within 1 s while the 500 slow
// clients hold their connections, and the server's RSS comes back near its plateau.
// The clients use several loopback source addresses (127.0.0.x, all routed to lo on Linux) so
// that the per-address limit (--max-conn-per-ip, default 64) can stay at its default.
import test from 'node:test';
import assert from 'node:assert/strict';
import net from 'node:net';
import http from 'node:http';
import fs from 'node:fs';
import { startServer, metrics, waitMetrics, raw, MODEL_ID } from './lib.mjs';

const HEADER_TO = 4, BODY_TO = 4; // seconds (absolute deadlines; the defaults are 30 / 60)
const srv = await startServer(['--max-connections', '1024', '--header-timeout', String(HEADER_TO), '--body-timeout', String(BODY_TO),
  '--max-body', '64K', '--max-batch', '32', '--max-queue', '256']);
test.after(async () => { assert.equal(await srv.stop(), 0); });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const rssKiB = () => +fs.readFileSync(`/proc/${srv.proc.pid}/status`, 'utf8').match(/VmRSS:\s+(\d+)/)[1];
const body = (p, n = 2, extra = {}) => JSON.stringify({ model: MODEL_ID, prompt: p, max_tokens: n, temperature: 0, ...extra });

// A good request (from 127.0.0.1) is answered.
async function good(what) {
  const r = await raw(srv, '/v1/completions', { body: body('Once upon a time', 3) });
  assert.equal(r.status, 200, `good request after ${what}: ${r.text}`);
  assert.equal(r.json.usage.completion_tokens, 3);
}
async function healthMs() {
  const t0 = performance.now();
  const r = await fetch(`${srv.url}/health`);
  assert.equal(r.status, 200);
  await r.text();
  return performance.now() - t0;
}

// A raw socket from `local` (a 127.0.0.x address); resolves once connected. `closed` resolves with
// the time it closed (s.gone) and what it received.
function sock(local = '127.0.0.1') {
  return new Promise((resolve, reject) => {
    const s = net.connect({ host: '127.0.0.1', port: srv.port, localAddress: local });
    let got = '';
    s.gone = new Promise((res) => s.once('close', () => res({ at: performance.now(), got })));
    s.on('data', (d) => { got += d.toString('latin1'); });
    s.on('error', () => {});
    s.once('connect', () => resolve(s));
    s.once('error', reject);
  });
}
// One raw request; resolves with the status line's code (0 if the server closed without one).
async function rawReq(text, local) {
  const s = await sock(local);
  s.end(text);
  const { got } = await s.gone;
  const m = got.match(/^HTTP\/1\.[01] (\d{3})/);
  return m ? +m[1] : 0;
}
// A POST with its own connection from `local` (http.request, no agent).
function post(local, payload) {
  return new Promise((resolve) => {
    const req = http.request({ host: '127.0.0.1', port: srv.port, localAddress: local, method: 'POST', path: '/v1/completions', agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload) } }, (res) => {
      let t = '';
      res.on('data', (d) => { t += d; });
      res.on('end', () => resolve({ status: res.statusCode, text: t }));
    });
    req.on('error', (e) => resolve({ status: 0, text: String(e) }));
    req.end(payload);
  });
}
async function concurrentGood(n) {
  const res = await Promise.all(Array.from({ length: n }, (_, i) => post(`127.0.0.${10 + (i % 4)}`, body(`Tom had ${i} balls. One day`, 2))));
  const bad = res.filter((r) => r.status !== 200);
  assert.equal(bad.length, 0, `${bad.length} of ${n} failed: ${bad.slice(0, 3).map((r) => r.status + ' ' + r.text).join(' | ')}`);
}

let plateau = 0;
test('200 concurrent good requests (own connections, 4 addresses): all answered; RSS plateau', async () => {
  const t0 = performance.now();
  await concurrentGood(200);
  await concurrentGood(200);
  plateau = rssKiB();
  console.log(`# 2 × 200 concurrent requests in ${((performance.now() - t0) / 1000).toFixed(2)} s, RSS plateau ${(plateau / 1024).toFixed(1)} MiB`);
  await good('200 concurrent');
});

test('malformed bodies → 400, the server keeps serving', async () => {
  const cases = ['{', 'null', '[]', '"x"', '{"model":', '{"model":"stories260K","prompt":"a","prompt":"b"}', '['.repeat(60000),
    '{"model":"stories260K","prompt":"a","max_tokens":1e999}', '{"model":"stories260K","prompt":[1,2,1e30]}', '\u0000\u0001\u0002garbage',
    '{"model":"stories260K","messages":[{"role":"user","content":{"x":' + '['.repeat(5000) + '}}]}'];
  for (const c of cases) {
    const r = await raw(srv, '/v1/completions', { body: c });
    assert.equal(r.status, 400, `${JSON.stringify(c.slice(0, 40))} → ${r.status} ${r.text.slice(0, 200)}`);
    assert.equal(typeof r.json?.error?.message, 'string');
  }
  const bad = Buffer.from([0x7b, 0x22, 0x6d, 0x6f, 0x64, 0x65, 0x6c, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]); // invalid UTF-8
  assert.equal((await raw(srv, '/v1/completions', { body: bad })).status, 400);
  // chunked with a broken chunk size, and a Content-Length the body never reaches (client closes)
  const c1 = await rawReq('POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nabc\r\n0\r\n\r\n', '127.0.0.2');
  assert.ok(c1 === 0 || (c1 >= 400 && c1 < 500), `bad chunk → ${c1}`);
  const s = await sock('127.0.0.2');
  s.end('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"model":');
  await s.gone;
  // a request line that is not HTTP
  const c2 = await rawReq('\u0001\u0002\u0003 / FOO/9\r\n\r\n', '127.0.0.2');
  assert.ok(c2 === 0 || (c2 >= 400 && c2 < 500), `garbage request line → ${c2}`);
  await good('malformed bodies');
});

test('oversized bodies and headers → 413 / 431 (or closed), the server keeps serving', async () => {
  const big = JSON.stringify({ model: MODEL_ID, prompt: 'a'.repeat(200 * 1024), max_tokens: 1 });
  const r = await raw(srv, '/v1/completions', { body: big });
  assert.equal(r.status, 413);
  assert.equal(r.json.error.code, 'request_too_large');
  // a declared length far past the limit is refused before it is read
  const c = await rawReq('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 10000000000\r\n\r\n{', '127.0.0.3');
  assert.equal(c, 413);
  // one 100 KB header, and 5000 small ones (libmicrohttpd's per-connection memory bounds them)
  const h1 = await rawReq(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(100 * 1024)}\r\n\r\n`, '127.0.0.3');
  assert.ok(h1 === 0 || h1 === 431, `100 KB header → ${h1}`);
  const many = Array.from({ length: 5000 }, (_, i) => `X-H${i}: v`).join('\r\n');
  const h2 = await rawReq(`GET /health HTTP/1.1\r\nHost: x\r\n${many}\r\n\r\n`, '127.0.0.3');
  assert.ok(h2 === 0 || h2 === 431, `5000 headers → ${h2}`);
  await good('oversized requests');
});

test('trickled headers and bodies are closed at their absolute deadline', async () => {
  const N = 20;
  const t0 = performance.now();
  const socks = await Promise.all(Array.from({ length: N }, (_, i) => sock(`127.0.0.${20 + (i % 2)}`)));
  const hdr = socks.slice(0, N / 2), bod = socks.slice(N / 2);
  for (const s of hdr) s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\n');
  for (const s of bod) s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100000\r\n\r\n{');
  let open = true;
  const closed = Promise.all(socks.map((s) => s.gone)).then((r) => { open = false; return r; });
  // one byte every 250 ms on every socket: each resets an idle timeout, none extends the deadline
  (async () => { for (let k = 0; open && k < 200; k++) { await sleep(250); for (const s of socks) if (!s.destroyed) s.write(k % 2 ? 'X' : 'a'); } })();
  const health = await healthMs();
  assert.ok(health < 1000, `/health took ${health} ms with trickling clients`);
  const res = await Promise.race([closed, sleep((HEADER_TO + 4) * 1000).then(() => null)]);
  open = false;
  assert.ok(res, `trickling connections still open after ${HEADER_TO + 4} s`);
  const last = Math.max(...res.map((x) => x.at)) - t0;
  assert.ok(last >= (HEADER_TO - 0.5) * 1000, `closed after ${last} ms (not before the deadline)`);
  console.log(`# ${N} trickling connections (headers and bodies) closed by ${(last / 1000).toFixed(2)} s (deadline ${HEADER_TO} s)`);
  const m = await metrics(srv);
  assert.ok(m['kiln_http_deadline_closes_total'] >= N, `deadline closes ${m['kiln_http_deadline_closes_total']}`);
  await good('trickled headers');
});

test('500 idle half-sent connections: /health within 1 s and a good request answered; one address capped', async () => {
  const t0 = performance.now();
  const idle = [];
  for (let a = 0; a < 10; a++) // 10 addresses × 50, each under the per-address limit
    idle.push(...await Promise.all(Array.from({ length: 50 }, () => sock(`127.0.0.${30 + a}`))));
  for (const s of idle) s.write('GET /health HTTP/1.1\r\nHost: x\r\n'); // never finished
  // one address asking for 100: the per-address limit (64) turns the rest away at once
  const greedy = await Promise.all(Array.from({ length: 100 }, () => sock('127.0.0.50').catch(() => null)));
  const opened = performance.now() - t0;
  await sleep(300);
  const refused = (await Promise.all(greedy.map((s) => (s ? Promise.race([s.gone.then(() => 1), sleep(10).then(() => 0)]) : 1)))).reduce((a, b) => a + b, 0);
  assert.ok(refused >= 36, `only ${refused} of 100 connections from one address were turned away`);
  const m = await metrics(srv);
  assert.ok(m['kiln_http_open_connections'] >= 500 + 60, `open connections ${m['kiln_http_open_connections']}`);
  const hs = [];
  for (let i = 0; i < 5; i++) hs.push(await healthMs());
  assert.ok(Math.max(...hs) < 1000, `/health took ${hs.map((x) => x.toFixed(0))} ms while 500 slow clients hold connections`);
  const t1 = performance.now();
  await good('500 idle connections (while they are held)');
  const goodMs = performance.now() - t1;
  const held = idle.filter((s) => !s.destroyed && s.readyState === 'open').length;
  assert.ok(held >= 450, `${held} idle connections still held during the checks`);
  console.log(`# ${idle.length} idle + ${100 - refused} capped connections opened in ${opened.toFixed(0)} ms; /health ${hs.map((x) => x.toFixed(1)).join('/')} ms, ` +
    `a good request ${goodMs.toFixed(0)} ms, ${refused} of 100 from one address turned away`);
  // all closed at the header deadline; the connection count comes back down
  for (const s of greedy) if (s) s.write('GET /health HTTP/1.1\r\n');
  const done = await Promise.race([Promise.all(idle.map((s) => s.gone)), sleep((HEADER_TO + 4) * 1000).then(() => null)]);
  assert.ok(done, 'idle connections closed at the header deadline');
  for (const s of greedy) if (s) s.destroy();
  await waitMetrics(srv, (x) => x['kiln_http_open_connections'] <= 2, 5000);
  await good('500 idle connections (after)');
});

test('mid-stream and mid-upload drops: requests cancelled, pages freed', async () => {
  const before = await metrics(srv);
  const drops = await Promise.all(Array.from({ length: 20 }, async (_, i) => {
    const s = await sock(`127.0.0.${60 + (i % 2)}`);
    const b = body(`Story ${i}: Once upon a time`, 300, { stream: true, ignore_eos: true });
    s.write(`POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`);
    await new Promise((res) => s.once('data', res)); // the stream has started
    await sleep(20 * (i % 5));
    s.destroy();
  }));
  assert.equal(drops.length, 20);
  // half a body, then gone
  for (let i = 0; i < 10; i++) {
    const s = await sock('127.0.0.62');
    s.write('POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{"model":"stor');
    await sleep(5);
    s.destroy();
  }
  const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0 && x['kiln_running_requests'] === 0 && x['kiln_queue_depth'] === 0, 10000);
  const cancelled = m['kiln_requests_finished_total{reason="cancelled"}'] - before['kiln_requests_finished_total{reason="cancelled"}'];
  assert.ok(cancelled >= 15, `${cancelled} of 20 dropped streams cancelled`);
  assert.ok(m['kiln_generation_tokens_total'] - before['kiln_generation_tokens_total'] < 20 * 300, 'dropped streams did not run to their end');
  await good('mid-stream drops');
});

test('after it all: 200 concurrent good requests again, RSS near its plateau', async () => {
  await concurrentGood(200);
  await good('the last round');
  await sleep(200);
  const now = rssKiB();
  console.log(`# RSS ${(now / 1024).toFixed(1)} MiB (plateau ${(plateau / 1024).toFixed(1)} MiB)`);
  assert.ok(now <= plateau * 1.25 + 16 * 1024, `RSS ${now} KiB vs plateau ${plateau} KiB`);
});
