// SPDX-License-Identifier: Apache-2.0
'use strict';
/*
 * test_console.js — the operator console in a real browser: headless
 * Chromium driven over the DevTools protocol (on a pipe: Node's built-ins
 * only), against idem serve on the embedded store with the example refund
 * service behind it.
 *
 *   node test_console.js IDEM REFUND_SERVICE CHROMIUM OUTDIR REDIS_URL
 *
 * It signs in (a wrong key first), watches the counters move, searches for
 * a key with "/" and Enter, opens it, releases a held claim through the
 * confirmation dialog and checks that a retry then executes exactly once;
 * a key holding <script> and a stored HTML body show as text (no element
 * injected, no dialog raised); a consumer's dead letter is redriven
 * through its confirmation; a read key sees no enabled action; the
 * console is never served on the main listener. OUTDIR/console.png is the
 * screenshot kept as the test's artifact.
 */
const assert = require('node:assert/strict');
const { execFileSync, spawn } = require('node:child_process');
const fs = require('node:fs');
const http = require('node:http');
const os = require('node:os');
const path = require('node:path');

const [idemBin, serviceBin, chromiumBin, outDir, redisUrl, pgUrl] = process.argv.slice(2);
if (!redisUrl) {
  console.error('usage: node test_console.js IDEM REFUND_SERVICE CHROMIUM OUTDIR REDIS_URL');
  process.exit(2);
}

const WRITE_KEY = 'console-write-key-0123456789abcdef';
const READ_KEY = 'console-read-key-0123456789abcdef';
const XSS_KEY = '<script>alert(1)</script>';
const HTML_KEY = '<img src=x onerror=alert(2)>';
const HTML_BODY = '<b id="injected">bold</b><script>alert(3)</script>';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idem-console-'));
const children = [];

