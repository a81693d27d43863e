#!/usr/bin/env node
// sbpeer: a small local AMQP 1.0 peer that stands in for Azure Service Bus, so
// that aq's real azservicebus code runs over its real wire path on 127.0.0.1.
// It models what shared/design/SERVICEBUS.md lists and nothing more; docs/servicebus.md
// says what it does NOT model. Install with `npm ci` in this folder.
//
//   node sbpeer.js [--port 0] [--host 127.0.0.1] [--sub TOPIC/NAME[=FACTORY|*]]...
//                  [--lock-ms 30000] [--max-delivery 10] [--dup-window-ms 600000]
//                  [--events FILE|-] [--state FILE] [--tls-cert F --tls-key F] [--config FILE]
//                  [--admin-cert F --admin-key F [--admin-port 0]]
//                  [--sessions TOPIC/NAME|*]... [--session-wait-ms 60000]
//
// The first line on stdout is {"event":"listening","port":N,...} (with
// "adminPort" when --admin-cert is given). Every other event is one JSON line
// in --events (default stdout).
//
// With --admin-cert/--admin-key it also serves the management (ATOM) API's
// one read a scaler makes — GET /TOPIC/Subscriptions/NAME, the subscription's
// runtime properties (MessageCount, CountDetails) — over HTTPS on its own
// port, as KEDA's azure-servicebus scaler reads it.
//
// --sessions marks a subscription as requiring sessions (RequiresSession):
// its messages are grouped by SessionId (the AMQP group-id) and received only
// over a session link — the SDK's AcceptSession*/AcceptNextSession* — that
// holds the session's lock; see "sessions" below.
//
// Control (tests): one JSON line per command on stdin, acknowledged by a
// {"event":"control",...} line in the event log:
//   {"id":"c1","op":"expire-session-lock","queue":"TOPIC/Subscriptions/NAME","session":"S"}
'use strict';
const fs = require('fs');
const crypto = require('crypto');
const rhea = require('rhea');
const { types, message: amqpmsg } = rhea;

// ---- configuration -------------------------------------------------------
function parseArgs(argv) {
  const cfg = { host: '127.0.0.1', port: 0, lockMs: 30000, sessionWaitMs: 60000, maxDelivery: 10, dupWindowMs: 600000,
    events: '-', state: '', tlsCert: '', tlsKey: '', adminCert: '', adminKey: '', topics: {} };
  const subs = [];
  const sessions = [];
  for (let i = 0; i < argv.length; i++) {
    const [flag, inline] = argv[i].split(/=(.*)/s, 2);
    const val = () => (inline !== undefined ? inline : argv[++i]);
    switch (flag) {
      case '--config': Object.assign(cfg, JSON.parse(fs.readFileSync(val(), 'utf8'))); break;
      case '--host': cfg.host = val(); break;
      case '--port': cfg.port = Number(val()); break;
      case '--lock-ms': cfg.lockMs = Number(val()); break;
      case '--max-delivery': cfg.maxDelivery = Number(val()); break;
      case '--dup-window-ms': cfg.dupWindowMs = Number(val()); break;
      case '--events': cfg.events = val(); break;
      case '--state': cfg.state = val(); break;
      case '--tls-cert': cfg.tlsCert = val(); break;
      case '--tls-key': cfg.tlsKey = val(); break;
      case '--admin-cert': cfg.adminCert = val(); break;
      case '--admin-key': cfg.adminKey = val(); break;
      case '--admin-port': cfg.adminPort = Number(val()); break;
      case '--sub': subs.push(val()); break;
      case '--sessions': sessions.push(val()); break;
      case '--session-wait-ms': cfg.sessionWaitMs = Number(val()); break;
      default: throw new Error(`unknown flag ${argv[i]}`);
    }
  }
  // --sub fleet-dispatch/fa       → filter targetFactoryId = 'fa'
  // --sub fleet-dispatch/fa=fb    → filter targetFactoryId = 'fb'
  // --sub fleet-dispatch/all=*    → match everything (like a left-over $Default TrueFilter rule)
  for (const s of subs) {
    const m = /^([^/]+)\/([^=]+)(?:=(.*))?$/.exec(s);
    if (!m) throw new Error(`--sub wants TOPIC/NAME[=FACTORY|*], got ${s}`);
    const [, topic, name, target] = m;
    const t = (cfg.topics[topic] = cfg.topics[topic] || { subscriptions: {} });
    t.subscriptions[name] = { filter: target === '*' ? {} : { targetFactoryId: target || name } };
  }
  for (const s of sessions) {
    let n = 0;
    for (const [tname, t] of Object.entries(cfg.topics)) {
      for (const [sname, sub] of Object.entries(t.subscriptions || {})) {
        if (s === '*' || s.toLowerCase() === `${tname}/${sname}`.toLowerCase()) { sub.requiresSession = true; n++; }
      }
    }
    if (n === 0) throw new Error(`--sessions ${s}: no such subscription (give it with --sub first)`);
  }
  return cfg;
}

const cfg = parseArgs(process.argv.slice(2));

