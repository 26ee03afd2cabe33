// lib.mjs — helpers shared by the server tests (tests/server/test_*.mjs): start `kiln serve` on a
// free loopback port and stop it, read /metrics, run `kiln run` for reference outputs.
// Environment: KILN (the binary), SHARED (shared data; models/stories260K), KILN_SERVE_DEVICE (a
// --device for every server started here: test_server_vulkan.sh runs suites with `vulkan`),
// KILN_SERVE_TP (N: every server runs as `mpirun -np N kiln serve ... --tp N`, tests/dist/test_tp_serve.sh;
// Open MPI's orte_abort_on_non_zero_status off, so that a lost rank is kiln's to report, docs/SCALE.md).
import { spawn, spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import OpenAI from 'openai';

export const KILN = process.env.KILN || path.resolve('kiln');
export const SHARED = process.env.SHARED || path.resolve('..', 'shared');
export const MODEL = path.join(SHARED, 'models', 'stories260K');
export const MODEL_ID = 'stories260K';

const live = new Set();
process.on('exit', () => { for (const p of live) p.kill('SIGKILL'); });

// Starts the server with extra arguments; resolves to { url, base, port, proc, stop() }.
// { tp: N } (or KILN_SERVE_TP) starts it under mpirun with --tp N; { launch: [argv] } runs that
// command line instead (MPMD launches in tests/dist/tp_serve.mjs).
export const MPIRUN = ['mpirun', '--oversubscribe', '--allow-run-as-root', '--mca', 'orte_abort_on_non_zero_status', '0', '-x', 'OMP_NUM_THREADS=1'];
export function startServer(args = [], { model = MODEL, tp = +(process.env.KILN_SERVE_TP || 1), launch = null } = {}) {
  return new Promise((resolve, reject) => {
    const dev = process.env.KILN_SERVE_DEVICE ? ['--device', process.env.KILN_SERVE_DEVICE] : [];
    const serve = [KILN, 'serve', model, '--host', '127.0.0.1', '--port', '0', ...dev, ...args];
    const cmd = launch || (tp > 1 ? [...MPIRUN, '-np', String(tp), ...serve, '--tp', String(tp)] : serve);
    const proc = spawn(cmd[0], cmd.slice(1), { stdio: ['ignore', 'ignore', 'pipe'] });
    live.add(proc);
    let log = '';
    const timer = setTimeout(() => { proc.kill('SIGKILL'); reject(new Error('server did not start:\n' + log)); }, 20000);
    proc.stderr.on('data', (d) => {
      log += d.toString();
      const m = log.match(/listening on http:\/\/([\d.]+):(\d+)/);
      if (m && !proc.started) {
        proc.started = true;
        clearTimeout(timer);
        const url = `http://127.0.0.1:${m[2]}`;
        resolve({
          url, base: `${url}/v1`, port: +m[2], proc, log: () => log,
          stop: (signal = 'SIGTERM') => new Promise((res) => {
            if (proc.exitCode !== null) { live.delete(proc); return res(proc.exitCode); }
            proc.once('exit', (code, sig) => { live.delete(proc); res(code ?? sig); });
            // under mpirun the signal goes to rank 0, as a supervisor's would reach a lone server
            // (mpirun exits 1 whenever it is signalled itself, however the ranks end)
            const r0 = log.match(/rank 0 serves, pid (\d+)/);
            if (r0) process.kill(+r0[1], signal); else proc.kill(signal);
          }),
        });
      }
    });
    proc.once('exit', (code) => { clearTimeout(timer); if (!proc.started) reject(new Error(`server exited (${code}):\n${log}`)); });
  });
}

export function client(srv, apiKey = 'none', opts = {}) {
  return new OpenAI({ baseURL: srv.base, apiKey, maxRetries: 0, timeout: 60000, ...opts });
}

// /metrics as { 'name{labels}': number }.
// A network error (not an HTTP status) is retried twice: fetch reuses its keep-alive connections,
// and one the server closed for idleness at the moment it is reused fails without the request ever
// reaching the server (seen once in the abuse tests, after seconds of trickling clients).
export async function metrics(srv) {
  let txt;
  for (let k = 0; ; k++) {
    try {
      txt = await (await fetch(`${srv.url}/metrics`)).text();
      break;
    } catch (e) {
      if (k >= 2 || !(e instanceof TypeError)) throw e;
    }
  }
  const out = {};
  for (const line of txt.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    out[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return out;
}

// Polls /metrics until pred(m) holds (or throws after ms).
export async function waitMetrics(srv, pred, ms = 5000) {
  const t0 = Date.now();
  let m;
  while (Date.now() - t0 < ms) {
    m = await metrics(srv);
    if (pred(m)) return m;
    await new Promise((r) => setTimeout(r, 20));
  }
  throw new Error('metrics condition not reached: ' + JSON.stringify(m));
}

// `kiln run MODEL --temp 0 -p PROMPT -n N`: the generated text (kiln run echoes the prompt first and
// ends with a newline) and the prompt token count from its summary line.
export function kilnRun(prompt, n, model = MODEL) {
  const r = spawnSync(KILN, ['run', model, '--temp', '0', '-p', prompt, '-n', String(n)], { encoding: 'utf8' });
  if (r.status !== 0) throw new Error(`kiln run failed: ${r.stderr}`);
  if (!r.stdout.startsWith(prompt)) throw new Error(`kiln run did not echo the prompt: ${JSON.stringify(r.stdout.slice(0, 80))}`);
  const m = r.stderr.match(/prompt: (\d+) tokens/);
  return { text: r.stdout.slice(prompt.length).replace(/\n$/, ''), promptTokens: m ? +m[1] : -1 };
}

// Raw HTTP request (for what the official client refuses to send).
export async function raw(srv, pathname, { method = 'POST', body, headers = {} } = {}) {
  const res = await fetch(srv.url + pathname, { method, body, headers: { 'content-type': 'application/json', ...headers } });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, headers: res.headers, text, json };
}

// A random-weight llama (kiln mkmodel) with a real tokenizer's files (tokenizer.json and
// tokenizer_config.json from tokDir) and, when given, a chat template file as chat_template.jinja:
// the server tests' models that read and write a family's real formats.
export function makeTokenizerModel(dir, name, tokDir, template = null, vocab = 129280) {
  const m = path.join(dir, name);
  const mk = spawnSync(KILN, ['mkmodel', '--arch', 'llama', '--dim', '32', '--ffn', '64', '--layers', '1', '--heads', '2', '--kv-heads', '1',
    '--vocab', String(vocab), '--seq', '2048', m], { encoding: 'utf8' });
  if (mk.status !== 0) throw new Error('kiln mkmodel failed: ' + mk.stderr);
  for (const f of ['tokenizer.json', 'tokenizer_config.json']) fs.copyFileSync(path.join(tokDir, f), path.join(m, f));
  if (template) fs.copyFileSync(template, path.join(m, 'chat_template.jinja'));
  return m;
}

// The tiny GLM-4.6-templated model of the tool-calling API suites (anthropic, responses): the
// DeepSeek-V3 tokenizer's files and glm-4.6.jinja from $SHARED in a fresh temporary directory
// (prefix), or the suite is skipped (exit 77) where $SHARED lacks them. Returns { dir, model }.
export function glmTemplatedModel(prefix) {
  const tok = path.join(SHARED, 'tokenizers', 'deepseek-v3');
  const tpl = path.join(SHARED, 'tokenizers', 'templates', 'glm-4.6.jinja');
  if (!fs.existsSync(path.join(tok, 'tokenizer.json')) || !fs.existsSync(tpl)) {
    console.log('SKIP: no $SHARED/tokenizers/deepseek-v3 or templates');
    process.exit(77);
  }
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), prefix));
  return { dir, model: makeTokenizerModel(dir, 'glm', tok, tpl) };
}
