// SPDX-License-Identifier: Apache-2.0
/*
 * console.js — the operator console's behaviour (server/admin/console/index.html).
 *
 * Plain JavaScript, no framework and nothing fetched but this daemon's JSON
 * API (/_idem/v1/), with the API key the operator signs in with, kept in
 * sessionStorage (this tab only) and sent as "Authorization: Bearer". Keys,
 * owners and stored bodies are the clients' text: everything shown goes in
 * through textContent or attributes, never as markup.
 */
'use strict';

const API = '/_idem/v1/';
const POLL_MS = 2000;
const KEY_STORE = 'idem.console.key';

const state = {
  key: null,
  write: false,
  spaces: [],
  cursor: null,
  timer: null,
  view: 'overview',
};

const $ = (id) => document.getElementById(id);

/* An element with its text (never parsed as markup) and attributes. */
function el(tag, text, attrs) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) {
    const td = document.createElement('td');
    if (c instanceof Node) td.append(c);
    else td.textContent = c === undefined || c === null ? '' : String(c);
    tr.append(td);
  }
  return tr;
}

function say(text, bad) {
  const s = $('status');
  s.textContent = text;
  s.className = bad ? 'error' : 'ok';
}

/* A time as the logs write it: UTC, the zone said ("2026-12-03 09:30:00
 * UTC"), whatever the browser's own zone is. */
function time(ms) {
  return ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, ' UTC') : '';
}

function duration(ms) {
  if (ms === undefined || ms === null) return '';
  const s = Math.round(ms / 1000);
  if (s < 120) return s + ' s';
  if (s < 7200) return Math.round(s / 60) + ' min';
  if (s < 172800) return Math.round(s / 3600) + ' h';
  return Math.round(s / 86400) + ' days';
}

class HttpError extends Error {
  constructor(status, detail, body) {
    super(detail);
    this.status = status;
    this.body = body; /* the answer's, parsed when JSON */
  }
}

/* A call of the JSON API with the key: the parsed answer, or an HttpError
 * saying plainly what was refused. */
async function call(path, options) {
  const opts = Object.assign({ headers: {} }, options || {});
  opts.headers.Authorization = 'Bearer ' + state.key;
  opts.cache = 'no-store';
  opts.credentials = 'omit';
  let r;
  try {
    r = await fetch(API + path, opts);
  } catch (e) {
    throw new HttpError(0, 'the daemon does not answer (' + e.message + ')');
  }
  const type = r.headers.get('Content-Type') || '';
  const body = type.includes('json') ? await r.json().catch(() => null) : await r.text();
  if (r.ok) return body;
  const detail = body && body.detail ? body.detail : r.statusText;
  if (r.status === 401)
    throw new HttpError(401, 'This key is not accepted by the daemon (401): ' + detail);
  if (r.status === 403)
    throw new HttpError(403, 'This key may not do that (403): ' + detail);
  throw new HttpError(r.status, r.status + ': ' + detail, body);
}

/* ---- signing in ---- */

async function signIn(key) {
  state.key = key;
  let me;
  try {
    me = await call('whoami');
  } catch (e) {
    state.key = null;
    sessionStorage.removeItem(KEY_STORE);
    $('sign-in-error').textContent = e.message;
    $('sign-in-view').hidden = false;
    $('app').hidden = true;
    $('api-key').focus();
    return;
  }
  sessionStorage.setItem(KEY_STORE, key);
  state.write = me.write === true;
  $('sign-in-error').textContent = '';
  $('sign-in-view').hidden = true;
  $('app').hidden = false;
  $('who').hidden = false;
  $('who-text').textContent = 'Signed in as ' + me.name + ' (' + me.scope + ' key' +
    (state.write ? '' : ': sees, cannot act') + ')';
  document.body.dataset.scope = me.scope;
  await loadSpaces();
  show('overview');
  poll();
  state.timer = setInterval(poll, POLL_MS);
}