// ---- event log -----------------------------------------------------------
const eventsFd = cfg.events === '-' ? 1 : fs.openSync(cfg.events, 'a');
function log(event, fields) {
  // Written synchronously: a SIGKILL never loses a line a test may look for.
  fs.writeSync(eventsFd, JSON.stringify({ t: new Date().toISOString(), event, ...fields }) + '\n');
}
const hash = (s) => crypto.createHash('sha256').update(String(s)).digest('hex').slice(0, 16);

// ---- entities ------------------------------------------------------------
// A queue is a subscription or its dead-letter queue: messages in sequence
// order, consumers (our sending links), lock settings.
function newQueue(path, o) {
  return { path, filter: o.filter, lockMs: o.lockMs, maxDelivery: o.maxDelivery, messages: [], consumers: new Set(),
    requiresSession: Boolean(o.requiresSession), sessions: new Map(), waiting: [] };
}
const topics = {}; // lower-cased name → {name, dups: Map(messageId → expiry ms), subs: {lower name → {active, dlq}}}
const queues = {}; // lower-cased path → queue
for (const [tname, t] of Object.entries(cfg.topics)) {
  const topic = (topics[tname.toLowerCase()] = { name: tname, dups: new Map(), subs: {} });
  for (const [sname, s] of Object.entries(t.subscriptions || {})) {
    const base = `${tname}/Subscriptions/${sname}`;
    const opts = { filter: s.filter || {}, lockMs: s.lockMs || cfg.lockMs, maxDelivery: s.maxDelivery || cfg.maxDelivery,
      requiresSession: s.requiresSession };
    const active = newQueue(base, opts);
    const dlq = newQueue(`${base}/$DeadLetterQueue`, { filter: {}, lockMs: opts.lockMs, maxDelivery: Infinity });
    active.dlq = dlq;
    topic.subs[sname.toLowerCase()] = active;
    queues[base.toLowerCase()] = active;
    queues[dlq.path.toLowerCase()] = dlq;
  }
}
let seq = 0;

// ---- persistence (optional): queued messages survive a restart -----------
function encodeMsg(m) { return { ...m, body: m.body.toString('base64'), lock: undefined, lockLink: undefined }; }
// Saved synchronously after every change, before the change is acknowledged
// on the wire: a SIGKILL never loses a message the client was told is queued,
// nor brings back one it was told is settled. The state is small.
function save() {
  if (!cfg.state) return;
  const out = { seq, topics: {}, queues: {}, sessionState: {} };
  for (const [k, t] of Object.entries(topics)) out.topics[k] = [...t.dups];
  for (const [k, q] of Object.entries(queues)) {
    out.queues[k] = q.messages.map(encodeMsg);
    const st = [...q.sessions.values()].filter((x) => x.state).map((x) => [x.id, x.state.toString('base64')]);
    if (st.length) out.sessionState[k] = st;
  }
  fs.writeFileSync(cfg.state + '.tmp', JSON.stringify(out));
  fs.renameSync(cfg.state + '.tmp', cfg.state);
}
function load() {
  if (!cfg.state || !fs.existsSync(cfg.state)) return;
  const st = JSON.parse(fs.readFileSync(cfg.state, 'utf8'));
  seq = st.seq || 0;
  for (const [k, d] of Object.entries(st.topics || {})) if (topics[k]) topics[k].dups = new Map(d);
  for (const [k, msgs] of Object.entries(st.queues || {})) {
    const q = queues[k];
    if (!q) { log('state-dropped', { queue: k, messages: msgs.length }); continue; }
    for (const m of msgs) {
      m.body = Buffer.from(m.body, 'base64');
      if (m.lockedUntil) { // it was locked when the peer stopped: the lock is gone with it
        m.lockedUntil = 0;
        m.deliveryCount++;
        log('redelivery', { queue: q.path, messageId: m.messageId, seq: m.seq, reason: 'restart', deliveryCount: m.deliveryCount });
      }
      q.messages.push(m);
    }
  }
  for (const [k, states] of Object.entries(st.sessionState || {})) {
    if (queues[k]) for (const [id, b64] of states) session(queues[k], id).state = Buffer.from(b64, 'base64');
  }
}

// ---- routing, delivery, locks, settlement --------------------------------
function matches(filter, app) {
  return Object.entries(filter).every(([k, v]) => app && app[k] === v);
}

function publish(topic, msg) {
  const now = Date.now();
  const id = msg.message_id === undefined ? undefined : String(msg.message_id);
  for (const [k, exp] of topic.dups) if (exp <= now) topic.dups.delete(k);
  if (id !== undefined && topic.dups.has(id)) {
    log('duplicate', { topic: topic.name, messageId: id });
    return;
  }
  if (id !== undefined) topic.dups.set(id, now + cfg.dupWindowMs);
  const s = ++seq;
  const body = msg.body && msg.body.typecode === 117 ? msg.body.content : Buffer.from(JSON.stringify(msg.body === undefined ? null : msg.body));
  const routed = [];
  const sessionless = [];
  const sid = msg.group_id === undefined || msg.group_id === null ? undefined : String(msg.group_id);
  for (const q of Object.values(topic.subs)) {
    if (!matches(q.filter, msg.application_properties)) continue;
    const m = {
      seq: s, messageId: id, enqueued: now, body, deliveryCount: 0, lockedUntil: 0, sessionId: sid,
      props: pick(msg, ['correlation_id', 'subject', 'content_type', 'group_id', 'to', 'reply_to', 'ttl']),
      app: msg.application_properties || {},
    };
    q.messages.push(m);
    routed.push(q.path);
    if (q.requiresSession && !sid) sessionless.push([q, m]);
  }
  log('send', { topic: topic.name, messageId: id, seq: s, routedTo: routed, app: msg.application_properties || {}, session: sid });
  // Service Bus takes the message on the topic and dead-letters it on each
  // subscription that requires sessions, with these words (a session
  // receiver could never get it).
  for (const [q, m] of sessionless) {
    deadLetter(q, m, 'Session id is null.', "Session enabled entity doesn't allow a message whose session identifier is null.");
  }
  save();
  for (const p of routed) pump(queues[p.toLowerCase()]);
}

