// test_server_spec.mjs — speculative decoding by prompt lookup inside the server's continuous
// batching (docs/SPECULATIVE.md, "In the server"), with the official `openai` client:
//   - greedy outputs token-identical to `kiln run` (no speculation) for k = 1..4 chosen per request
//     ("speculative" in the body), sequential and under 16 concurrent clients, with presence /
//     frequency penalties, with FP8 KV, and with KV faults injected (heals during speculation);
//   - drafts are made and accepted (/metrics counters), "speculative": "off" drafts nothing, bad
//     values are refused naming the field;
//   - sampling keeps the distribution: the token at a fixed position over 400 seeds, with and without
//     speculation, compared by a two-sample chi-square test (p < 0.001 fails; the p-value from the
//     Wilson–Hilferty approximation of the chi-square distribution).
import test from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { startServer, client, metrics, raw, kilnRun, KILN, MODEL, MODEL_ID } from './lib.mjs';

const prompts = [
  'Lily and Tom went to the park. Lily and Tom',
  'Once upon a time',
  'The cat sat on the mat. The cat sat on the',
  'Tom had a red ball. Tom had a red ball. Tom had',
];

function kilnRunArgs(prompt, n, extra) {
  const r = spawnSync(KILN, ['run', MODEL, '--temp', '0', '-p', prompt, '-n', String(n), ...extra], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`kiln run failed: ${r.stderr}`);
  return r.stdout.slice(prompt.length).replace(/\n$/, '');
}

