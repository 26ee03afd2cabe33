// test_web_page.mjs — the chat page at GET / in a real browser: Debian's chromium, driven headless by
// playwright-core. A prompt typed into the page streams an answer; its text must equal the server's
// own non-streamed greedy answer to the same conversation (through the official `openai` client),
// the assistant message must have streamed (its text grew over several observations before it was
// done), and a screenshot of the message must show the text: its pixels are compared with a
// screenshot of the same element emptied, and must differ in enough places for a line of text.
// Also: Stop aborts a long answer, and a server with --api-key serves the page while its API calls
// need the key typed into the page.
import test from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import zlib from 'node:zlib';
import { chromium } from 'playwright-core';
import { startServer, client, MODEL_ID } from './lib.mjs';

const CHROMIUM = process.env.CHROMIUM || '/usr/bin/chromium';
assert.ok(fs.existsSync(CHROMIUM), `${CHROMIUM} is missing (Debian package chromium; scripts/install_deps.sh installs it)`);

// Decodes an 8-bit RGB(A) PNG (what Chromium's screenshots are) into { w, h, ch, px }.
function decodePng(buf) {
  let o = 8, w = 0, h = 0, ch = 4;
  const idat = [];
  while (o < buf.length) {
    const len = buf.readUInt32BE(o), type = buf.toString('ascii', o + 4, o + 8), data = buf.subarray(o + 8, o + 8 + len);
    if (type === 'IHDR') {
      w = data.readUInt32BE(0); h = data.readUInt32BE(4);
      assert.equal(data[8], 8, 'screenshot bit depth 8');
      ch = data[9] === 6 ? 4 : data[9] === 2 ? 3 : assert.fail(`PNG color type ${data[9]}`);
    }
    if (type === 'IDAT') idat.push(data);
    o += 12 + len;
  }
  const raw = zlib.inflateSync(Buffer.concat(idat)), stride = w * ch, px = Buffer.alloc(h * stride);
  for (let y = 0; y < h; y++) { // undo the per-row filters (PNG spec, section 9)
    const f = raw[y * (stride + 1)], row = raw.subarray(y * (stride + 1) + 1, (y + 1) * (stride + 1));
    for (let x = 0; x < stride; x++) {
      const a = x >= ch ? px[y * stride + x - ch] : 0, b = y ? px[(y - 1) * stride + x] : 0, c = x >= ch && y ? px[(y - 1) * stride + x - ch] : 0;
      let v = row[x];
      if (f === 1) v += a; else if (f === 2) v += b; else if (f === 3) v += (a + b) >> 1;
      else if (f === 4) { const p = a + b - c, pa = Math.abs(p - a), pb = Math.abs(p - b), pc = Math.abs(p - c); v += pa <= pb && pa <= pc ? a : pb <= pc ? b : c; }
      px[y * stride + x] = v & 255;
    }
  }
  return { w, h, ch, px };
}

const browser = await chromium.launch({ executablePath: CHROMIUM, headless: true, args: ['--no-sandbox', '--disable-gpu'] });
test.after(async () => { await browser.close(); });