function pick(o, keys) {
  const r = {};
  for (const k of keys) if (o[k] !== undefined && o[k] !== null) r[k] = o[k];
  return r;
}

// credit a consumer link has left that we have not used yet
const freeCredit = (l) => (l.credit || 0) - ((l.aqSent || 0) - (l.delivery_count || 0));

// pump delivers what it can: on a session link only the messages of the
// session it holds, oldest first (the session's order); then it serves the
// AcceptNextSession calls waiting for a free session.
function pump(q) {
  for (const link of q.consumers) {
    const s = link.aqSession;
    while (link.is_open() && freeCredit(link) > 0) {
      const m = q.messages.find((x) => !x.lockedUntil && (s ? x.sessionId === s.id : true));
      if (!m) break;
      deliver(q, link, m);
    }
  }
  if (q.requiresSession) serveWaiting(q);
}

function deliver(q, link, m) {
  const token = crypto.randomBytes(16); // the lock token is the delivery tag (16 bytes, a UUID)
  const s = link.aqSession;
  // A session's messages are locked by the session's lock, not one of their own.
  m.lockedUntil = s ? s.lockedUntil : Date.now() + q.lockMs;
  m.lock = token.toString('hex');
  m.lockLink = link;
  link.aqSent = (link.aqSent || 0) + 1;
  const d = link.send({
    message_id: m.messageId,
    ...m.props,
    body: amqpmsg.data_section(m.body),
    delivery_count: m.deliveryCount,
    application_properties: m.app,
    message_annotations: {
      'x-opt-sequence-number': types.wrap_long(m.seq),
      'x-opt-enqueued-time': new Date(m.enqueued),
      'x-opt-locked-until': new Date(m.lockedUntil),
    },
  }, token);
  d.aq = { q, m, lock: m.lock };
  log('deliver', { queue: q.path, messageId: m.messageId, seq: m.seq, deliveryCount: m.deliveryCount + 1, link: link.name, session: m.sessionId });
  const lock = m.lock;
  if (s) return save();
  setTimeout(() => {
    if (m.lock !== lock || !q.messages.includes(m)) return;
    unlock(q, m, 'lock-expired', true);
  }, q.lockMs).unref();
  save();
}

// unlock makes a locked message available again (or dead-letters it once its
// delivery count reaches the queue's max delivery count).
function unlock(q, m, reason, counts) {
  m.lock = undefined;
  m.lockedUntil = 0;
  m.lockLink = undefined;
  if (counts) m.deliveryCount++;
  if (m.deliveryCount >= q.maxDelivery) {
    deadLetter(q, m, 'MaxDeliveryCountExceeded', `delivered ${m.deliveryCount} times (max ${q.maxDelivery})`);
    return;
  }
  log('redelivery', { queue: q.path, messageId: m.messageId, seq: m.seq, reason, deliveryCount: m.deliveryCount });
  save();
  pump(q);
}

function deadLetter(q, m, reason, description) {
  q.messages.splice(q.messages.indexOf(m), 1);
  m.lock = undefined;
  m.lockedUntil = 0;
  m.lockLink = undefined;
  m.app = { ...m.app, DeadLetterReason: reason, DeadLetterErrorDescription: description };
  if (q.dlq) q.dlq.messages.push(m);
  log('dead-letter', { queue: q.path, messageId: m.messageId, seq: m.seq, reason, description, deliveryCount: m.deliveryCount });
  save();
  if (q.dlq) pump(q.dlq);
}

function settle(context, outcome) {
  const d = context.delivery;
  const a = d.aq;
  if (!a) return;
  const { q, m, lock } = a;
  const reply = (state) => d.update(true, state.described());
  if (m.lock !== lock || !q.messages.includes(m)) {
    log('disposition', { queue: q.path, messageId: m.messageId, seq: m.seq, outcome, result: 'lock-lost' });
    reply(amqpmsg.rejected({ error: m.sessionId !== undefined && q.requiresSession
      ? { condition: 'com.microsoft:session-lock-lost', description: `the lock on session ${m.sessionId} was lost (sbpeer: it expired or was released)` }
      : { condition: 'com.microsoft:message-lock-lost', description: 'the lock on the message was lost (sbpeer: lock expired or message settled)' } }));
    return;
  }
  const state = d.remote_state || {};
  log('disposition', { queue: q.path, messageId: m.messageId, seq: m.seq, outcome, deliveryCount: m.deliveryCount + 1 });
  switch (outcome) {
    case 'complete':
      q.messages.splice(q.messages.indexOf(m), 1);
      save();
      reply(amqpmsg.accepted());
      break;
    case 'abandon': // modified: Service Bus counts it as a delivery
      reply(amqpmsg.modified({ delivery_failed: false, undeliverable_here: false }));
      unlock(q, m, 'abandoned', true);
      break;
    case 'release': // released: the receiver never looked at it
      reply(amqpmsg.released());
      unlock(q, m, 'released', false);
      break;
    case 'dead-letter': {
      const err = state.error || {};
      const info = err.info || {};
      reply(amqpmsg.rejected());
      deadLetter(q, m, String(info.DeadLetterReason || ''), String(info.DeadLetterErrorDescription || ''));
      break;
    }
  }
}

