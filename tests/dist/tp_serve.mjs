// tp_serve.mjs — `kiln serve --tp N` under mpirun (docs/SCALE.md) with the official `openai` client,
// against the same server in one process. Run by tests/dist/test_tp_serve.sh, which makes the models:
//   TP_MLA   an MLA + MoE preset (deepseek_v3 tiny) at --tp 2 and --tp 2 --ep 2: greedy outputs
//            identical to one process with FP8 KV, sequential, concurrent (continuous batching),
//            streamed, and a repeated prompt served from the prefix cache; /metrics shows the ranks
//            and each rank's expert load;
//   stories260K with KV faults injected on rank 1 only (MPMD launch): rank 1's detections make every
//            rank replay (rank 0 counts the heals without a fault of its own), outputs unchanged;
//   a hung rank (SIGSTOP) and a killed rank (SIGKILL) mid-generation: the running requests get an
//            error (500, or an error event in a stream) within --tp-timeout plus a margin, and the job
//            ends with a non-zero exit: no hang;
//   ranks started with different --kv-integrity: refused at start, naming the setting.
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, client, metrics, waitMetrics, kilnRun, KILN, MODEL, MODEL_ID, MPIRUN } from '../server/lib.mjs';

const MLA = process.env.TP_MLA;
const LONG = process.env.TP_LONG;
const ids = (k) => Array.from({ length: 6 + (k % 5) }, (_, i) => 3 + ((k * 37 + i * 11) % 200));

// The rank pids of a server started under mpirun: rank 0 prints its own; the other is mpirun's other child.
async function rankPids(srv) {
  for (let i = 0; i < 100 && !/rank 0 serves, pid \d+/.test(srv.log()); i++) await new Promise((r) => setTimeout(r, 50));
  const r0 = +srv.log().match(/rank 0 serves, pid (\d+)/)[1];
  const kids = spawnSync('pgrep', ['-P', String(srv.proc.pid)], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean).map(Number);
  return { r0, others: kids.filter((p) => p !== r0) };
}

async function completions(srv, model, stream = false) {
  const ai = client(srv);
  const out = [];
  for (let k = 0; k < 3; k++) {
    const r = await ai.completions.create({ model, prompt: ids(k), max_tokens: 24, temperature: 0 });
    out.push(r.choices[0].text);
  }
  const conc = await Promise.all([3, 4, 5, 6].map((k) => ai.completions.create({ model, prompt: ids(k), max_tokens: 24, temperature: 0 })));
  for (const r of conc) out.push(r.choices[0].text);
  if (stream) {
    const s = await ai.completions.create({ model, prompt: ids(7), max_tokens: 24, temperature: 0, stream: true });
    let text = '';
    for await (const ev of s) text += ev.choices[0]?.text ?? '';
    out.push(text);
  }
  // the same prompt again: its full pages come from the prefix cache
  const again = await ai.completions.create({ model, prompt: [...ids(0), ...ids(1), ...ids(2)], max_tokens: 8, temperature: 0 });
  const cached = await ai.completions.create({ model, prompt: [...ids(0), ...ids(1), ...ids(2)], max_tokens: 8, temperature: 0 });
  out.push(again.choices[0].text, cached.choices[0].text);
  return { out, cachedTokens: cached.usage.prompt_tokens_details?.cached_tokens ?? 0 };
}

test('MLA + MoE, FP8 KV: the same outputs under --tp 2 and --tp 2 --ep 2 as in one process', { skip: !MLA && 'TP_MLA not set' }, async () => {
  const args = ['--kv-dtype', 'fp8', '--kv-page', '4'];
  const one = await startServer(args, { model: MLA, tp: 1 });
  const ref = await completions(one, 'mla', true).finally(() => one.stop());
  for (const ep of [[], ['--ep', '2']]) {
    const tp = await startServer([...args, ...ep], { model: MLA, tp: 2 });
    try {
      const got = await completions(tp, 'mla', true);
      assert.deepEqual(got.out, ref.out);
      assert.ok(got.cachedTokens > 0 && got.cachedTokens === ref.cachedTokens, `prefix cache under --tp: ${got.cachedTokens} vs ${ref.cachedTokens}`);
      const m = await metrics(tp);
      assert.equal(m['kiln_tensor_parallel_ranks'], 2);
      let load = '';
      if (ep.length) { // every rank's experts got pairs; 4 pairs per token (num_experts_per_tok)
        const r0 = m['kiln_expert_parallel_routed_total{rank="0"}'], r1 = m['kiln_expert_parallel_routed_total{rank="1"}'];
        assert.ok(r0 > 0 && r1 > 0, `expert load per rank ${r0} / ${r1}`);
        assert.equal((r0 + r1) % 4, 0);
        load = `, experts' load per rank ${r0} / ${r1} pairs`;
      } else assert.equal(m['kiln_expert_parallel_routed_total{rank="0"}'], undefined);
      console.log(`# --tp 2 ${ep.join(' ')}: ${got.out.length} completions identical, ${got.cachedTokens} prompt tokens from the prefix cache${load}`);
    } finally {
      assert.equal(await tp.stop(), 0);
    }
  }
});