function signOut() {
  clearInterval(state.timer);
  state.timer = null;
  state.key = null;
  state.write = false;
  sessionStorage.removeItem(KEY_STORE);
  /* Nothing the last key saw, or could do, stays behind. */
  for (const id of ['confirm', 'detail'])
    if ($(id).open) $(id).close();
  for (const id of ['routes', 'records', 'held', 'in-flight', 'events', 'detail-fields',
    'detail-body', 'detail-actions', 'detail-status', 'consumers', 'health', 'status'])
    $(id).replaceChildren();
  $('detail-headers').tBodies[0].replaceChildren();
  $('next-page').hidden = true;
  $('who').hidden = true;
  $('app').hidden = true;
  $('sign-in-view').hidden = false;
  $('api-key').value = '';
  $('api-key').focus();
}

async function loadSpaces() {
  try {
    state.spaces = (await call('spaces')).spaces || [];
  } catch (e) {
    state.spaces = [];
    say(e.message, true);
  }
  const sel = $('space');
  sel.replaceChildren();
  for (const s of state.spaces) {
    const users = s.routes.map((r) => 'route ' + r).concat(s.consumers.map((c) => 'consumer ' + c));
    sel.append(el('option', s.space + ' (' + users.join(', ') + ')', { value: s.space }));
  }
}

/* ---- views ---- */

function show(view) {
  state.view = view;
  $('status').textContent = '';
  for (const b of document.querySelectorAll('nav button')) {
    if (b.dataset.view === view) b.setAttribute('aria-current', 'page');
    else b.removeAttribute('aria-current');
  }
  for (const v of ['overview', 'records', 'claims', 'events', 'routes'])
    $('view-' + v).hidden = v !== view;
  if (view === 'claims') loadClaims();
  if (view === 'events') loadEvents();
  if (view === 'routes') loadRoutes();
}

/* ---- routes ---- */

function partText(p) {
  return p.source + ' ' + p.name;
}

async function loadRoutes() {
  let answer;
  try {
    answer = await call('routes');
  } catch (e) {
    say(e.message, true);
    return;
  }
  const body = $('route-table');
  body.replaceChildren();
  for (const r of answer.routes) {
    const policies = ['in_flight ' + r.in_flight, 'on_unknown_outcome ' + r.on_unknown_outcome];
    if (r.states) policies.push('states from ' + r.states.initial + ' by ' + partText(r.states.field));
    if (r.signature) policies.push('signature ' + r.signature);
    if (r.tombstone_ms) policies.push('tombstone ' + duration(r.tombstone_ms));
    body.append(row([
      r.name + (r.kind === 'consumer' ? ' (consumer)' : ''),
      r.match || '—',
      r.key.map(partText).join(' + '),
      r.space + (r.scope === 'subject' ? ' (per subject)' : ''),
      r.layers.join(', '),
      r.upstream,
      duration(r.lease_ms) + ' / ' + duration(r.retention_ms),
      policies.join('; '),
    ]));
  }
}

/* ---- counters ---- */