// ---- sessions ----------------------------------------------------------------
// A subscription that requires sessions groups its messages by SessionId.
// A session is held by at most one receiving link at a time (its lock, for
// the subscription's lock duration, renewed over $management); only that link
// gets the session's messages, oldest first. The session is free again when
// the link detaches or the lock expires — then the messages it had locked
// come back (an expiry counts as a delivery, as a message lock's does), and
// the link is detached with com.microsoft:session-lock-lost.
//
// The attach (what the SDK does, azservicebus v1.11.0 session_receiver.go):
// the source carries the filter com.microsoft:session-filter (described by
// 0x137000000C) whose value is the session id (AcceptSession*) or null
// (AcceptNextSession*: any free session with a message, the one whose oldest
// message is oldest; the link property com.microsoft:timeout says how long to
// wait for one, in ms). The answer echoes the filter with the granted id and
// carries com.microsoft:locked-until-utc (int64 .NET ticks) in its
// properties. A refusal is an attach with a null source, then a detach with
// the error: com.microsoft:session-cannot-be-locked (held by another link),
// com.microsoft:timeout (no session came free in time), amqp:not-allowed
// (a session link on a subscription without sessions, or the reverse).
const SESSION_FILTER = 'com.microsoft:session-filter';
const SESSION_FILTER_CODE = 0x137000000C;
const EPOCH_TICKS = 621355968000000000n;

function session(q, id) {
  let s = q.sessions.get(id);
  if (!s) {
    s = { id, holder: null, lockedUntil: 0, timer: null, state: null };
    q.sessions.set(id, s);
  }
  return s;
}

// ticks is t (ms since the epoch) as the int64 .NET ticks the SDK reads
// (an AMQP long, written from a BigInt: ticks do not fit a double).
function ticks(t) {
  const b = Buffer.alloc(8);
  b.writeBigInt64BE(BigInt(t) * 10000n + EPOCH_TICKS);
  return types.wrap_long(b);
}

// sessionFilter reads the session filter of an attach's source: undefined
// when there is none, else {id} (null for "the next free session").
function sessionFilter(source) {
  const f = source && source.filter;
  if (!f) return undefined;
  for (const [k, v] of Object.entries(f)) {
    if (k !== SESSION_FILTER) continue;
    let id = v;
    while (id && typeof id === 'object' && !Buffer.isBuffer(id) && 'value' in id) id = id.value; // described, typed
    return { id: id === null || id === undefined ? null : String(id) };
  }
  return undefined;
}

// nextFree is the free session whose oldest available message is the oldest.
function nextFree(q) {
  for (const m of q.messages) {
    if (m.lockedUntil || m.sessionId === undefined) continue;
    const s = session(q, m.sessionId);
    if (!s.holder) return s;
  }
  return undefined;
}

function armSessionLock(q, s) {
  clearTimeout(s.timer);
  const link = s.holder;
  const until = s.lockedUntil;
  s.timer = setTimeout(() => {
    if (s.holder === link && s.lockedUntil === until) expireSession(q, s, 'lock-expired');
  }, Math.max(0, until - Date.now()));
  s.timer.unref();
}

function grant(q, s, link, deferred, named) {
  s.holder = link;
  s.lockedUntil = Date.now() + q.lockMs;
  armSessionLock(q, s);
  link.aqQueue = q;
  link.aqSession = s;
  link.set_source({ address: link.aqAddress, filter: { [SESSION_FILTER]: types.wrap_described(s.id, SESSION_FILTER_CODE) } });
  // A plain object: rhea wraps it; a pre-wrapped map would be encoded twice.
  link.local.attach.properties = { 'com.microsoft:locked-until-utc': ticks(s.lockedUntil) };
  q.consumers.add(link);
  log('session-accept', { queue: q.path, session: s.id, link: link.name, named, lockedUntil: new Date(s.lockedUntil).toISOString() });
  if (deferred) link.attach();
  setImmediate(() => pump(q));
}

// refuseSession answers a session attach with a null source, then a detach
// carrying the error (go-amqp reads a missing source as a refusal and waits
// for the detach's error).
function refuseSession(link, condition, description, deferred) {
  log('attach', { address: link.aqAddress, role: 'receiver', refused: condition, description, link: link.name });
  link.local.attach.source = null;
  if (deferred) link.attach();
  link.close({ condition, description });
}

function serveWaiting(q) {
  while (q.waiting.length > 0) {
    const w = q.waiting[0];
    if (!linkAlive(w.link)) {
      q.waiting.shift();
      clearTimeout(w.timer);
      continue;
    }
    const s = nextFree(q);
    if (!s) return;
    q.waiting.shift();
    clearTimeout(w.timer);
    grant(q, s, w.link, true, false);
  }
}