test('the page streams a greedy answer equal to the API, and the screenshot shows it', async () => {
  const srv = await startServer();
  try {
    const page = await browser.newPage({ viewport: { width: 900, height: 700 } });
    const res = await page.goto(srv.url + '/');
    assert.equal(res.status(), 200);
    assert.match(res.headers()['content-type'], /text\/html/);
    await page.waitForFunction(() => document.getElementById('model').textContent !== '…');
    assert.equal(await page.textContent('#model'), MODEL_ID);
    await page.fill('#temperature', '0');
    await page.fill('#max_tokens', '60');
    const prompt = 'Once upon a time';
    await page.fill('#prompt', prompt);
    await page.click('#send');
    const msg = page.locator('.assistant').last();
    await page.waitForFunction(() => document.querySelector('.assistant').dataset.state !== 'streaming');
    assert.equal(await msg.getAttribute('data-state'), 'done');
    const chunks = +(await msg.getAttribute('data-chunks'));
    const text = await msg.locator('.content').textContent();
    const ref = await client(srv).chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 60 });
    assert.equal(text, ref.choices[0].message.content, 'the page shows the API answer');
    assert.ok(text.length > 20, `a real answer: ${JSON.stringify(text)}`);
    assert.ok(chunks >= 10, `the answer streamed in pieces (${chunks} content deltas shown)`);
    // the screenshot shows the text: the same box with its text removed differs in many pixels
    const shot = path.join(os.tmpdir(), `kiln_page_${process.pid}.png`);
    const full = decodePng(await msg.screenshot({ path: shot }));
    await msg.evaluate((el) => { el.querySelector('.content').style.color = 'transparent'; });
    const blank = decodePng(await msg.screenshot());
    assert.equal(full.w, blank.w);
    assert.equal(full.h, blank.h);
    let diff = 0;
    for (let i = 0; i < full.px.length; i += full.ch) if (Math.abs(full.px[i] - blank.px[i]) > 40) diff++;
    assert.ok(diff > 200, `the screenshot shows text (${diff} pixels differ from the emptied box)`);
    fs.unlinkSync(shot);
    // a second turn continues the conversation
    await page.fill('#prompt', 'And then?');
    await page.click('#send');
    await page.waitForFunction(() => document.querySelectorAll('.assistant').length === 2 && document.querySelectorAll('.assistant')[1].dataset.state !== 'streaming');
    assert.equal(await page.locator('.assistant').last().getAttribute('data-state'), 'done');
    await page.close();
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});

test('Stop aborts a long answer; with --api-key the page needs the key', async () => {
  const srv = await startServer(['--api-key', 'sekrit']);
  try {
    const page = await browser.newPage();
    await page.goto(srv.url + '/');
    await page.waitForFunction(() => document.getElementById('model').textContent !== '…');
    assert.match(await page.textContent('#model'), /API key/i, 'without the key /v1/models is refused and the page says so');
    await page.fill('#apikey', 'sekrit');
    await page.dispatchEvent('#apikey', 'change');
    await page.fill('#max_tokens', '400');
    await page.fill('#temperature', '0');
    const prompt = 'Tell a long story';
    // stories260K writes its 400 tokens in tens of milliseconds, so the whole stream can land in the
    // page's first read: the browser's network is throttled to 2 KB/s for the answer (the stream is
    // ~60 KB of SSE), so the page is still receiving when it stops
    const cdp = await page.context().newCDPSession(page);
    await cdp.send('Network.enable');
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: 2048, uploadThroughput: -1 });
    // the page clicks Stop itself at the first streamed piece (stories260K answers faster than a
    // round trip from this test could)
    await page.evaluate(() => {
      new MutationObserver((_, obs) => {
        const c = document.querySelector('.assistant .content');
        if (c && c.textContent.length > 0) { obs.disconnect(); document.getElementById('stop').click(); }
      }).observe(document.getElementById('messages'), { childList: true, subtree: true, characterData: true });
    });
    await page.fill('#prompt', prompt);
    await page.click('#send');
    const msg = page.locator('.assistant').last();
    await page.waitForFunction(() => document.querySelector('.assistant').dataset.state !== 'streaming');
    assert.equal(await msg.getAttribute('data-state'), 'done', await msg.textContent());
    assert.equal(await page.isDisabled('#send'), false);
    const partial = await msg.locator('.content').textContent();
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
    const full = await client(srv, 'sekrit').chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: prompt }], temperature: 0, max_tokens: 400 });
    assert.ok(partial.length > 0 && partial.length < full.choices[0].message.content.length,
      `Stop cut the answer short (${partial.length} of ${full.choices[0].message.content.length} characters)`);
    assert.ok(full.choices[0].message.content.startsWith(partial), 'the partial answer is a prefix of the full one');
    await page.close();
  } finally {
    assert.equal(await srv.stop(), 0);
  }
});