function sleep(ms) {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/* A program started, its stdout read until a line matches re: the match,
 * with the process as m.proc. */
function start(bin, args, env, re, logName) {
  return new Promise((resolve, reject) => {
    const log = fs.openSync(path.join(dir, logName), 'w');
    const p = spawn(bin, args, { env: Object.assign({}, process.env, env),
      stdio: ['ignore', 'pipe', log] });
    children.push(p);
    let out = '';
    const timer = setTimeout(() => reject(new Error(bin + ' did not start: ' + out)), 20000);
    p.stdout.on('data', (b) => {
      out += b;
      fs.writeSync(log, b);
      const m = re.exec(out);
      if (m) {
        clearTimeout(timer);
        m.proc = p;
        resolve(m);
      }
    });
    p.on('exit', (code) => reject(new Error(bin + ' exited ' + code + ': ' + out)));
  });
}

/* An HTTP request: {status, headers, body}. */
function request(port, method, target, headers, body) {
  return new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port, method, path: target, headers,
      agent: false }, (res) => {
      let data = '';
      res.setEncoding('utf8');
      res.on('data', (c) => (data += c));
      res.on('end', () => resolve({ status: res.statusCode, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    req.setTimeout(15000, () => req.destroy(new Error(method + ' ' + target + ': timed out')));
    req.end(body);
  });
}

function refund(port, no, extra) {
  return request(port, 'POST', '/refunds',
    Object.assign({ 'Content-Type': 'application/json' }, extra || {}),
    JSON.stringify({ refund_no: no, amount: '1.00' }));
}

function admin(port, method, target, body, key) {
  return request(port, method, target, { Authorization: 'Bearer ' + (key || WRITE_KEY),
    'Content-Type': 'application/json' }, body === undefined ? undefined : JSON.stringify(body));
}

/* ---- the DevTools protocol, on Chromium's pipe (fd 3 in, fd 4 out) ---- */

class Browser {
  constructor(bin, profile) {
    this.proc = spawn(bin, ['--headless=new', '--remote-debugging-pipe', '--no-sandbox',
      '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run', '--no-default-browser-check',
      '--disable-background-networking', '--disable-extensions', '--user-data-dir=' + profile,
      '--window-size=1280,1000', 'about:blank'],
    { stdio: ['ignore', 'ignore', fs.openSync(path.join(dir, 'chromium.log'), 'w'),
      'pipe', 'pipe'] });
    children.push(this.proc);
    this.out = this.proc.stdio[3];
    this.seq = 0;
    this.pending = new Map();
    this.listeners = [];
    let buf = Buffer.alloc(0);
    this.proc.stdio[4].on('data', (chunk) => {
      buf = Buffer.concat([buf, chunk]);
      let nul;
      while ((nul = buf.indexOf(0)) >= 0) {
        const msg = JSON.parse(buf.subarray(0, nul).toString('utf8'));
        buf = buf.subarray(nul + 1);
        if (msg.id && this.pending.has(msg.id)) {
          const { resolve, reject, method } = this.pending.get(msg.id);
          this.pending.delete(msg.id);
          if (msg.error) reject(new Error(method + ': ' + JSON.stringify(msg.error)));
          else resolve(msg.result);
        } else if (msg.method) {
          for (const l of this.listeners) l(msg);
        }
      }
    });
  }

  send(method, params, sessionId) {
    const id = ++this.seq;
    const msg = { id, method, params: params || {} };
    if (sessionId) msg.sessionId = sessionId;
    return new Promise((resolve, reject) => {
      this.pending.set(id, { resolve, reject, method });
      this.out.write(JSON.stringify(msg) + '\0');
    });
  }
}

class Page {
  constructor(browser, sessionId) {
    this.b = browser;
    this.s = sessionId;
    this.dialogs = [];
    this.cspViolations = [];
    this.exceptions = [];
    browser.listeners.push((msg) => {
      if (msg.sessionId !== this.s) return;
      if (msg.method === 'Page.javascriptDialogOpening') {
        this.dialogs.push(msg.params.message);
        this.send('Page.handleJavaScriptDialog', { accept: true }).catch(() => {});
      } else if (msg.method === 'Runtime.exceptionThrown') {
        this.exceptions.push(JSON.stringify(msg.params.exceptionDetails));
      } else if (msg.method === 'Log.entryAdded' || msg.method === 'Runtime.consoleAPICalled') {
        const text = msg.params.entry ? msg.params.entry.text
          : msg.params.args.map((a) => a.value).join(' ');
        if (/Content Security Policy/i.test(text)) this.cspViolations.push(text);
      }
    });
  }

  send(method, params) {
    return this.b.send(method, params, this.s);
  }

  /* The value of expression in the page (awaited when a promise). */
  async eval(expression) {
    const r = await this.send('Runtime.evaluate', { expression, awaitPromise: true,
      returnByValue: true });
    if (r.exceptionDetails)
      throw new Error('in the page: ' + expression + ': ' + JSON.stringify(r.exceptionDetails));
    return r.result.value;
  }

  /* Until expression is truthy in the page: its value. */
  async waitFor(expression, what, timeoutMs) {
    const end = Date.now() + (timeoutMs || 15000);
    for (;;) {
      const v = await this.eval(expression);
      if (v) return v;
      if (Date.now() > end) throw new Error('timed out waiting for ' + what);
      await sleep(100);
    }
  }

  async key(key, code, keyCode, text) {
    await this.send('Input.dispatchKeyEvent', { type: 'keyDown', key, code,
      windowsVirtualKeyCode: keyCode, text });
    await this.send('Input.dispatchKeyEvent', { type: 'keyUp', key, code,
      windowsVirtualKeyCode: keyCode });
  }

  type(text) {
    return this.send('Input.insertText', { text });
  }
}

/* ---- the test ---- */

async function main() {
  const [, servicePort] = await start(serviceBin, ['--listen', '127.0.0.1:0', '--db', ':memory:'],
    {}, /listening on [^\n]*:(\d+)\n/, 'refund_service.log');
  const readKeyFile = path.join(dir, 'read.key');
  fs.writeFileSync(readKeyFile, READ_KEY + '\n', { mode: 0o400 });
  const config = path.join(dir, 'idem.yaml');
  const stream = 'idem-console-' + process.pid;
  fs.writeFileSync(config, [
    'admin_listen: 127.0.0.1:0',
    'api_keys:',
    '  - { name: console-ops, scope: write, env: IDEM_CONSOLE_WRITE_KEY }',
    '  - { name: console-viewer, scope: read, file: ' + readKeyFile + ' }',
    'routes:',
    '  - name: refund',
    '    match: { method: POST, path: /refunds }',
    '    upstream: http://127.0.0.1:' + servicePort,
    '    key: { json: refund_no }',
    '    space: refund',
    '    fingerprint: [refund_no, amount]',
    '    upstream_timeout: 400ms',
    '    lease: 1s',
    '    on_unknown_outcome: hold',
    '    retention: 7d',
    '  - name: refund-status',
    '    match: { method: POST, path: /orders/*/refunds }',
    '    upstream: http://127.0.0.1:' + servicePort,
    '    key: { json: refund_no }',
    '    states:',
    '      field: { json: status }',
    '      initial: CREATED',
    '      transitions: { CREATED: [SUCCESS], SUCCESS: [REFUNDED_BACK] }',
    'consumers:',
    '  - name: refund-mq',
    '    source: { redis_stream: "' + redisUrl + '", stream: ' + stream + ', group: idem }',
    '    key: { json: refund_no }',
    '    handler: http://127.0.0.1:' + servicePort + '/refunds',
    '',
  ].join('\n'));
  const m = await start(idemBin, ['serve', '-c', config, '--db', path.join(dir, 'records.db'),
    '--listen', '127.0.0.1:0'], { IDEM_CONSOLE_WRITE_KEY: WRITE_KEY },
  /listening on [^\n]*:(\d+), JSON API on [^\n]*:(\d+),/, 'idem.log');
  const port = Number(m[1]), adminPort = Number(m[2]);
  const executions = async () =>
    JSON.parse((await request(servicePort, 'GET', '/stats')).body).executions;

  /* The console is the admin listener's alone, with its strict headers. */
  const main = await request(port, 'GET', '/');
  assert.notEqual(main.status, 200, 'GET / on the main listener');
  assert.ok(!main.body.includes('Idem console'), 'the console on the main listener');
  assert.equal(main.headers['content-security-policy'], undefined);
  for (const p of ['/console.js', '/console.css', '/console'])
    assert.notEqual((await request(port, 'GET', p)).status, 200, p + ' on the main listener');
  const page = await request(adminPort, 'GET', '/');
  assert.equal(page.status, 200);
  assert.match(page.body, /<title>Idem console<\/title>/);
  assert.match(page.headers['content-type'], /^text\/html/);
  assert.match(page.headers['content-security-policy'], /default-src 'none'/);
  assert.match(page.headers['content-security-policy'], /script-src 'self'/);
  assert.match(page.headers['content-security-policy'], /frame-ancestors 'none'/);
  assert.equal(page.headers['x-frame-options'], 'DENY');
  assert.equal(page.headers['x-content-type-options'], 'nosniff');
  assert.equal(page.headers['referrer-policy'], 'no-referrer');
  assert.equal(page.headers['cache-control'], 'no-store');
  assert.ok(!/<script>[^<]/.test(page.body), 'no inline script in the page');
  const js = await request(adminPort, 'GET', '/console.js');
  assert.match(js.headers['content-type'], /^text\/javascript/);
  assert.equal((await request(adminPort, 'GET', '/_idem/v1/whoami')).status, 401);
  assert.equal((await request(adminPort, 'POST', '/')).status, 401, 'POST / passes the door');
  const who = JSON.parse((await admin(adminPort, 'GET', '/_idem/v1/whoami', undefined,
    READ_KEY)).body);
  assert.deepEqual(who, { name: 'console-viewer', scope: 'read', write: false });
  assert.deepEqual(JSON.parse((await admin(adminPort, 'GET', '/_idem/v1/whoami')).body),
    { name: 'console-ops', scope: 'write', write: true });
  assert.equal((await admin(adminPort, 'POST', '/_idem/v1/whoami', {})).status, 405);
  assert.deepEqual(JSON.parse((await admin(adminPort, 'GET', '/_idem/v1/spaces', undefined,
    READ_KEY)).body), { spaces: [{ space: 'refund', routes: ['refund'], consumers: [],
    holds: true }, { space: 'refund-status', routes: ['refund-status'], consumers: [],
    holds: false }, { space: 'refund-mq', routes: [], consumers: ['refund-mq'],
    holds: false }] });
  assert.equal((await request(port, 'GET', '/_idem/v1/whoami')).status, 404,
    'whoami on the main listener');

  /* Two held claims: an answer slower than upstream_timeout, with the
   * upstream's own (unknown to idem) execution landing after it. */
  for (const no of ['H-1', 'H-2'])
    assert.equal((await refund(port, no, { 'X-Delay-Ms': '1200' })).status, 504);
  /* A key holding markup, stored as the gateway stores any answer. */
  assert.equal((await refund(port, XSS_KEY)).status, 201);
  /* As the gateway keys it (a '/' in a key's part is percent-encoded). */
  const listed = JSON.parse((await admin(adminPort, 'GET',
    '/_idem/v1/records?space=refund&prefix=' + encodeURIComponent('<script>'))).body);
  assert.equal(listed.records.length, 1);
  const xssKey = listed.records[0].key;
  assert.ok(xssKey.startsWith('<script>alert(1)<'), xssKey);
  /* And an event on it: the key reused with another amount. */
  assert.equal((await request(port, 'POST', '/refunds', { 'Content-Type': 'application/json' },
    JSON.stringify({ refund_no: XSS_KEY, amount: '2.00' }))).status, 422);
  /* A stored answer whose body is HTML, written through the JSON API. */
  const begun = JSON.parse((await admin(adminPort, 'POST', '/_idem/v1/records/begin',
    { space: 'refund', key: HTML_KEY, owner: '<u>owner</u>', lease_ms: 60000 })).body);
  const stored = 'IDEM1 200 2 ' + Buffer.byteLength(HTML_BODY) +
    '\nContent-Type: text/html\nX-Note: <i>note</i>\n' + HTML_BODY;
  assert.equal((await admin(adminPort, 'POST', '/_idem/v1/records/complete',
    { space: 'refund', key: HTML_KEY, epoch: begun.record.epoch, result: stored })).status, 200);
  await sleep(1500);
  const epochOf = async (key) => JSON.parse((await admin(adminPort, 'GET',
    '/_idem/v1/records/refund/' + encodeURIComponent(key))).body).record.epoch;
  const heldEpoch = await epochOf('H-1');

  const profile = path.join(dir, 'profile');
  fs.mkdirSync(profile);
  const browser = new Browser(chromiumBin, profile);
  const { targetInfos } = await browser.send('Target.getTargets');
  const target = targetInfos.find((t) => t.type === 'page');
  const { sessionId } = await browser.send('Target.attachToTarget',
    { targetId: target.targetId, flatten: true });
  const p = new Page(browser, sessionId);
  await p.send('Page.enable');
  await p.send('Runtime.enable');
  await p.send('Log.enable');
  await p.send('Page.navigate', { url: 'http://127.0.0.1:' + adminPort + '/' });
  await p.waitFor("document.readyState === 'complete' && " +
    "document.activeElement && document.activeElement.id === 'api-key'",
  'the sign-in form, focused');

  /* A wrong key is said to be one, plainly. */
  await p.type('not-a-key-of-this-daemon');
  await p.key('Enter', 'Enter', 13, '\r');
  const refusal = await p.waitFor("document.getElementById('sign-in-error').textContent",
    'the refusal of a wrong key');
  assert.match(refusal, /not accepted.*401/);
  assert.equal(await p.eval("sessionStorage.getItem('idem.console.key')"), null);

  /* The write key: signed in, kept for this tab only. */
  await p.eval("document.getElementById('api-key').value = " + JSON.stringify(WRITE_KEY));
  await p.key('Enter', 'Enter', 13, '\r');
  await p.waitFor("!document.getElementById('app').hidden", 'the signed-in console');
  assert.match(await p.eval("document.getElementById('who-text').textContent"),
    /console-ops \(write key/);
  assert.equal(await p.eval("sessionStorage.getItem('idem.console.key')"), WRITE_KEY);
  assert.equal(await p.eval("localStorage.length"), 0);
  assert.equal(await p.eval("document.cookie"), '');

  /* The overview moves: one more execution shows within a few polls, in
   * the route's row of the last minute's figures. */
  const figure = (route, name) => "(() => { const c = document.querySelector(" +
    "'#routes tr[data-route=\"" + route + "\"] [data-figure=\"" + name + "\"]'); " +
    'return c ? c.textContent : null; })()';
  const counter = 'Number(' + figure('refund', 'executions') + ' ?? -1)';
  const before = await p.waitFor(counter + ' >= 3 && ' + counter, 'the executions figure');
  assert.equal((await refund(port, 'C-1')).status, 201);
  await p.waitFor(counter + ' === ' + (before + 1), 'the executions figure to move');
  /* The two held claims' upstream calls timed out: two 504s, the route
   * first and marked, with its latencies. */
  await p.waitFor("document.querySelector('#routes tr').dataset.route === 'refund'",
    'the route with 5xx answers first');
  assert.match(await p.eval(figure('refund', 'errors')), /^2 \(\d+(\.\d)? %\)$/);
  assert.equal(await p.eval("document.querySelector('#routes tr[data-route=\"refund\"]')" +
    '.className'), 'bad');
  assert.match(await p.eval(figure('refund', 'p99')), /^\d+(\.\d)? (ms|s)$/);
  assert.equal(await p.eval(figure('refund-mq', 'route')), 'refund-mq (consumer)');

  /* "/" goes to the search; Enter searches; the key opens. */
  await p.eval('document.activeElement.blur()');
  await p.key('/', 'Slash', 191, '/');
  await p.waitFor("document.activeElement.id === 'prefix'", '"/" to focus the search');
  await p.type('H-1');
  await p.key('Enter', 'Enter', 13, '\r');
  await p.waitFor("document.querySelector('#records [data-open=\"H-1\"]')", 'H-1 found');
  assert.equal(await p.eval("document.querySelectorAll('#records tr').length"), 1);
  await p.eval("document.querySelector('#records [data-open=\"H-1\"]').focus()");
  await p.key('Enter', 'Enter', 13, '\r');
  await p.waitFor("document.getElementById('detail').open", 'the detail of H-1');
  const fields = await p.eval("document.getElementById('detail-fields').textContent");
  assert.match(fields, /StatePROCESSING/);
  assert.match(fields, /KeyH-1/);
  assert.ok(fields.includes('Epoch' + heldEpoch + 'Owner'), fields);
  await p.key('Escape', 'Escape', 27);
  await p.waitFor("!document.getElementById('detail').open", 'Esc to close the detail');

  /* Keys "." and "..", which a browser would resolve out of a path: they
   * open, and their detail names them. */
  for (const key of ['.', '..']) {
    const made = await admin(adminPort, 'POST', '/_idem/v1/records/begin',
      { space: 'refund', key, owner: 'dots', lease_ms: 60000 });
    assert.equal(made.status, 200, key + ': ' + made.body);
    await p.eval('openRecord(' + JSON.stringify('refund') + ', ' + JSON.stringify(key) + ')');
    await p.waitFor("document.getElementById('detail').open && " +
      "document.getElementById('detail-fields').textContent.includes('Owner' + 'dots')",
      'the detail of ' + key);
    assert.ok((await p.eval("document.getElementById('detail-fields').textContent"))
      .includes('Key' + key + 'State'), key);
    await p.key('Escape', 'Escape', 27);
    await p.waitFor("!document.getElementById('detail').open", 'Esc to close the detail');
  }

  /* A key with states: the detail says how it got where it is. */
  for (const status of ['SUCCESS', 'REFUNDED_BACK'])
    assert.equal((await request(port, 'POST', '/orders/O-9/refunds',
      { 'Content-Type': 'application/json' },
      JSON.stringify({ refund_no: 'RS-1', amount: '1.00', status }))).status, 200, status);
  await p.eval("openRecord('refund-status', 'RS-1')");
  await p.waitFor("document.getElementById('detail').open && " +
    "document.getElementById('detail-fields').textContent.includes('Moves')", 'the moves of RS-1');
  const moves = await p.eval("document.getElementById('detail-fields').textContent");
  assert.match(moves, /Statestate:REFUNDED_BACK/);
  assert.match(moves, /MovesSUCCESS at .+ \(epoch \d+\) → REFUNDED_BACK at .+ \(epoch \d+\)/);
  await p.key('Escape', 'Escape', 27);
  await p.waitFor("!document.getElementById('detail').open", 'Esc to close the detail');

  /* The held claim released through its confirmation: a retry executes,
   * once. Cancelling first changes nothing. */
  await p.eval("document.querySelector('nav [data-view=\"claims\"]').click()");
  const release = "document.querySelector('#held tr:has([data-open=\"H-1\"]) " +
    "[data-action=\"release\"]')";
  await p.waitFor(release, 'H-1 among the held claims');
  assert.match(await p.eval("document.querySelector('#held tr:has([data-open=\"H-1\"])')" +
    '.textContent'), /no answer within 400 ms/, 'the held row says why');
  await p.eval(release + '.click()');
  await p.waitFor("document.getElementById('confirm').open", 'the confirmation');
  assert.match(await p.eval("document.getElementById('confirm-text').textContent"),
    new RegExp('H-1 .*epoch ' + heldEpoch + '\\)'));
  await p.key('Escape', 'Escape', 27);
  await p.waitFor("!document.getElementById('confirm').open", 'Esc to cancel');
  assert.equal((await refund(port, 'H-1')).status, 409, 'still held after a cancel');
  await p.eval(release + '.click()');
  await p.waitFor("document.getElementById('confirm').open", 'the confirmation');
  await p.eval("document.getElementById('confirm-ok').click()");
  await p.waitFor("/Release H-1: RELEASED/.test(document.getElementById('status').textContent)",
    'the release to be done');
  await p.waitFor("!document.querySelector('#held [data-open=\"H-1\"]')",
    'H-1 gone from the held claims');
  const ran = await executions();
  await Promise.all([1, 2, 3, 4].map(() => refund(port, 'H-1')));
  assert.equal(await executions(), ran + 1, 'the retries executed once');
  assert.ok([200, 201, 409].includes((await refund(port, 'H-1')).status));
  assert.equal(await executions(), ran + 1, 'a later retry is a replay');
  /* The 409s of the held claim show in the overview: the one after the
   * cancel for certain; the four retries above may or may not have met
   * each other in flight. With the 422 of the reused key, as the metrics
   * count them (all within the last minute). */
  const metricsText = (await admin(adminPort, 'GET', '/_idem/v1/metrics')).body;
  const outcome = (o) => Number(new RegExp('^idem_requests_total\\{route="refund",outcome="' +
    o + '"\\} (\\d+)$', 'm').exec(metricsText)[1]);
  assert.ok(outcome('in_flight') >= 1, 'in-flight rejections: ' + outcome('in_flight'));
  const conflicts = ['in_flight', 'mismatch', 'token_refused', 'conflict']
    .reduce((sum, o) => sum + outcome(o), 0);
  await p.waitFor(figure('refund', 'conflicts') + " === '" + conflicts + "'",
    'the 409s and 422s counted');

  /* A live claim (its request in flight): its buttons are forced and say
   * what that risks; the daemon refuses the unforced action. */
  const live = request(port, 'POST', '/orders/O-8/refunds',
    { 'Content-Type': 'application/json', 'X-Delay-Ms': '3000' },
    JSON.stringify({ refund_no: 'L-1', amount: '1.00', status: 'SUCCESS' }));
  const forced = "document.querySelector('#in-flight tr:has([data-open=\"L-1\"]) " +
    "[data-action=\"release\"]')";
  for (let i = 0; i < 20 && !(await p.eval(forced + ' !== null')); i++) {
    await p.eval('loadClaims()');
    await sleep(100);
  }
  assert.equal(await p.eval(forced + '.textContent'), 'Force release');
  await p.eval(forced + '.click()');
  await p.waitFor("document.getElementById('confirm').open", 'the forced confirmation');
  assert.match(await p.eval("document.getElementById('confirm-text').textContent"),
    /^This claim is live: .*a second time\. Release the claim on key L-1/);
  await p.key('Escape', 'Escape', 27);
  await p.waitFor("!document.getElementById('confirm').open", 'Esc to cancel');
  const liveRec = JSON.parse((await admin(adminPort, 'GET',
    '/_idem/v1/records?space=refund-status&prefix=L-1')).body).records[0];
  const unforced = await admin(adminPort, 'POST', '/_idem/v1/records/release',
    { space: 'refund-status', key: 'L-1', epoch: liveRec.epoch });
  assert.equal(unforced.status, 409);
  assert.match(unforced.body, /claim_live/);
  assert.equal((await live).status, 200, 'the live request ran on');

  /* Keys and bodies holding markup show as text. */
  await p.eval('document.activeElement.blur()');
  await p.key('/', 'Slash', 191, '/');
  await p.waitFor("document.activeElement.id === 'prefix'", 'the search');
  await p.eval("document.getElementById('prefix').value = ''");
  await p.type('<');
  await p.key('Enter', 'Enter', 13, '\r');
  await p.waitFor("document.querySelectorAll('#records [data-open]').length === 2",
    'the two keys holding markup');
  const keys = await p.eval("[...document.querySelectorAll('#records [data-open]')]" +
    '.map((b) => b.textContent).sort()');
  assert.deepEqual(keys, [xssKey, HTML_KEY].sort());
  await p.eval("[...document.querySelectorAll('#records [data-open]')]" +
    '.find((b) => b.textContent === ' + JSON.stringify(HTML_KEY) + ').click()');
  await p.waitFor("document.getElementById('detail').open && " +
    "document.getElementById('detail-body').textContent", 'the stored HTML body');
  assert.equal(await p.eval("document.getElementById('detail-body').textContent"), HTML_BODY);
  assert.match(await p.eval("document.getElementById('detail-status').textContent"), /200/);
  assert.match(await p.eval("document.getElementById('detail-headers').textContent"),
    /Content-Typetext\/htmlX-Note<i>note<\/i>/);
  assert.match(await p.eval("document.getElementById('detail-fields').textContent"),
    /Owner<u>owner<\/u>/);
  assert.equal(await p.eval("document.getElementById('detail-title').textContent"),
    'Record ' + HTML_KEY);
  const markup = "({ scripts: document.scripts.length, injected: " +
    "document.querySelectorAll('#injected, img, b, i, u').length })";
  assert.deepEqual(await p.eval(markup), { scripts: 1, injected: 0 });
  await p.key('Escape', 'Escape', 27);
  await p.waitFor("!document.getElementById('detail').open", 'Esc');
  await p.eval("[...document.querySelectorAll('#records [data-open]')]" +
    '.find((b) => b.textContent === ' + JSON.stringify(xssKey) + ').click()');
  await p.waitFor("document.getElementById('detail').open && " +
    "/refund_no/.test(document.getElementById('detail-body').textContent)",
  'the JSON body of the markup key');
  const pretty = await p.eval("document.getElementById('detail-body').textContent");
  assert.equal(pretty, JSON.stringify(JSON.parse(pretty), null, 2), 'JSON pretty-printed');
  assert.deepEqual(await p.eval(markup), { scripts: 1, injected: 0 });
  await p.key('Escape', 'Escape', 27);
  /* The events name the key as text too. */
  await p.eval("document.querySelector('nav [data-view=\"events\"]').click()");
  await p.waitFor("[...document.querySelectorAll('#events tr')].some((r) => " +
    "r.textContent.includes('mismatch_422') && r.textContent.includes(" +
    JSON.stringify(xssKey) + '))', 'the 422 on the markup key among the events');
  assert.deepEqual(await p.eval(markup), { scripts: 1, injected: 0 });
  /* Times in UTC, saying so; an event's key opens its record. */
  assert.match(await p.eval("document.querySelector('#events tr td').textContent"),
    /^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC$/);
  await p.eval("[...document.querySelectorAll('#events [data-open]')]" +
    '.find((b) => b.textContent === ' + JSON.stringify(xssKey) + ').click()');
  await p.waitFor("document.getElementById('detail').open", 'the record of an event');
  assert.ok((await p.eval("document.getElementById('detail-fields').textContent"))
    .includes('Key' + xssKey), 'the event opened its own record');
  await p.key('Escape', 'Escape', 27);
  await p.waitFor("!document.getElementById('detail').open", 'Esc to close the detail');

  /* The routes view: each route with its match, key and policies. */
  await p.eval("document.querySelector('nav [data-view=\"routes\"]').click()");
  await p.waitFor("document.querySelectorAll('#route-table tr').length === 3", 'the routes view');
  const routesText = await p.eval("[...document.querySelectorAll('#route-table tr')]" +
    ".map((r) => r.textContent).join('\\n')");
  assert.match(routesText, /refundPOST \/refundsjson refund_norefundrecord/);
  assert.match(routesText, /on_unknown_outcome hold/);
  assert.match(routesText, /refund-statusPOST \/orders\/\*\/refundsjson refund_no/);
  assert.match(routesText, /states from CREATED by json status/);
  assert.match(routesText, /refund-mq \(consumer\)—json refund_norefund-mq/);
  const routesShot = await p.send('Page.captureScreenshot', { format: 'png' });
  fs.writeFileSync(path.join(outDir, 'console-routes.png'), Buffer.from(routesShot.data, 'base64'));

  /* The artifact: the detail of the stored HTML answer over the console. */
  await p.eval("document.querySelector('nav [data-view=\"records\"]').click()");
  await p.eval("[...document.querySelectorAll('#records [data-open]')]" +
    '.find((b) => b.textContent === ' + JSON.stringify(HTML_KEY) + ').click()');
  await p.waitFor("document.getElementById('detail').open", 'the detail');
  const shot = await p.send('Page.captureScreenshot', { format: 'png' });
  fs.writeFileSync(path.join(outDir, 'console-detail.png'), Buffer.from(shot.data, 'base64'));
  await p.key('Escape', 'Escape', 27);
  await p.eval("document.querySelector('nav [data-view=\"overview\"]').click()");
  await sleep(2 * 2000 + 500); /* two polls: what the console showed last is on it */
  const shot2 = await p.send('Page.captureScreenshot', { format: 'png' });
  fs.writeFileSync(path.join(outDir, 'console.png'), Buffer.from(shot2.data, 'base64'));

  /* A message without its key: dead-lettered (key_missing); redriven from
   * the consumers' table, through the confirmation, it goes back. */
  execFileSync('redis-cli', ['-u', redisUrl, 'XADD', stream, '*', 'body', '{"amount":"1.00"}']);
  const redrive = "document.querySelector('[data-redrive=\"refund-mq\"]')";
  const deadCell = "[...document.querySelectorAll('#consumers tr')].find((r) => " +
    "r.textContent.startsWith('refund-mq')).children[6].textContent";
  for (let i = 0; i < 50 && (await p.eval(deadCell)) !== '1'; i++) {
    await p.eval('poll()');
    await sleep(100);
  }
  assert.equal(await p.eval(deadCell), '1', 'the message dead-lettered');
  await p.eval(redrive + '.click()');
  await p.waitFor("document.getElementById('confirm').open", 'the redrive confirmation');
  assert.match(await p.eval("document.getElementById('confirm-text').textContent"),
    /^Each dead letter of consumer refund-mq goes back through the records/);
  await p.eval("document.getElementById('confirm-ok').click()");
  await p.waitFor("/^Redrive of refund-mq: /.test(document.getElementById('status').textContent)",
    'the redrive\'s answer');
  /* Left: 0, or 1 when it was refused again before the redrive counted. */
  assert.match(await p.eval("document.getElementById('status').textContent"),
    /^Redrive of refund-mq: 1 moved back, 0 done already, 0 kept, [01] left$/);
  for (let i = 0; i < 50 && (await p.eval(deadCell)) !== '2'; i++) {
    await p.eval('poll()');
    await sleep(100);
  }
  assert.equal(await p.eval(deadCell), '2', 'back, and refused again for its missing key');

  /* A read key sees the held claim H-2, and no action it could take. */
  await p.eval("document.getElementById('sign-out').click()");
  await p.waitFor("!document.getElementById('sign-in-view').hidden", 'signed out');
  assert.equal(await p.eval("sessionStorage.getItem('idem.console.key')"), null);
  await p.eval("document.getElementById('api-key').value = " + JSON.stringify(READ_KEY));
  await p.key('Enter', 'Enter', 13, '\r');
  await p.waitFor("/console-viewer \\(read key/.test(document.getElementById('who-text')" +
    '.textContent)', 'signed in with the read key');
  await p.eval("document.querySelector('nav [data-view=\"claims\"]').click()");
  await p.waitFor("document.querySelector('#held [data-open=\"H-2\"]')", 'H-2 held, seen');
  assert.ok(await p.eval("document.querySelectorAll('#held [data-action]').length") >= 2);
  assert.equal(await p.eval("document.querySelectorAll('[data-action]:not(:disabled)').length"),
    0, 'an enabled action for a read key');
  assert.equal(await p.eval("document.querySelectorAll('[data-redrive]').length"), 1);
  assert.equal(await p.eval("document.querySelectorAll('[data-redrive]:not(:disabled)').length"),
    0, 'an enabled redrive for a read key');
  await p.eval("document.querySelector('#held [data-open=\"H-2\"]').click()");
  await p.waitFor("document.getElementById('detail').open", 'the detail of H-2');
  assert.equal(await p.eval("document.querySelectorAll('#detail [data-action]').length"), 2);
  assert.equal(await p.eval("document.querySelectorAll('[data-action]:not(:disabled)').length"),
    0);
  assert.equal((await refund(port, 'H-2')).status, 409, 'H-2 still held');

  /* The store's file taken away under the daemon: the banner says what
   * health says is wrong, not only that it answers 503. */
  fs.renameSync(path.join(dir, 'records.db'), path.join(dir, 'records.db.moved'));
  await refund(port, 'C-after-move');
  await p.waitFor("document.getElementById('health').textContent.includes('health answers 503)')",
    'the unavailable banner', 15000);
  assert.match(await p.eval("document.getElementById('health').textContent"),
    /The store is unavailable \(health answers 503\): (reading|writing) records: E[A-Z]+/);
  fs.renameSync(path.join(dir, 'records.db.moved'), path.join(dir, 'records.db'));

  /* A daemon on the distributed store whose PostgreSQL has no synchronous
   * standby (the tests' own): the health line says that a failover can
   * lose acknowledged commits, and why, in the alarm's colour. */
  const distConfig = path.join(dir, 'idem-distributed.yaml');
  fs.writeFileSync(distConfig, [
    'storage: { kind: distributed, redis: "' + redisUrl + '", postgres: "' + pgUrl + '" }',
    'admin_listen: 127.0.0.1:0',
    'api_keys:',
    '  - { name: console-ops, scope: write, env: IDEM_CONSOLE_WRITE_KEY }',
    '',
  ].join('\n'));
  const dm = await start(idemBin, ['serve', '-c', distConfig, '--listen', '127.0.0.1:0'],
    { IDEM_CONSOLE_WRITE_KEY: WRITE_KEY },
    /listening on [^\n]*:(\d+), JSON API on [^\n]*:(\d+),/, 'idem-distributed.log');
  await p.send('Page.navigate', { url: 'http://127.0.0.1:' + Number(dm[2]) + '/' });
  await p.waitFor("document.readyState === 'complete' && !!document.getElementById('api-key')",
    'the distributed daemon\'s sign-in form');
  await p.eval("document.getElementById('api-key').value = " + JSON.stringify(WRITE_KEY));
  await p.key('Enter', 'Enter', 13, '\r');
  await p.waitFor("document.getElementById('health').textContent.includes('acknowledged')",
    'the replication warning', 15000);
  assert.match(await p.eval("document.getElementById('health').textContent"),
    /^Status ok .*distributed store.*A failover can lose acknowledged commits: 127\.0\.0\.1:\d+ has no synchronous standby/);
  assert.equal(await p.eval("document.getElementById('health').className"), 'error');
  const dExited = new Promise((resolve) => dm.proc.on('exit', (code, sig) => resolve(code ?? sig)));
  dm.proc.kill('SIGTERM');
  assert.equal(await dExited, 0, 'the distributed idem serve\'s exit status');

  /* Fifty routes: the overview is one table, a row each, what is wrong
   * now on top (a route whose upstream is down), the busy route's rate and
   * latencies filled in and its last minutes drawn. */
  const manyConfig = path.join(dir, 'idem-fifty.yaml');
  const name = (i) => 'r-' + String(i).padStart(2, '0');
  fs.writeFileSync(manyConfig, [
    'admin_listen: 127.0.0.1:0',
    'api_keys:',
    '  - { name: console-ops, scope: write, env: IDEM_CONSOLE_WRITE_KEY }',
    'routes:',
  ].concat(Array.from({ length: 50 }, (_, i) => [
    '  - name: ' + name(i),
    '    match: { method: POST, path: /' + name(i) + ' }',
    /* r-07's upstream listens on nothing: 502s. */
    '    upstream: http://127.0.0.1:' + (i === 7 ? 1 : servicePort),
    '    key: { json: refund_no }',
  ].join('\n'))).concat(['']).join('\n'));
  const fm = await start(idemBin, ['serve', '-c', manyConfig, '--db',
    path.join(dir, 'fifty.db'), '--listen', '127.0.0.1:0'], { IDEM_CONSOLE_WRITE_KEY: WRITE_KEY },
  /listening on [^\n]*:(\d+), JSON API on [^\n]*:(\d+),/, 'idem-fifty.log');
  const fPort = Number(fm[1]);
  const post = (route, no) => request(fPort, 'POST', '/' + route,
    { 'Content-Type': 'application/json' }, JSON.stringify({ refund_no: no, amount: '1.00' }));
  for (let i = 0; i < 3; i++)
    assert.equal((await post(name(7), 'down-' + i)).status, 502);
  await p.send('Page.navigate', { url: 'http://127.0.0.1:' + Number(fm[2]) + '/' });
  await p.waitFor("document.readyState === 'complete' && !!document.getElementById('api-key')",
    'the fifty routes\' sign-in form');
  await p.eval("document.getElementById('api-key').value = " + JSON.stringify(WRITE_KEY));
  await p.key('Enter', 'Enter', 13, '\r');
  /* Traffic on r-03 until two 10 s steps of it are drawn. */
  let sent = 0;
  const busy = setInterval(() => { post(name(3), 'busy-' + sent++).catch(() => {}); }, 200);
  try {
    await p.waitFor("document.querySelectorAll('#routes tr').length === 50 && " +
      "!!document.querySelector('#routes tr[data-route=\"r-03\"] svg polyline')",
    'fifty rows, and r-03\'s last minutes drawn', 40000);
  } finally {
    clearInterval(busy);
  }
  assert.equal(await p.eval("document.querySelector('#routes tr').dataset.route"), 'r-07',
    'the route answering 502s first');
  assert.equal(await p.eval("document.querySelector('#routes tr').className"), 'bad');
  assert.match(await p.eval(figure('r-07', 'errors')), /^3 \(100 %\)$/);
  assert.ok(await p.eval("!!document.querySelector('#routes tr[data-route=\"r-07\"] " +
    "polyline[data-series=\"errors\"]')"), 'r-07\'s 5xx drawn in its last hour');
  assert.ok(await p.eval("!document.querySelector('#routes tr[data-route=\"r-03\"] " +
    "polyline[data-series=\"errors\"]')"), 'no 5xx line where there were none');
  assert.equal(await p.eval("document.querySelectorAll('#routes tr')[1].dataset.route"), 'r-03',
    'then the busiest');
  assert.ok(Number(await p.eval(figure('r-03', 'per_second'))) > 0, 'r-03\'s rate');
  assert.match(await p.eval(figure('r-03', 'p50')), /^\d+(\.\d)? ms$/);
  assert.equal(await p.eval(figure('r-40', 'per_second')), '0.00');
  assert.equal(await p.eval(figure('r-40', 'p99')), '—');
  /* The past is the daemon's: a reloaded page draws at once every step the
   * page before it drew, where a page's own record would start empty. */
  const points = "document.querySelector('#routes tr[data-route=\"r-03\"] " +
    "polyline[data-series=\"answers\"]').getAttribute('points').split(' ').length";
  const drawn = await p.eval(points);
  await p.eval('window.beforeReload = true');
  await p.send('Page.reload', {});
  await p.waitFor("!window.beforeReload && document.readyState === 'complete' && " +
    "document.querySelectorAll('#routes tr').length === 50", 'the overview after a reload');
  assert.ok(await p.eval(points) >= drawn, 'the steps drawn before the reload, after it');
  /* A row a line: fifty routes in about two screens, not fifty boxes. */
  const tallest = await p.eval("Math.max(...[...document.querySelectorAll('#routes tr')]" +
    '.map((r) => r.getBoundingClientRect().height))');
  assert.ok(tallest <= 40, 'a row ' + tallest + ' px high');
  const fiftyShot = await p.send('Page.captureScreenshot', { format: 'png' });
  fs.writeFileSync(path.join(outDir, 'console-fifty.png'), Buffer.from(fiftyShot.data, 'base64'));
  const fExited = new Promise((resolve) => fm.proc.on('exit', (code, sig) => resolve(code ?? sig)));
  fm.proc.kill('SIGTERM');
  assert.equal(await fExited, 0, 'the fifty routes\' idem serve\'s exit status');

  assert.deepEqual(p.dialogs, [], 'no dialog raised');
  assert.deepEqual(p.cspViolations, [], 'no Content-Security-Policy violation');
  assert.deepEqual(p.exceptions, [], 'no uncaught exception in the page');
  await browser.send('Browser.close').catch(() => {});

  /* The daemon drains and exits cleanly (under ASan: nothing leaked). */
  const exited = new Promise((resolve) => m.proc.on('exit', (code, sig) => resolve(code ?? sig)));
  m.proc.kill('SIGTERM');
  assert.equal(await exited, 0, 'idem serve exit status');
}

main().then(() => {
  console.log('console: ok (screenshots in ' + outDir + ')');
}, (e) => {
  console.error('console: FAILED: ' + (e.stack || e));
  for (const f of ['idem.log', 'refund_service.log'])
    try {
      console.error('---- ' + f + '\n' + fs.readFileSync(path.join(dir, f), 'utf8'));
    } catch (err) { /* not started */ }
  process.exitCode = 1;
}).finally(() => {
  for (const c of children)
    if (c.exitCode === null) c.kill('SIGTERM');
  setTimeout(() => {
    for (const c of children)
      if (c.exitCode === null) c.kill('SIGKILL');
    fs.rmSync(dir, { recursive: true, force: true });
    process.exit();
  }, 1000);
});