const linkAlive = (l) => l.state.remote_open && l.session.is_remote_open() && !l.connection.aqGone;

// releaseSession frees s: the messages its holder had locked come back.
function releaseSession(q, s, reason, counts) {
  const link = s.holder;
  if (!link) return;
  s.holder = null;
  s.lockedUntil = 0;
  clearTimeout(s.timer);
  q.consumers.delete(link);
  link.aqSession = undefined;
  log('session-release', { queue: q.path, session: s.id, link: link.name, reason });
  for (const m of [...q.messages]) {
    if (m.sessionId === s.id && m.lockedUntil && m.lockLink === link) unlock(q, m, `session-${reason}`, counts);
  }
  save();
  pump(q);
}

// expireSession: the lock ran out (or a test said so). The link is detached
// with session-lock-lost; its client must accept the session again.
function expireSession(q, s, reason) {
  const link = s.holder;
  if (!link) return false;
  releaseSession(q, s, reason, true);
  log('session-lock-expired', { queue: q.path, session: s.id, link: link.name, reason });
  if (link.is_open()) {
    link.close({ condition: 'com.microsoft:session-lock-lost',
      description: `sbpeer: the lock on session ${s.id} expired (${reason}); accept the session again` });
  }
  return true;
}

// sessionRPC answers the session operations on $management; undefined when
// op is not one.
function sessionRPC(q, op, req, ap) {
  const body = req.body || {};
  const lost = (s) => ({ status: 410, description: `sbpeer: the lock on session ${s} was lost (it expired, was released, or is held by another link)`,
    condition: 'com.microsoft:session-lock-lost' });
  const holds = (s) => s && s.holder && linkAlive(s.holder) &&
    (ap['associated-link-name'] === undefined || ap['associated-link-name'] === s.holder.name);
  switch (op) {
    case 'com.microsoft:renew-session-lock': {
      const id = String(body['session-id']);
      const s = q.sessions.get(id);
      if (!holds(s)) return lost(id);
      s.lockedUntil = Date.now() + q.lockMs;
      armSessionLock(q, s);
      log('session-renew', { queue: q.path, session: id, link: s.holder.name, lockedUntil: new Date(s.lockedUntil).toISOString() });
      return { status: 200, body: { expiration: new Date(s.lockedUntil) } };
    }
    case 'com.microsoft:get-session-state': {
      const id = String(body['session-id']);
      const s = q.sessions.get(id);
      if (!holds(s)) return lost(id);
      return { status: 200, body: { 'session-state': s.state ? s.state : null } };
    }
    case 'com.microsoft:set-session-state': {
      const id = String(body['session-id']);
      const s = q.sessions.get(id);
      if (!holds(s)) return lost(id);
      const st = body['session-state'];
      s.state = st === null || st === undefined ? null : Buffer.from(st);
      save();
      return { status: 200 };
    }
    case 'com.microsoft:get-message-sessions': {
      const ids = [];
      for (const m of q.messages) if (m.sessionId !== undefined && !ids.includes(m.sessionId)) ids.push(m.sessionId);
      for (const s of q.sessions.values()) if (s.state && !ids.includes(s.id)) ids.push(s.id);
      const skip = Number(body.skip || 0);
      const top = Number(body.top || 100);
      const page = ids.slice(skip, skip + top);
      if (page.length === 0) return { status: 204, description: 'No Content' };
      return { status: 200, body: { 'sessions-ids': page } };
    }
  }
  return undefined;
}

// control runs one test command from stdin.
function control(line) {
  let c;
  try {
    c = JSON.parse(line);
  } catch (e) {
    return log('control', { result: 'bad-command', error: String(e.message) });
  }
  let result = 'unknown-op';
  if (c.op === 'expire-session-lock') {
    const q = queues[String(c.queue || '').toLowerCase()];
    const s = q && q.sessions.get(String(c.session));
    result = !q ? 'no-queue' : s && expireSession(q, s, 'told') ? 'expired' : 'not-held';
  }
  log('control', { id: c.id, operation: c.op, queue: c.queue, session: c.session, result });
}

// ---- $cbs and $management -------------------------------------------------
function audiencePath(name) {
  try {
    return decodeURIComponent(new URL(String(name)).pathname).replace(/^\/+|\/+$/g, '').toLowerCase();
  } catch (e) {
    return String(name).toLowerCase();
  }
}