/* The series of the Prometheus text: [{name, labels: {...}, value}]. */
function parseSeries(text) {
  const out = [];
  const line = /^([a-zA-Z_:][a-zA-Z0-9_:]*)\{(.*)\} (\S+)$/;
  const pair = /([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)",?/g;
  for (const l of text.split('\n')) {
    const m = line.exec(l);
    if (!m) continue;
    const labels = {};
    for (const p of m[2].matchAll(pair))
      labels[p[1]] = p[2].replace(/\\(.)/g, (all, c) => (c === 'n' ? '\n' : c));
    out.push({ name: m[1], labels, value: Number(m[3]) });
  }
  return out;
}

const SVG = 'http://www.w3.org/2000/svg';

/* A route's last hour, a 10 s step a point: its answers per second (blue)
 * and its 5xx (red), now at the right edge, the scale written in it. */
function spark(r, stepMs) {
  const w = 360, h = 28, n = 360;
  const svg = document.createElementNS(SVG, 'svg');
  svg.setAttribute('viewBox', '0 0 ' + w + ' ' + h);
  svg.setAttribute('preserveAspectRatio', 'none');
  const secs = (i) => (i === r.steps.length - 1 ? r.last_step_ms : stepMs) / 1000;
  const perSecond = (k) => r.steps.map((s, i) => (secs(i) > 0 ? s[k] / secs(i) : 0));
  const answers = perSecond(0), errors = perSecond(1);
  const max = Math.max(0, ...answers);
  const title = document.createElementNS(SVG, 'title');
  title.textContent = 'answers per second (blue) and 5xx (red), 10 s steps over the last ' +
    'hour, now at the right; at most ' + rate(max) + '/s';
  svg.append(title);
  for (const [values, colour] of [[answers, '#0b5cad'], [errors, '#b3261e']]) {
    if (values.length < 2 || (colour !== '#0b5cad' && !values.some((v) => v > 0))) continue;
    const line = document.createElementNS(SVG, 'polyline');
    line.setAttribute('points', values.map((v, i) => {
      const x = w - (values.length - 1 - i) * (w / (n - 1));
      return x.toFixed(1) + ',' + (h - 2 - (max ? v / max : 0) * (h - 12)).toFixed(1);
    }).join(' '));
    line.setAttribute('fill', 'none');
    line.setAttribute('stroke', colour);
    line.setAttribute('stroke-width', '1.5');
    line.setAttribute('vector-effect', 'non-scaling-stroke');
    line.dataset.series = colour === '#0b5cad' ? 'answers' : 'errors';
    svg.append(line);
  }
  const box = el('div', null, { class: 'spark' });
  box.append(el('span', 'max ' + rate(max) + '/s'), svg);
  return box;
}

function rate(v) {
  if (v === null || v === undefined) return '—';
  return v >= 100 ? String(Math.round(v)) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
}

function ms(v) {
  if (v === null || v === undefined) return '—';
  return v >= 1000 ? (v / 1000).toFixed(v >= 10000 ? 0 : 1) + ' s'
    : (v >= 10 ? Math.round(v) : v.toFixed(1)) + ' ms';
}

function percent(v) {
  return v === null || v === undefined ? '—' : (100 * v).toFixed(v >= 0.1 ? 0 : 1) + ' %';
}

/* One row per route and consumer, over the last minute as the daemon keeps
 * it (GET routes/stats): what is wrong now first (5xx by their share, then
 * 409s and 422s), then the busiest. */
function drawRoutes(stats) {
  const body = $('routes');
  body.replaceChildren();
  const routes = stats.routes.slice().sort((a, b) =>
    (b.error_ratio || 0) - (a.error_ratio || 0) || b.conflicts - a.conflicts ||
    (b.per_second || 0) - (a.per_second || 0) || (a.route < b.route ? -1 : 1));
  if (routes.length === 0) {
    const tr = row(['No routes configured.']);
    tr.firstChild.colSpan = 9;
    body.append(tr);
  }
  for (const r of routes) {
    const cells = [
      el('span', r.route + (r.kind === 'consumer' ? ' (consumer)' : '')),
      rate(r.per_second),
      r.errors ? r.errors + ' (' + percent(r.error_ratio) + ')' : '0',
      ms(r.p50_ms),
      ms(r.p99_ms),
      r.executions,
      r.replays,
      r.conflicts,
      spark(r, stats.step_ms),
    ];
    const tr = row(cells);
    tr.dataset.route = r.route;
    const names = ['route', 'per_second', 'errors', 'p50', 'p99', 'executions', 'replays',
      'conflicts', 'steps'];
    names.forEach((n, i) => { tr.children[i].dataset.figure = n; });
    if (r.errors) tr.className = 'bad';
    else if (r.conflicts) tr.className = 'warn';
    body.append(tr);
  }
}

/* What PostgreSQL promises of an acknowledged commit on a failover, when
 * it is not enough: health's reason, said plainly. */
function replicationWarning(r) {
  return r && r.commits === 'asynchronous'
    ? 'A failover can lose acknowledged commits: ' + r.why + '.' : '';
}

function drawHealth(h) {
  const p = $('health');
  const warn = replicationWarning(h.replication);
  p.className = h.status === 'ok' && !warn ? 'ok' : 'error';
  p.textContent = 'Status ' + h.status + ' — records ' + h.records + ', tokens and locks ' +
    h.tokens_and_locks + ', ' + h.store + ' store, idem ' + h.version +
    (warn ? '. ' + warn : '');
}

/* The consumers: connected or not (health), and their counters (metrics). */
function drawConsumers(h, series) {
  const box = $('consumers');
  const names = Object.keys(h.consumers || {});
  box.replaceChildren();
  if (names.length === 0) {
    box.append(el('p', 'No consumers configured.', { class: 'hint' }));
    return;
  }
  const per = new Map();
  for (const s of series) {
    const m = /^idem_consumer_([a-z_]+?)(?:_total)?$/.exec(s.name);
    const c = s.labels.consumer;
    if (!m || c === undefined) continue;
    if (!per.has(c)) per.set(c, {});
    per.get(c)[m[1]] = s.value;
  }
  const t = el('table');
  const head = row(['Consumer', 'Broker', 'Received', 'Executed', 'Duplicates', 'Retried',
    'Dead-lettered', 'In flight', '']);
  t.append(head);
  for (const n of names) {
    const c = per.get(n) || {};
    t.append(row([n, h.consumers[n], c.received, c.executed, c.duplicates, c.retried,
      c.dead_lettered, c.in_flight, redriveButton(n)]));
  }
  box.append(t);
}

async function poll() {
  if (!state.key) return;
  let text, h, stats;
  try {
    [text, h, stats] = await Promise.all([call('metrics'), call('health').catch((e) => {
      /* The store is down: said below, with the reason health gives. */
      if (e.status === 503) return { down: true, body: e.body };
      throw e;
    }), call('routes/stats')]);
  } catch (e) {
    say(e.message, true);
    if (e.status === 401) signOut();
    return;
  }
  const series = parseSeries(text);
  drawRoutes(stats);
  if (h && !h.down) {
    drawHealth(h);
    drawConsumers(h, series);
  } else {
    /* What health says is wrong: the records' error, the last write's. */
    const b = h && h.body && typeof h.body === 'object' ? h.body : {};
    const why = [];
    if (b.records && b.records !== 'ok') why.push('reading records: ' + b.records);
    if (b.record_writes && b.record_writes !== 'ok') why.push('writing records: ' + b.record_writes);
    if (b.tokens_and_locks && b.tokens_and_locks !== 'ok')
      why.push('tokens and locks: ' + b.tokens_and_locks);
    const repl = replicationWarning(b.replication);
    $('health').className = 'error';
    $('health').textContent = b.status === 'replication_asynchronous'
      ? 'Not ready (health answers 503, require_synchronous_replication). ' + repl
      : 'The store is unavailable (health answers 503)' +
        (why.length ? ': ' + why.join('; ') : '.');
  }
}

/* ---- records ---- */

function openButton(space, key) {
  const b = el('button', key, { type: 'button', class: 'link', 'data-open': key });
  b.addEventListener('click', () => openRecord(space, key));
  return b;
}

async function search(more) {
  const space = $('space').value;
  if (!space) {
    say('No space to search: no route or consumer is configured.', true);
    return;
  }
  const q = new URLSearchParams({ space, limit: '50' });
  if ($('prefix').value) q.set('prefix', $('prefix').value);
  if ($('state').value) q.set('state', $('state').value);
  if (more && state.cursor) q.set('cursor', state.cursor);
  let page;
  try {
    page = await call('records?' + q.toString());
  } catch (e) {
    say(e.message, true);
    return;
  }
  const body = $('records');
  if (!more) body.replaceChildren();
  for (const r of page.records) {
    const tr = row([openButton(space, r.key), r.state, r.epoch, r.status, time(r.updated_ms)]);
    tr.children[0].className = 'key';
    tr.children[1].className = 'state-' + r.state;
    body.append(tr);
  }
  if (!more && page.records.length === 0)
    body.append(row(['No record matches.']));
  state.cursor = page.next_cursor;
  $('next-page').hidden = !page.next_cursor;
  say(body.children.length + ' shown' + (page.next_cursor ? '; more on the next page' : ''));
}

/* A stored answer ("IDEM1 status headers length\n" headers, body) from
 * the record's result: {status, headers, body} or null when not one. */
function decodeStored(rec) {
  let bytes;
  if (typeof rec.result === 'string') bytes = new TextEncoder().encode(rec.result);
  else if (typeof rec.result_base64 === 'string')
    bytes = Uint8Array.from(atob(rec.result_base64), (c) => c.charCodeAt(0));
  else return null;
  const nl = bytes.indexOf(10);
  const first = new TextDecoder().decode(bytes.subarray(0, nl < 0 ? 0 : nl));
  const m = /^IDEM1 (\d{3}) (\d+) (\d+)$/.exec(first);
  if (!m) return { status: null, headers: [], body: bytes };
  let at = nl + 1;
  const headers = [];
  for (let i = 0; i < Number(m[2]); i++) {
    const end = bytes.indexOf(10, at);
    if (end < 0) break;
    const line = new TextDecoder().decode(bytes.subarray(at, end));
    const colon = line.indexOf(':');
    headers.push([line.slice(0, colon), line.slice(colon + 1).trim()]);
    at = end + 1;
  }
  return { status: Number(m[1]), headers, body: bytes.subarray(at) };
}

/* The body as text: JSON pretty-printed, other UTF-8 text as it is, and
 * anything else in hexadecimal. */
function bodyText(bytes) {
  let text;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch (e) {
    return Array.from(bytes.subarray(0, 4096), (b) => b.toString(16).padStart(2, '0')).join(' ') +
      (bytes.length > 4096 ? ' …' : '') + '\n(' + bytes.length + ' bytes, not UTF-8 text)';
  }
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch (e) {
    return text;
  }
}

/* The path of a record: a key that is "." or ".." (which the browser
 * resolves away, "%2E" too) goes in the query instead. */
function recordPath(space, key) {
  const s = encodeURIComponent(space);
  return key === '.' || key === '..' ? 'records/' + s + '/?key=' + encodeURIComponent(key)
                                     : 'records/' + s + '/' + encodeURIComponent(key);
}

async function openRecord(space, key) {
  let answer;
  try {
    answer = await call(recordPath(space, key));
  } catch (e) {
    say(e.message, true);
    return;
  }
  const rec = answer.record;
  $('detail-title').textContent = 'Record ' + key;
  const dl = $('detail-fields');
  dl.replaceChildren();
  const now = Date.now();
  const fields = [
    ['Space', space], ['Key', key], ['State', rec.state], ['Epoch', rec.epoch],
    ['Owner', rec.owner],
    ['Lease', rec.state === 'PROCESSING'
      ? 'until ' + time(rec.lease_until_ms) + ' (' + duration(rec.lease_until_ms - now) + ' left)'
      : '—'],
    ['Created', time(rec.created_ms)], ['Updated', time(rec.updated_ms)],
    ['Expires', rec.expires_ms ? time(rec.expires_ms) : 'kept until deleted'],
  ];
  /* A key with states: how it got where it is, oldest move first. */
  if (Array.isArray(rec.steps))
    fields.push(['Moves', rec.steps.map((s) => s.state + ' at ' + time(s.at_ms) +
      ' (epoch ' + s.epoch + ')').join(' → ')]);
  for (const [k, v] of fields) {
    dl.append(el('dt', k));
    dl.append(el('dd', v));
  }
  const stored = decodeStored(rec);
  const headers = $('detail-headers').tBodies[0];
  headers.replaceChildren();
  if (!stored) {
    $('detail-status').textContent = 'No answer stored.';
    $('detail-body').textContent = '';
  } else {
    $('detail-status').textContent = stored.status
      ? 'Status ' + stored.status : 'Not an answer the gateway stored; the result as kept:';
    for (const [n, v] of stored.headers) headers.append(row([n, v]));
    $('detail-body').textContent = bodyText(stored.body);
  }
  const actions = $('detail-actions');
  actions.replaceChildren();
  if (rec.state === 'PROCESSING') {
    actions.append(actionButton('release', space, key, rec.epoch));
    actions.append(' ');
    actions.append(actionButton('mark_failed', space, key, rec.epoch));
  } else {
    actions.append(actionButton('delete', space, key, rec.epoch, false, rec.updated_ms));
  }
  const d = $('detail');
  if (!d.open) d.showModal();
  $('detail-close').focus();
}

/* ---- held and in flight ---- */

const ACTIONS = {
  release: {
    label: 'Release',
    text: (s, k, e) => 'Release the claim on key ' + k + ' (space ' + s + ', epoch ' + e +
      ')? The next retry of the key executes, once. Do it only when you know the first ' +
      'attempt did not take effect upstream.',
  },
  mark_failed: {
    label: 'Mark failed',
    text: (s, k, e) => 'Mark the claim on key ' + k + ' (space ' + s + ', epoch ' + e +
      ') failed? Every retry of the key is answered with this error from now on.',
  },
  delete: {
    label: 'Delete',
    text: (s, k, e) => 'Delete the record of key ' + k + ' (space ' + s + ', epoch ' + e +
      ')? Its stored answer is gone, and the next request with the key executes again.',
  },
};

/* What acting on a live claim (in flight, its lease running) risks: the
 * JSON API refuses it without force (409 claim_live). */
const LIVE_RISK = {
  release: 'This claim is live: its request may be executing upstream right now, and ' +
    'releasing it lets a retry execute the key a second time. ',
  mark_failed: 'This claim is live: its request may be executing upstream right now, and ' +
    'every retry is answered with the failure even if that request succeeds. ',
};

/* A button for an action: disabled, and saying why, for a read key. On a
 * live claim (live set), the action is forced, and says so. A delete acts
 * on the record as it was read (updated, its updated_ms) and no other. */
function actionButton(op, space, key, epoch, live, updated) {
  const label = live ? 'Force ' + ACTIONS[op].label.toLowerCase() : ACTIONS[op].label;
  const b = el('button', label, { type: 'button', 'data-action': op });
  if (live) b.dataset.force = 'true';
  if (!state.write) {
    b.disabled = true;
    b.title = 'A write key is needed';
  }
  b.addEventListener('click', () => confirmAction(op, space, key, epoch, b, live, updated));
  return b;
}

/* The confirmation dialog: title and text, the OK button's label, the
 * mark_failed fields shown or not; submit(ev) once confirmed (after the
 * dialog closed). Focus goes back to opener. */
function openConfirm(title, text, ok, withFail, opener, submit) {
  const d = $('confirm');
  $('confirm-title').textContent = title;
  $('confirm-text').textContent = text;
  $('confirm-fail').hidden = !withFail;
  $('fail-reason').required = withFail;
  $('fail-reason').value = '';
  $('confirm-ok').textContent = ok;
  d.onclose = () => {
    if (opener && opener.isConnected) opener.focus();
  };
  $('confirm-form').onsubmit = (ev) => {
    ev.preventDefault();
    const reason = $('fail-reason').value, status = Number($('fail-status').value);
    d.close();
    submit(reason, status);
  };
  d.showModal();
  $('confirm-cancel').focus();
}

function confirmAction(op, space, key, epoch, opener, live, updated) {
  if (!state.write) return;
  const label = live ? 'Force ' + ACTIONS[op].label.toLowerCase() : ACTIONS[op].label;
  const text = (live ? LIVE_RISK[op] : '') + ACTIONS[op].text(space, key, epoch);
  openConfirm(label + '?', text, label, op === 'mark_failed', opener, async (reason, status) => {
    const body = { space, key, epoch };
    if (live) body.force = true;
    if (op === 'delete') body.updated_ms = updated;
    if (op === 'mark_failed') {
      body.reason = reason;
      body.status = status;
    }
    try {
      const r = await call('records/' + op, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json' },
        body: JSON.stringify(body),
      });
      say(ACTIONS[op].label + ' ' + key + ': ' + r.outcome);
    } catch (e) {
      say(ACTIONS[op].label + ' ' + key + ' refused: ' + e.message, true);
    }
    if ($('detail').open) $('detail').close();
    if (state.view === 'claims') loadClaims();
    if (state.view === 'records') search(false);
  });
}

