// test_server_integrity.mjs — KV integrity in the server (kv/integrity.h; heal is the default):
// with faults injected into the pool while requests run (bit flips, multi-bit flips, a block-table
// entry naming another page, a page freed under its sequence), every greedy output is still
// identical to `kiln run`, the detections and heals show in /metrics and no page stays in use;
// in strict mode the hit request fails with 500 `kv_integrity` and the server keeps serving.
import test from 'node:test';
import assert from 'node:assert/strict';
import { startServer, client, kilnRun, waitMetrics, metrics, MODEL_ID } from './lib.mjs';

const prompts = ['Once upon a time', 'Lily had a red ball. One day', 'Tom went to the park with his dog. The dog', 'The sun was hot and the bird'];

async function start(args) {
  try {
    return await startServer(args);
  } catch (e) {
    if (/unknown option '--(inject-kv-faults|kv-integrity)'/.test(e.message)) {
      console.log('SKIP: this kiln has no --inject-kv-faults / --kv-integrity options');
      process.exit(77);
    }
    throw e;
  }
}

test('heal: injected KV faults are detected and healed, outputs unchanged', async () => {
  const srv = await start(['--inject-kv-faults', 'bitflip=4,multibit=2,wrongpage=2,stale=2,every=5']);
  try {
    const ai = client(srv);
    const ref = prompts.map((p) => kilnRun(p, 100).text);
    for (let i = 0; i < prompts.length; i++) {
      const r = await ai.completions.create({ model: MODEL_ID, prompt: prompts[i], max_tokens: 100, temperature: 0 });
      assert.equal(r.choices[0].text, ref[i], `sequential ${i}`);
    }
    const conc = await Promise.all(prompts.map((p) => ai.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 100, temperature: 0 })));
    conc.forEach((r, i) => assert.equal(r.choices[0].text, ref[i], `concurrent ${i}`));
    const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0);
    assert.equal(m['kiln_kv_integrity_mode{mode="heal"}'], 1);
    assert.ok(m['kiln_kv_integrity_injected_faults_total'] >= 4, 'faults were injected');
    assert.ok(m['kiln_kv_integrity_detections_total'] > 0);
    assert.ok(m['kiln_kv_integrity_heals_total'] > 0);
    assert.equal(m['kiln_kv_integrity_strict_failures_total'], 0);
    assert.ok(m['kiln_kv_integrity_checks_total'] > 1000);
    console.log(`# heal: ${m['kiln_kv_integrity_injected_faults_total']} faults injected, ${m['kiln_kv_integrity_detections_total']} detections, ` +
      `${m['kiln_kv_integrity_heals_total']} heals (${m['kiln_kv_integrity_healed_positions_total']} positions recomputed)`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('strict: the request that meets a bad page fails with kv_integrity, the server keeps serving', async () => {
  const srv = await start(['--kv-integrity', 'strict', '--inject-kv-faults', 'bitflip=1,every=3']);
  try {
    const ai = client(srv);
    let failed = 0, ok = 0;
    for (const p of prompts) {
      try {
        await ai.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 100, temperature: 0 });
        ok++;
      } catch (e) {
        assert.equal(e.status, 500);
        assert.equal(e.code, 'kv_integrity');
        failed++;
      }
    }
    assert.equal(failed, 1, 'exactly the request hit by the one injected fault failed');
    assert.equal(ok, prompts.length - 1);
    const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0);
    assert.equal(m['kiln_kv_integrity_strict_failures_total'], 1);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('off: no checks', async () => {
  const srv = await start(['--kv-integrity', 'off']);
  try {
    await client(srv).completions.create({ model: MODEL_ID, prompt: prompts[0], max_tokens: 20, temperature: 0 });
    const m = await metrics(srv);
    assert.equal(m['kiln_kv_integrity_mode{mode="off"}'], 1);
    assert.equal(m['kiln_kv_integrity_checks_total'], 0);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