function rpc(conn, link, req) {
  const ap = req.application_properties || {};
  const target = link.aqAddress;
  let status = 200;
  let description = 'OK';
  let body;
  let condition;
  if (target === '$cbs') {
    const type = String(ap.type || '');
    const aud = audiencePath(ap.name);
    if (ap.operation !== 'put-token' || !/^(servicebus\.windows\.net:sastoken|jwt)$/.test(type)) {
      status = 400;
      description = `sbpeer: $cbs accepts put-token with a sastoken or jwt, got ${ap.operation} ${type}`;
    } else {
      status = 202;
      description = 'Accepted';
      conn.aqTokens.add(aud);
    }
    log('put-token', { audience: ap.name, path: aud, type, tokenHash: hash(req.body), status });
  } else {
    const entity = target.replace(/\/\$management$/i, '').toLowerCase();
    const q = queues[entity];
    const op = String(ap.operation || '');
    const sr = q ? sessionRPC(q, op, req, ap) : undefined;
    if (sr) {
      ({ status, body } = sr);
      if (sr.description) description = sr.description;
      if (sr.condition) condition = sr.condition;
    } else if (op === 'com.microsoft:peek-message' && q) {
      const from = Number(req.body['from-sequence-number'] || 0);
      const count = Number(req.body['message-count'] || 1);
      const found = q.messages.filter((m) => m.seq >= from).slice(0, count);
      if (found.length === 0) {
        status = 204;
        description = 'No Content';
      } else {
        body = { messages: found.map((m) => ({ message: amqpmsg.encode({
          message_id: m.messageId, ...m.props, body: amqpmsg.data_section(m.body), application_properties: m.app,
          message_annotations: { 'x-opt-sequence-number': types.wrap_long(m.seq), 'x-opt-enqueued-time': new Date(m.enqueued) },
        }) })) };
      }
    } else {
      // Not modelled: say so, never pretend it worked.
      status = 501;
      description = `sbpeer does not model $management operation ${op} on ${target}`;
    }
    log('management', { entity: target, operation: op, status, session: req.body && req.body['session-id'] });
  }
  const out = conn.aqReplies.get(req.reply_to);
  if (!out) {
    log('internal-error', { error: `no reply link for ${req.reply_to}` });
    return;
  }
  out.send({
    correlation_id: req.message_id,
    to: req.reply_to,
    application_properties: { 'status-code': types.wrap_int(status), 'status-description': description,
      ...(condition ? { 'error-condition': types.wrap_symbol(condition) } : {}) },
    body,
  });
}

// ---- links -----------------------------------------------------------------
const isRPC = (addr) => addr === '$cbs' || /\/\$management$/i.test(addr);

function mirror(link, terminus) {
  const remote = link.remote.attach;
  link.local.attach.snd_settle_mode = remote.snd_settle_mode;
  link.local.attach.rcv_settle_mode = remote.rcv_settle_mode;
  const addr = (remote[terminus] && remote[terminus].address) || '';
  if (terminus === 'source') link.set_source({ address: addr });
  else link.set_target({ address: addr });
  // fresh terminus for the other end, so the client sees a complete attach
  if (terminus === 'source') link.set_target({ address: (remote.target && remote.target.address) || '' });
  else link.set_source({ address: (remote.source && remote.source.address) || '' });
  return addr;
}

function refuse(link, condition, description) {
  log('attach', { address: link.aqAddress, role: link.is_sender() ? 'receiver' : 'sender', refused: condition, description });
  link.close({ condition, description });
}

function authorized(conn, path) {
  return conn.aqTokens.has(path.toLowerCase());
}

function onSenderOpen(context) { // the client attached a receiving link
  const link = context.sender;
  const conn = context.connection;
  const addr = mirror(link, 'source');
  link.aqAddress = addr;
  const remote = link.remote.attach;
  if (isRPC(addr)) {
    conn.aqReplies.set(remote.target && remote.target.address, link);
    log('attach', { address: addr, role: 'receiver', kind: 'rpc-reply' });
    return;
  }
  const q = queues[addr.toLowerCase()];
  if (!q) {
    // A session receiver checks the attach's echoed filter before it reads
    // the detach: refuse it the spec's way (null source, then the error).
    if (sessionFilter(remote.source)) return refuseSession(link, 'amqp:not-found', `sbpeer: no entity ${addr}`);
    return refuse(link, 'amqp:not-found', `sbpeer: no entity ${addr}`);
  }
  if (!authorized(conn, addr)) return refuse(link, 'amqp:unauthorized-access', `sbpeer: no put-token for ${addr} on this connection`);
  const sf = sessionFilter(remote.source);
  if (sf) return acceptSession(link, q, sf.id);
  if (q.requiresSession) {
    return refuseSession(link, 'amqp:not-allowed', `It is not possible for an entity that requires sessions to create a non-sessionful message receiver (sbpeer: ${addr} requires sessions)`, false);
  }
  link.aqQueue = q;
  q.consumers.add(link);
  log('attach', { address: addr, role: 'receiver', kind: 'entity', rcvSettleMode: remote.rcv_settle_mode, link: link.name });
  setImmediate(() => pump(q));
}

// acceptSession is a session link's attach: grant the named session, or the
// next free one — waiting up to the link's com.microsoft:timeout for one.
function acceptSession(link, q, id) {
  if (!q.requiresSession) {
    return refuseSession(link, 'amqp:not-allowed', `A sessionful message receiver cannot be created on an entity that does not require sessions (sbpeer: ${q.path} does not require sessions)`, false);
  }
  if (id !== null) {
    const s = session(q, id);
    if (s.holder && linkAlive(s.holder)) {
      return refuseSession(link, 'com.microsoft:session-cannot-be-locked', `sbpeer: the session ${id} is locked by another receiver`, false);
    }
    if (s.holder) releaseSession(q, s, 'holder-gone', true);
    return grant(q, s, link, false, true);
  }
  const s = nextFree(q);
  if (s) return grant(q, s, link, false, false);
  // Wait for a session: hold the attach back (rhea opened the link as it
  // dispatched the event; undo that until we answer).
  link.state.local_open = false;
  link.state.open_requests = 0;
  const props = link.remote.attach.properties || {};
  const t = Number(props['com.microsoft:timeout']);
  // Without the property the service waits its default (60 s; --session-wait-ms).
  const ms = Number.isFinite(t) && t > 0 ? t : cfg.sessionWaitMs;
  const w = { link };
  w.timer = setTimeout(() => {
    const i = q.waiting.indexOf(w);
    if (i < 0) return;
    q.waiting.splice(i, 1);
    if (linkAlive(link)) refuseSession(link, 'com.microsoft:timeout', `sbpeer: no session of ${q.path} came free in ${ms} ms`, true);
  }, ms);
  q.waiting.push(w);
  log('session-wait', { queue: q.path, link: link.name, timeoutMs: ms });
}