/* A consumer's dead letters back through the records
 * (consumers/{name}/redrive), once its handler is fixed. */
function redriveButton(name) {
  const b = el('button', 'Redrive dead letters', { type: 'button', 'data-redrive': name });
  if (!state.write) {
    b.disabled = true;
    b.title = 'A write key is needed';
  }
  b.addEventListener('click', () => {
    if (!state.write) return;
    openConfirm('Redrive the dead letters of ' + name + '?',
      'Each dead letter of consumer ' + name + ' goes back through the records: a key ' +
      'finished meanwhile (by a route, another channel) is taken off and never runs again; ' +
      'the rest go back on its queue with their attempts counted afresh, and run once. ' +
      'Do it once the handler that failed them is fixed.', 'Redrive', false, b, async () => {
        try {
          const r = await call('consumers/' + encodeURIComponent(name) + '/redrive', {
            method: 'POST',
            headers: { 'Content-Type': 'application/json' },
            body: '{}',
          });
          say('Redrive of ' + name + ': ' + r.moved + ' moved back, ' + r.done +
            ' done already, ' + r.kept + ' kept, ' + r.left + ' left' +
            (r.complete ? '' : '; stopped short: ' + r.error), !r.complete);
        } catch (e) {
          say('Redrive of ' + name + ' refused: ' + e.message, true);
        }
        poll();
      });
  });
  return b;
}