test('KV faults on rank 1 only: every rank replays, outputs unchanged', async () => {
  const serve = (extra) => [KILN, 'serve', MODEL, '--host', '127.0.0.1', '--port', '0', '--tp', '2', ...extra];
  const launch = [...MPIRUN, '-np', '1', ...serve([]), ':', '-np', '1', ...serve(['--inject-kv-faults', 'bitflip=4,multibit=2,every=4'])];
  const srv = await startServer([], { launch });
  try {
    const prompts = ['Once upon a time', 'Lily had a red ball. One day', 'Tom went to the park with his dog. The dog'];
    const ref = prompts.map((p) => kilnRun(p, 80).text);
    const ai = client(srv);
    const conc = await Promise.all(prompts.map((p) => ai.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 80, temperature: 0 })));
    conc.forEach((r, i) => assert.equal(r.choices[0].text, ref[i], `prompt ${i}`));
    const m = await waitMetrics(srv, (x) => x['kiln_kv_pages_used'] === 0);
    assert.equal(m['kiln_kv_integrity_injected_faults_total'], 0, 'rank 0 injected nothing');
    assert.ok(m['kiln_kv_integrity_heals_total'] > 0, 'rank 0 replayed for rank 1');
    console.log(`# rank 1's faults: rank 0 healed ${m['kiln_kv_integrity_heals_total']} times (${m['kiln_kv_integrity_healed_positions_total']} positions), outputs unchanged`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

for (const [how, sig] of [['hung', 'SIGSTOP'], ['killed', 'SIGKILL']]) {
  test(`a ${how} rank mid-generation: the requests fail within the deadline, the job ends non-zero`, { skip: !LONG && 'TP_LONG not set' }, async () => {
    const srv = await startServer(['--tp-timeout', '2'], { model: LONG, tp: 2 });
    const { others } = await rankPids(srv);
    assert.equal(others.length, 1, 'one other rank');
    const ai = client(srv);
    const plain = ai.completions.create({ model: 'long', prompt: [1, 2, 3], max_tokens: 3000, temperature: 0 }).then(() => null, (e) => e);
    const streamed = (async () => {
      try {
        const s = await ai.completions.create({ model: 'long', prompt: [1, 2, 4], max_tokens: 3000, temperature: 0, stream: true });
        for await (const ev of s) void ev;
        return null;
      } catch (e) { return e; }
    })();
    await waitMetrics(srv, (x) => x['kiln_generation_tokens_total'] >= 8, 20000);
    const t0 = Date.now();
    process.kill(others[0], sig);
    const [e1, e2] = await Promise.all([plain, streamed]);
    const dt = (Date.now() - t0) / 1000;
    assert.ok(e1 && e1.status === 500 && /tensor parallel: .*within 2 s/.test(e1.message), `plain: ${e1}`);
    assert.ok(e2 && /tensor parallel/.test(String(e2.message ?? e2)), `stream: ${e2}`);
    assert.ok(dt < 10, `errors after ${dt} s`);
    const code = await new Promise((res) => { if (srv.proc.exitCode !== null) res(srv.proc.exitCode); else srv.proc.once('exit', (c) => res(c)); });
    const total = (Date.now() - t0) / 1000;
    assert.notEqual(code, 0, 'mpirun exit status');
    assert.ok(total < 20, `job ended after ${total} s`);
    console.log(`# ${how} rank: both requests failed ${dt.toFixed(1)} s after the signal, job ended (${code}) after ${total.toFixed(1)} s`);
  });
}

test('ranks started with different --kv-integrity are refused', async () => {
  const serve = (extra) => [KILN, 'serve', MODEL, '--port', '0', '--tp', '2', ...extra];
  const launch = [...MPIRUN, '-np', '1', ...serve([]), ':', '-np', '1', ...serve(['--kv-integrity', 'off'])];
  const r = spawnSync(launch[0], launch.slice(1), { encoding: 'utf8', timeout: 60000 });
  assert.notEqual(r.status, 0);
  assert.match(r.stderr, /rank 1 was started with --kv-integrity 'off' but rank 0 with 'default'/);
});