function onReceiverOpen(context) { // the client attached a sending link
  const link = context.receiver;
  const conn = context.connection;
  const addr = mirror(link, 'target');
  link.aqAddress = addr;
  if (isRPC(addr)) {
    if (addr !== '$cbs' && !authorized(conn, addr)) return refuse(link, 'amqp:unauthorized-access', `sbpeer: no put-token for ${addr}`);
    if (addr !== '$cbs' && !queues[addr.replace(/\/\$management$/i, '').toLowerCase()] && !topics[addr.replace(/\/\$management$/i, '').toLowerCase()]) {
      return refuse(link, 'amqp:not-found', `sbpeer: no entity for ${addr}`);
    }
    log('attach', { address: addr, role: 'sender', kind: 'rpc-request' });
    return;
  }
  const topic = topics[addr.toLowerCase()];
  if (!topic) return refuse(link, 'amqp:not-found', `sbpeer: no topic ${addr} (sending to a subscription is not allowed)`);
  if (!authorized(conn, addr)) return refuse(link, 'amqp:unauthorized-access', `sbpeer: no put-token for ${addr} on this connection`);
  link.aqTopic = topic;
  log('attach', { address: addr, role: 'sender', kind: 'entity' });
}

function detach(link) {
  const q = link.aqQueue;
  if (!q) {
    for (const x of Object.values(queues)) dropWaiting(x, (w) => w.link === link);
    return;
  }
  q.consumers.delete(link);
  const s = link.aqSession;
  if (s && s.holder === link) releaseSession(q, s, 'closed', true);
}

function dropWaiting(q, gone) {
  for (const w of q.waiting.filter(gone)) {
    clearTimeout(w.timer);
    q.waiting.splice(q.waiting.indexOf(w), 1);
  }
}

// ---- server ----------------------------------------------------------------
// tcp_no_delay: without it Nagle + delayed ACK add ~40 ms to every round trip.
const container = rhea.create_container({ id: 'sbpeer', tcp_no_delay: true });
container.options.sender_options = { treat_modified_as_released: false, autosettle: false };
container.options.receiver_options = { autoaccept: true };
container.on('connection_open', (c) => {
  c.connection.aqTokens = new Set();
  c.connection.aqReplies = new Map();
  log('connection', { state: 'open', container: c.connection.remote.open && c.connection.remote.open.container_id });
});
container.on('sender_open', (c) => guard(onSenderOpen, c));
container.on('receiver_open', (c) => guard(onReceiverOpen, c));
container.on('message', (c) => guard((ctx) => {
  const link = ctx.receiver;
  if (link.aqTopic) publish(link.aqTopic, ctx.message);
  else if (isRPC(link.aqAddress || '')) rpc(ctx.connection, link, ctx.message);
}, c));
container.on('sendable', (c) => c.sender.aqQueue && pump(c.sender.aqQueue));
container.on('accepted', (c) => guard(settle, c, 'complete'));
container.on('modified', (c) => guard(settle, c, 'abandon'));
container.on('released', (c) => guard(settle, c, 'release'));
container.on('rejected', (c) => guard(settle, c, 'dead-letter'));
for (const ev of ['sender_close', 'sender_error', 'receiver_close', 'receiver_error']) {
  container.on(ev, (c) => detach(c.sender || c.receiver));
}
for (const ev of ['session_close', 'session_error']) {
  container.on(ev, (c) => guard(() => {
    for (const q of Object.values(queues)) {
      for (const l of [...q.consumers]) if (l.session === c.session) detach(l);
      dropWaiting(q, (w) => w.link.session === c.session);
    }
  }));
}
container.on('disconnected', (c) => guard(() => {
  const conn = c.connection;
  conn.aqGone = true;
  for (const q of Object.values(queues)) {
    for (const l of [...q.consumers]) if (l.connection === conn) detach(l);
    dropWaiting(q, (w) => w.link.connection === conn);
  }
  log('connection', { state: 'closed' });
}));
container.on('error', (e) => log('link-error', { error: String(e && e.message) }));

function guard(fn, ...args) {
  try {
    fn(...args);
  } catch (e) {
    log('internal-error', { error: String(e && e.stack) });
  }
}