/* The held claims (records/held, for the spaces that hold) and the other
 * claims in flight, CLAIMS_MAX of each per space at most. */
const CLAIMS_MAX = 200;

async function loadClaims() {
  const held = $('held'), flying = $('in-flight');
  const heldRows = [], flyingRows = [];
  const more = [];
  const actions = (space, r, live) => {
    const span = el('span');
    span.append(actionButton('release', space, r.key, r.epoch, live), ' ',
      actionButton('mark_failed', space, r.key, r.epoch, live));
    return span;
  };
  try {
    for (const s of state.spaces) {
      const q = new URLSearchParams({ space: s.space, limit: String(CLAIMS_MAX) });
      if (s.holds) {
        const page = await call('records/held?' + q.toString());
        for (const r of page.records)
          heldRows.push(row([s.space, openButton(s.space, r.key), r.epoch, r.owner,
            time(r.updated_ms), time(r.lease_until_ms),
            r.reason || 'not known here (held by another instance, or long ago)',
            actions(s.space, r)]));
        if (page.next_cursor) more.push('held in ' + s.space);
      }
      q.set('state', 'PROCESSING');
      const page = await call('records?' + q.toString());
      for (const r of page.records)
        if (!r.held)
          flyingRows.push(row([s.space, openButton(s.space, r.key), r.epoch, r.owner,
            duration(r.lease_left_ms), actions(s.space, r, r.lease_left_ms > 0)]));
      if (page.next_cursor) more.push('in flight in ' + s.space);
    }
  } catch (e) {
    say(e.message, true);
    return;
  }
  held.replaceChildren(...(heldRows.length ? heldRows : [row(['No held claims.'])]));
  flying.replaceChildren(...(flyingRows.length ? flyingRows : [row(['No claims in flight.'])]));
  if (more.length)
    say('More than ' + CLAIMS_MAX + ' claims ' + more.join(', ') + ': the first ' + CLAIMS_MAX +
      ' are shown; Records with state PROCESSING pages through them all.');
}