test('greedy: identical to no speculation for k = 1..4, sequential and 16 concurrent clients', async () => {
  const srv = await startServer(['--spec', 'ngram', '--spec-max-batch', '32']);
  try {
    const ai = client(srv);
    const ref = prompts.map((p) => kilnRun(p, 150).text);
    const before = await metrics(srv);
    for (let k = 1; k <= 4; k++)
      for (let i = 0; i < prompts.length; i++) {
        const r = await ai.completions.create({ model: MODEL_ID, prompt: prompts[i], max_tokens: 150, temperature: 0,
          speculative: { method: 'ngram', num_speculative_tokens: k } });
        assert.equal(r.choices[0].text, ref[i], `k = ${k}, prompt ${i}`);
      }
    const conc = await Promise.all(Array.from({ length: 16 }, (_, j) => ai.completions.create({ model: MODEL_ID, prompt: prompts[j % 4], max_tokens: 150, temperature: 0 })));
    conc.forEach((r, j) => assert.equal(r.choices[0].text, ref[j % 4], `concurrent ${j}`));
    const streamed = await ai.completions.create({ model: MODEL_ID, prompt: prompts[0], max_tokens: 150, temperature: 0, stream: true });
    let text = '';
    for await (const ev of streamed) text += ev.choices[0]?.text ?? '';
    assert.equal(text, ref[0], 'streamed');
    const m = await metrics(srv);
    const drafted = m['kiln_spec_drafted_tokens_total'] - before['kiln_spec_drafted_tokens_total'];
    const accepted = m['kiln_spec_accepted_tokens_total'] - before['kiln_spec_accepted_tokens_total'];
    const steps = m['kiln_spec_verify_steps_total'] - before['kiln_spec_verify_steps_total'];
    assert.ok(drafted > 100 && accepted > 10 && accepted <= drafted, `drafted ${drafted}, accepted ${accepted}`);
    console.log(`# ${drafted} drafted, ${accepted} accepted (${(100 * accepted / drafted).toFixed(0)}%), ${(1 + accepted / steps).toFixed(2)} tokens per verifying step`);
    // off per request: nothing drafted
    await ai.completions.create({ model: MODEL_ID, prompt: prompts[0], max_tokens: 60, temperature: 0, speculative: 'off' });
    const m2 = await metrics(srv);
    assert.equal(m2['kiln_spec_drafted_tokens_total'], m['kiln_spec_drafted_tokens_total'], '"speculative": "off" drafted');
    // bad values name the field
    for (const bad of [{ method: 'eagle' }, { method: 'ngram', num_speculative_tokens: 0 }, 7, { method: 'ngram', depth: 2 }]) {
      const r = await raw(srv, '/v1/completions', { body: JSON.stringify({ model: MODEL_ID, prompt: 'x', max_tokens: 2, speculative: bad }) });
      assert.equal(r.status, 400, JSON.stringify(bad));
      assert.equal(r.json.error.param, 'speculative', JSON.stringify(r.json));
    }
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('greedy with penalties, FP8 KV, and KV faults healed during speculation: identical to kiln run', async () => {
  const pen = ['--presence-penalty', '0.5', '--frequency-penalty', '0.3'];
  const ref = prompts.map((p) => kilnRunArgs(p, 120, pen));
  const refFp8 = prompts.map((p) => kilnRunArgs(p, 120, ['--kv-dtype', 'fp8']));
  const srv = await startServer(['--spec', 'ngram', '--spec-max-batch', '4', '--inject-kv-faults', 'bitflip=4,multibit=2,every=5']);
  const fp8 = await startServer(['--spec', 'ngram', '--spec-max-batch', '4', '--kv-dtype', 'fp8']);
  try {
    const ai = client(srv), af = client(fp8);
    const r = await Promise.all(prompts.map((p) => ai.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 120, temperature: 0, presence_penalty: 0.5, frequency_penalty: 0.3 })));
    r.forEach((x, i) => assert.equal(x.choices[0].text, ref[i], `penalties ${i}`));
    const f = await Promise.all(prompts.map((p) => af.completions.create({ model: MODEL_ID, prompt: p, max_tokens: 120, temperature: 0 })));
    f.forEach((x, i) => assert.equal(x.choices[0].text, refFp8[i], `fp8 ${i}`));
    const m = await metrics(srv);
    assert.ok(m['kiln_kv_integrity_heals_total'] > 0, 'faults healed');
    assert.ok(m['kiln_spec_accepted_tokens_total'] > 0, 'drafts accepted');
  } finally {
    assert.equal(await srv.stop(), 0);
    assert.equal(await fp8.stop(), 0);
  }
});

// P(chi-square with df degrees of freedom >= x), Wilson–Hilferty: (x/df)^(1/3) is about normal.
function chi2Sf(x, df) {
  const z = (Math.cbrt(x / df) - (1 - 2 / (9 * df))) / Math.sqrt(2 / (9 * df));
  const t = 1 / (1 + 0.2316419 * Math.abs(z)); // Abramowitz–Stegun 26.2.17 for the normal tail
  const tail = Math.exp(-z * z / 2) / Math.sqrt(2 * Math.PI) * t * (0.319381530 + t * (-0.356563782 + t * (1.781477937 + t * (-1.821255978 + t * 1.330274429))));
  return z >= 0 ? tail : 1 - tail;
}

test('sampling: the token distribution at a fixed position matches no speculation (chi-square)', async () => {
  const srv = await startServer(['--spec', 'ngram', '--spec-k', '4', '--max-batch', '8', '--spec-max-batch', '8']);
  try {
    const ai = client(srv);
    const N = 2000, pos = 6;
    const draw = async (spec) => {
      const out = [];
      for (let s = 0; s < N; s += 8) {
        const rs = await Promise.all(Array.from({ length: 8 }, (_, j) => ai.completions.create({ model: MODEL_ID, prompt: prompts[3], max_tokens: pos + 1,
          temperature: 1.0, seed: 1000 * (spec ? 1 : 2) + s + j, logprobs: 1, speculative: spec ? { method: 'ngram', num_speculative_tokens: 4 } : 'off' })));
        for (const r of rs) out.push(r.choices[0].logprobs.tokens[pos]);
      }
      return out;
    };
    const before = await metrics(srv);
    const a = await draw(true);
    const mid = await metrics(srv);
    const b = await draw(false);
    const acc = mid['kiln_spec_accepted_tokens_total'] - before['kiln_spec_accepted_tokens_total'];
    const drafted = mid['kiln_spec_drafted_tokens_total'] - before['kiln_spec_drafted_tokens_total'];
    assert.ok(acc > 50 && drafted - acc > 50, `drafts both kept and rejected (${acc} of ${drafted})`);
    // two-sample chi-square over the tokens seen, rare ones (< 10 in both together) pooled
    const count = (xs) => xs.reduce((m, t) => m.set(t, (m.get(t) || 0) + 1), new Map());
    const ca = count(a), cb = count(b);
    const cats = [...new Set([...ca.keys(), ...cb.keys()])];
    const rows = [];
    let ra = 0, rb = 0;
    for (const t of cats) {
      const x = ca.get(t) || 0, y = cb.get(t) || 0;
      if (x + y >= 10) rows.push([x, y]); else { ra += x; rb += y; }
    }
    if (ra + rb > 0) rows.push([ra, rb]);
    let stat = 0;
    for (const [x, y] of rows) {
      const ex = (x + y) / 2; // equal sample sizes
      stat += (x - ex) ** 2 / ex + (y - ex) ** 2 / ex;
    }
    const df = rows.length - 1, p = chi2Sf(stat, df);
    console.log(`# position ${pos}: ${rows.length} categories, chi-square ${stat.toFixed(2)} on ${df} df, p = ${p.toFixed(3)}; ${acc} of ${drafted} drafts kept`);
    assert.ok(df >= 2, 'too few categories to test');
    assert.ok(p > 0.001, `distributions differ: chi-square ${stat} on ${df} df, p = ${p}`);
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