// ---- management (ATOM) API: subscription runtime properties ---------------
// The answer has the shape of Service Bus's: an Atom entry whose content is a
// SubscriptionDescription with MessageCount and CountDetails. Active counts
// every message in the subscription, locked ones included (as the service
// does); a locked message leaves the count when it is completed.
const started = new Date().toISOString();
function subscriptionEntry(host, topic, name, q) {
  const active = q.messages.length;
  const dead = q.dlq.messages.length;
  const now = new Date().toISOString();
  const c = (tag, n) => `<d2p1:${tag}>${n}</d2p1:${tag}>`;
  return '<entry xmlns="http://www.w3.org/2005/Atom">' +
    `<id>https://${host}/${topic}/Subscriptions/${name}</id><title type="text">${name}</title>` +
    `<published>${started}</published><updated>${now}</updated>` +
    '<content type="application/xml">' +
    '<SubscriptionDescription xmlns="http://schemas.microsoft.com/netservices/2010/10/servicebus/connect" xmlns:i="http://www.w3.org/2001/XMLSchema-instance">' +
    `<LockDuration>PT${Math.round(q.lockMs / 1000)}S</LockDuration><RequiresSession>${q.requiresSession}</RequiresSession>` +
    `<MaxDeliveryCount>${Number.isFinite(q.maxDelivery) ? q.maxDelivery : 10}</MaxDeliveryCount>` +
    `<MessageCount>${active + dead}</MessageCount><Status>Active</Status>` +
    `<CreatedAt>${started}</CreatedAt><UpdatedAt>${started}</UpdatedAt><AccessedAt>${now}</AccessedAt>` +
    '<CountDetails xmlns:d2p1="http://schemas.microsoft.com/netservices/2011/06/servicebus">' +
    c('ActiveMessageCount', active) + c('DeadLetterMessageCount', dead) + c('ScheduledMessageCount', 0) +
    c('TransferMessageCount', 0) + c('TransferDeadLetterMessageCount', 0) +
    '</CountDetails></SubscriptionDescription></content></entry>';
}
function adminRequest(req, res) {
  const url = new URL(req.url, 'https://peer');
  const m = /^\/([^/]+)\/Subscriptions\/([^/]+)$/i.exec(decodeURIComponent(url.pathname));
  const q = m && queues[`${m[1]}/Subscriptions/${m[2]}`.toLowerCase()];
  const auth = req.headers.authorization || '';
  // The peer's one key with Manage rights is "sbpeer"; a SAS signed with any
  // other key name is refused as the service refuses a policy without
  // Manage (a Listen-only key): reading runtime properties needs Manage.
  const skn = /(?:^|[&\s])skn=([^&\s]+)/.exec(auth);
  const manage = !skn || decodeURIComponent(skn[1]) === 'sbpeer';
  log('admin', { method: req.method, path: url.pathname, status: !auth || !manage ? 401 : req.method !== 'GET' ? 405 : q ? 200 : 404 });
  if (!auth) { // the SDK always signs: a SAS token or a bearer token
    res.writeHead(401, { 'Content-Type': 'application/xml' });
    return res.end('<Error><Code>401</Code><Detail>no Authorization header</Detail></Error>');
  }
  if (!manage) {
    res.writeHead(401, { 'Content-Type': 'application/xml' });
    return res.end('<Error><Code>401</Code><Detail>Manage,EntityRead claims required for this operation.</Detail></Error>');
  }
  if (req.method !== 'GET') {
    res.writeHead(405, { 'Content-Type': 'application/xml' });
    return res.end('<Error><Code>405</Code><Detail>this peer answers only reads of subscription runtime properties</Detail></Error>');
  }
  if (!q) {
    res.writeHead(404, { 'Content-Type': 'application/xml' });
    return res.end(`<Error><Code>404</Code><Detail>no subscription ${url.pathname}</Detail></Error>`);
  }
  res.writeHead(200, { 'Content-Type': 'application/atom+xml;type=entry;charset=utf-8' });
  res.end(subscriptionEntry(req.headers.host, m[1], m[2], q));
}
let admin = null;
if (cfg.adminCert) {
  admin = require('https').createServer({ cert: fs.readFileSync(cfg.adminCert), key: fs.readFileSync(cfg.adminKey) },
    (req, res) => guard(adminRequest, req, res));
}

load();
const listenOpts = { host: cfg.host, port: cfg.port };
if (cfg.tlsCert) Object.assign(listenOpts, { transport: 'tls', cert: fs.readFileSync(cfg.tlsCert), key: fs.readFileSync(cfg.tlsKey) });
const server = container.listen(listenOpts);
server.on('listening', () => {
  const { port } = server.address();
  const ready = { event: 'listening', host: cfg.host, port, tls: Boolean(cfg.tlsCert), pid: process.pid };
  const announce = () => {
    process.stdout.write(JSON.stringify(ready) + '\n');
    if (eventsFd !== 1) log('listening', ready);
    for (const q of Object.values(queues)) pump(q);
  };
  if (!admin) return announce();
  admin.listen(cfg.adminPort || 0, cfg.host, () => {
    ready.adminPort = admin.address().port;
    announce();
  });
});
server.on('error', (e) => {
  process.stderr.write(`sbpeer: ${e.message}\n`);
  process.exit(1);
});
// Test control: one JSON command a line on stdin (EOF is not a reason to stop).
require('readline').createInterface({ input: process.stdin }).on('line', (l) => guard(control, l));

for (const sig of ['SIGTERM', 'SIGINT']) {
  process.on(sig, () => {
    save();
    log('stopped', { signal: sig });
    process.exit(0);
  });
}