async function loadEvents() {
  let list;
  try {
    list = await call('events?limit=100');
  } catch (e) {
    say(e.message, true);
    return;
  }
  const body = $('events');
  body.replaceChildren();
  /* Each event's key opens its record (the space the event names). */
  for (const e of list.events)
    body.append(row([time(e.time_ms), e.kind, e.route, openButton(e.space, e.key), e.epoch]));
  if (list.events.length === 0) body.append(row(['No events yet.']));
}

/* ---- wiring ---- */

document.addEventListener('DOMContentLoaded', () => {
  $('sign-in').addEventListener('submit', (ev) => {
    ev.preventDefault();
    signIn($('api-key').value.trim());
  });
  $('sign-out').addEventListener('click', signOut);
  for (const b of document.querySelectorAll('nav button'))
    b.addEventListener('click', () => show(b.dataset.view));
  $('search').addEventListener('submit', (ev) => {
    ev.preventDefault();
    search(false);
  });
  $('next-page').addEventListener('click', () => search(true));
  $('detail-close').addEventListener('click', () => $('detail').close());
  $('confirm-cancel').addEventListener('click', () => $('confirm').close());
  /* "/" goes to the search, as in most consoles; not while typing. */
  document.addEventListener('keydown', (ev) => {
    const t = ev.target;
    const typing = t instanceof HTMLInputElement || t instanceof HTMLTextAreaElement ||
      t instanceof HTMLSelectElement;
    if (ev.key === '/' && !typing && !ev.ctrlKey && !ev.metaKey && !ev.altKey &&
        state.key && !document.querySelector('dialog[open]')) {
      ev.preventDefault();
      show('records');
      $('prefix').focus();
      $('prefix').select();
    }
  });
  const saved = sessionStorage.getItem(KEY_STORE);
  if (saved) signIn(saved);
  else $('api-key').focus();
});
