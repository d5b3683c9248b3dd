'use strict';
// Node bootstrap of a handler context: speaks runners/PROTOCOL.md.
//
// fd 3: frames from the daemon, fd 4: frames to the daemon. A frame is a 4-byte
// big-endian length N followed by N bytes of UTF-8 JSON. fd 1/2 are the
// context's own log; what a handler prints while its job runs (console.log,
// console.info, console.debug, process.stdout.write) is captured and returned
// in the job's `result` frame instead. Standalone: node >= 18 built-ins only.

const fs = require('node:fs');
const net = require('node:net');
const path = require('node:path');
const util = require('node:util');
const vm = require('node:vm');
const Module = require('node:module');
// where modules may come from (the context starts node with `--require` of it;
// here for a bootstrap started without)
require('./node_confine.js');

const { createRequire } = Module;

const IN_FD = 3;
const OUT_FD = 4;
const MAX_FRAME = 64 * 1024 * 1024;
const FILENAME = 'handler.js';
// The same parameters, in the same order, as node's own CommonJS wrapper: a body
// that `node --check handler.cjs` accepts compiles here (runners/node.py relies on it).
const PARAMS = ['exports', 'require', 'module', '__filename', '__dirname'];

// ---------------------------------------------------------------- output (fd 4)

const sleepCell = new Int32Array(new SharedArrayBuffer(4));

function writeAll(buf) {
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(OUT_FD, buf, off, buf.length - off);
    } catch (err) {
      if (err.code !== 'EAGAIN') throw err;
      Atomics.wait(sleepCell, 0, 0, 1); // non-blocking pipe is full: wait 1 ms, retry
    }
  }
}

// One buffer holding the frames of the given JSON strings.
function encode(texts) {
  let total = 0;
  const lens = new Array(texts.length);
  for (let i = 0; i < texts.length; i++) {
    lens[i] = Buffer.byteLength(texts[i]);
    total += 4 + lens[i];
  }
  const buf = Buffer.allocUnsafe(total);
  let off = 0;
  for (let i = 0; i < texts.length; i++) {
    buf.writeUInt32BE(lens[i], off);
    buf.write(texts[i], off + 4, lens[i], 'utf8');
    off += 4 + lens[i];
  }
  return buf;
}

function send(...texts) {
  writeAll(encode(texts));
}

const READY = JSON.stringify({ op: 'ready' });
const DONE = JSON.stringify({ op: 'done' });

function startText(id) {
  return '{"op":"start","id":' + JSON.stringify(id) + '}';
}

// JSON.stringify writes a lone surrogate as a \udXXX escape (a pair it writes as
// is): not UTF-8, and the daemon refuses the frame. Such an escape becomes U+FFFD,
// as invalid UTF-8 does elsewhere. It is an escape only after an even run of
// backslashes (each pair is one escaped backslash of the text).
const LONE_SURROGATE = /(?<!\\)((?:\\\\)*)\\ud[89a-f][0-9a-f]{2}/g;

function resultText(id, exitcode, result, output, emits, emitOver = 0, emitShort = 0, emitCost = 0, progress = null) {
  const message = { op: 'result', id, exitcode, result, output, emits };
  if (progress !== null) message.progress = progress;
  if (emitOver > 0) message.emit_over = emitOver;
  if (emitShort > 0) {
    message.emit_short = emitShort;
    message.emit_cost = emitCost;
  }
  const text = JSON.stringify(message);
  return text.includes('\\ud') ? text.replace(LONE_SURROGATE, '$1\\ufffd') : text;
}

function fatal(message) {
  try {
    send(JSON.stringify({ op: 'fatal', message: String(message) }));
  } finally {
    process.exit(1);
  }
}

// ---------------------------------------------------------------- stdout capture

let capturing = false;
let captured = '';
// A job's output beyond this many characters is dropped (and said so): a result
// frame must stay well under the 64 MiB frame limit or the daemon kills the context.
const OUTPUT_CAP = 16 * 1024 * 1024;
const TRUNCATED = '\n[output truncated by node_boot]\n';

function capture(text) {
  if (captured.length + text.length <= OUTPUT_CAP) captured += text;
  else if (!captured.endsWith(TRUNCATED)) {
    captured += text.slice(0, Math.max(0, OUTPUT_CAP - captured.length)) + TRUNCATED;
  }
}

const stdout = process.stdout;
const realWrite = stdout.write;
const realConsole = { log: console.log, info: console.info, debug: console.debug };

stdout.write = function write(chunk, encoding, cb) {
  if (!capturing) return realWrite.apply(stdout, arguments);
  if (typeof encoding === 'function') {
    cb = encoding;
    encoding = undefined;
  }
  if (typeof chunk === 'string') {
    capture(chunk);
  } else if (ArrayBuffer.isView(chunk)) {
    capture(Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength).toString('utf8'));
  } else if (chunk != null) {
    capture(String(chunk));
  }
  if (typeof cb === 'function') process.nextTick(cb);
  return true;
};

function captureConsole(name) {
  const real = realConsole[name];
  console[name] = function (...args) {
    if (!capturing) return real.apply(console, args);
    capture((args.length === 1 && typeof args[0] === 'string' ? args[0] : util.format(...args)) + '\n');
  };
}
captureConsole('log');
captureConsole('info');
captureConsole('debug');

// ---------------------------------------------------------------- errors

// The message lines of an error plus, for a runtime error, its first frame in
// handler code; for a syntax error "line N: SyntaxError: ..." and the code/caret.
const CODE_FILE = /\b(?:handler|before|beforeEach|afterEach)\.js:\d+/;

function describe(err) {
  if (!(err instanceof Error) && !(err && typeof err.stack === 'string')) {
    try {
      return 'Error: ' + (typeof err === 'string' ? err : util.inspect(err));
    } catch {
      return 'Error: (unprintable value thrown)';
    }
  }
  const stack = typeof err.stack === 'string' ? err.stack : String(err);
  const loc = /^(?:[^\n]*[\\/])?([^\n\\/]+):(\d+)\n([^\n]*)\n([ \t]*\^+[^\n]*)\n\n/.exec(stack);
  if (loc && err.name === 'SyntaxError') {
    const where = loc[1] === FILENAME ? '' : loc[1] + ' ';
    return `${where}line ${loc[2]}: ${err.name}: ${err.message}\n${loc[3]}\n${loc[4]}`;
  }
  const lines = stack.split('\n');
  let i = 0;
  while (i < lines.length && !/^\s+at /.test(lines[i])) i++;
  let head = lines.slice(0, i).join('\n').trim();
  if (!head) head = `${err.name || 'Error'}: ${err.message}`;
  const frame = lines.slice(i).find((l) => CODE_FILE.test(l));
  return frame ? head + '\n' + frame.trim() : head;
}

function logError(what, err) {
  process.stderr.write(`node_boot: ${what}: ${describe(err)}\n`);
}

// ---------------------------------------------------------------- the handler

let handler = null;
let hooks = { beforeEach: null, afterEach: null };
let handlerType = '';
let client = '';
let moduleRef = null;
let requireRef = null;
let running = null; // {reject} while an async handler is awaited

function compile(source, filename) {
  if (source.startsWith('#!')) source = '//' + source;
  return vm.compileFunction(source, PARAMS, { filename });
}

// A hook is a function body that may use `await`; it shares globalThis, `module`
// and `require` with the handler body. Line numbers are kept. (runners/node.py
// check_node(..., hook=True) wraps a hook the same way: keep the two in step.)
function compileHook(source, name) {
  if (!source || !source.trim()) return null;
  const fn = compile('return (async () => {' + source + '\n})();', name + '.js');
  const mod = moduleRef;
  const req = requireRef;
  return () => fn.call(mod.exports, mod.exports, req, mod, FILENAME, process.cwd());
}

// A context of an eid loads one handler per type of it (another `init`); each
// has its own module, and they share the process (globalThis, required modules).
const loaded = new Map(); // type -> {handler, hooks}
let first = null;

async function init(msg) {
  handlerType = String(msg.type || '');
  client = String(msg.client || '');
  const filename = path.join(process.cwd(), FILENAME);
  requireRef = createRequire(filename);
  moduleRef = { exports: {}, id: FILENAME, filename, loaded: false, require: requireRef };
  let before;
  try {
    const body = compile(String(msg.body || ''), FILENAME);
    before = compileHook(msg.before, 'before');
    hooks = {
      beforeEach: compileHook(msg.beforeEach, 'beforeEach'),
      afterEach: compileHook(msg.afterEach, 'afterEach'),
    };
    body.call(moduleRef.exports, moduleRef.exports, requireRef, moduleRef, filename, process.cwd());
    moduleRef.loaded = true;
  } catch (err) {
    return fatal(describe(err));
  }
  if (typeof moduleRef.exports !== 'function') {
    const got = moduleRef.exports === null ? 'null' : typeof moduleRef.exports;
    return fatal(`module.exports must be a function (payload, ctx), got ${got}`);
  }
  handler = moduleRef.exports;
  if (before) {
    try {
      await before();
    } catch (err) {
      return fatal('before: ' + describe(err));
    }
  }
  const record = { handler, hooks, type: handlerType };
  loaded.set(handlerType, record);
  if (first === null) first = record;
  send(READY);
}

// the handler a batch names (its type), or the context's first
function select(type) {
  const record = loaded.get(String(type || '')) || first;
  handler = record.handler;
  hooks = record.hooks;
  handlerType = record.type;
}

// ---------------------------------------------------------------- jobs

const EMITS = Symbol('emits');
const PROGRESS = Symbol('progress');  // the last report not sent yet
const SENT = Symbol('sent');  // when the last progress frame was written (ms)
const PROGRESS_EVERY_MS = 100;  // between progress frames of a job; the last one is kept

// A job's ctx.emit calls, up to `limit` bytes of payloads (the daemon's emit
// limit for the tenant) and while the batch's `budget` ({left}, shared by its
// jobs, or null) lasts, each payload costing it its bytes and 64 KiB more (a
// job, as the add rate counts it); the ones past either are counted, not kept
// (`short`: past the budget only). A job short of the budget runs again: what
// it took is given back, its later calls take nothing, and `cost` says what
// all its calls would have cost (the daemon drops what could never fit).
const JOB_COST = 65536;

class Emits {
  constructor(limit, budget) {
    this.pairs = [];
    this.room = Number.isInteger(limit) ? limit : null;
    this.budget = budget;
    this.over = 0;
    this.short = 0;
    this.taken = 0;
    this.cost = 0;
  }

  add(type, text) {
    if (this.room !== null || this.budget !== null) {
      const size = Buffer.byteLength(text);
      if (this.room !== null && size > this.room) {
        this.over += 1;
        return;
      }
      if (this.budget !== null) {
        const cost = size + JOB_COST;
        this.cost += cost;
        if (this.short > 0 || cost > this.budget.left) {
          this.over += 1;
          this.short += 1;
          this.budget.left += this.taken;
          this.taken = 0;
          return;
        }
        this.budget.left -= cost;
        this.taken += cost;
      }
      if (this.room !== null) this.room -= size;
    }
    this.pairs.push([type, text]);
  }
}

class Ctx {
  constructor(job, emitLimit, budget) {
    this.id = job.id;
    this.attempt = job.attempt;
    // the W3C traceparent of this run's span when the daemon traces, else null
    this.traceparent = job.traceparent ?? null;
    this.type = handlerType;
    this.client = client;
    this[EMITS] = new Emits(emitLimit, budget);
    this[PROGRESS] = null;
    this[SENT] = -Infinity;
  }

  // how far the job is (0 to 1) and what it does: at most one report every
  // 0.1 s leaves at once, the last one always does (with the result)
  progress(fraction, message = '') {
    if (typeof fraction !== 'number' || !Number.isFinite(fraction)) {
      throw new TypeError('ctx.progress: fraction must be a number from 0 to 1');
    }
    if (typeof message !== 'string') throw new TypeError('ctx.progress: message must be a string');
    const report = [Math.min(1, Math.max(0, fraction)), message.slice(0, 200)];
    const now = performance.now();
    if (now - this[SENT] < PROGRESS_EVERY_MS) {
      this[PROGRESS] = report;
      return;
    }
    this[SENT] = now;
    this[PROGRESS] = null;
    const text = JSON.stringify({ op: 'progress', id: this.id, fraction: report[0], message: report[1] });
    send(text.includes('\\ud') ? text.replace(LONE_SURROGATE, '$1\\ufffd') : text);
  }

  emit(type, payload) {
    // as in python: a type that is no string is the caller's error, not a name to guess
    if (typeof type !== 'string') throw new TypeError('ctx.emit: type must be a string');
    let text;
    if (typeof payload === 'string') text = payload;
    else {
      text = JSON.stringify(payload);
      if (text === undefined) text = 'null';
    }
    this[EMITS].add(type, text);
  }
}

function asText(value) {
  if (value === undefined || value === null) return null;
  if (typeof value === 'string') return value;
  const text = JSON.stringify(value);
  return text === undefined ? null : text;
}

// [exitcode, result] for what the handler returned.
function mapReturn(value) {
  if (value === undefined || value === null) return [200, null];
  switch (typeof value) {
    case 'string':
      return [200, value];
    case 'number':
      return Number.isInteger(value) ? [value, null] : [200, asText(value)];
    case 'bigint':
      return [Number(value), null];
    default:
      break;
  }
  if (Array.isArray(value) && value.length === 2) {
    const code = typeof value[0] === 'bigint' ? Number(value[0]) : value[0];
    if (Number.isInteger(code)) return [code, asText(value[1])];
  }
  return [200, asText(value)];
}

function isThenable(v) {
  return v !== null && (typeof v === 'object' || typeof v === 'function') && typeof v.then === 'function';
}

function awaitJob(promise) {
  return new Promise((resolve, reject) => {
    running = { reject };
    promise.then(resolve, reject);
  }).finally(() => {
    running = null;
  });
}

// Runs one job; returns its result frame's JSON text. `pending`, the result
// of the job before it, is written first: it tells the daemon that this job
// starts (only a batch's first job has a start frame of its own).
async function runJob(job, pending, emitLimit, budget) {
  const id = job.id;
  if (pending === null) send(startText(id));
  else send(pending);
  const ctx = new Ctx(job, emitLimit, budget);
  let exitcode;
  let result;
  captured = '';
  capturing = true;
  try {
    let value = handler(job.payload, ctx);
    if (isThenable(value)) value = await awaitJob(value);
    [exitcode, result] = mapReturn(value);
  } catch (err) {
    exitcode = 500;
    result = describe(err);
  }
  capturing = false;
  const output = captured;
  captured = '';
  const emits = ctx[EMITS];
  let text = resultText(id, exitcode, result, output, emits.pairs, emits.over, emits.short, emits.cost, ctx[PROGRESS]);
  if (text.length > MAX_FRAME / 4) {
    const size = Buffer.byteLength(text);
    if (size > MAX_FRAME - 1024 * 1024) {
      const why = `result frame too large (${size} bytes): result and emits dropped`;
      text = resultText(id, 500, why, output.length > 1024 * 1024 ? output.slice(0, 1024 * 1024) + TRUNCATED : output, []);
    }
  }
  return text;
}

async function batch(msg) {
  const jobs = Array.isArray(msg.jobs) ? msg.jobs : [];
  if (hooks.beforeEach) {
    let failure = null;
    try {
      await hooks.beforeEach();
    } catch (err) {
      failure = 'beforeEach: ' + describe(err);
    }
    if (failure !== null) {
      const texts = [];
      for (const job of jobs) {
        texts.push(resultText(job.id, 500, failure, '', []));  // never started
      }
      texts.push(DONE);
      send(...texts);
      return;
    }
  }
  let pending = null;
  // what the batch's jobs may emit together, taken in their order
  const budget = Number.isInteger(msg.emit_batch) ? { left: msg.emit_batch } : null;
  for (const job of jobs) pending = await runJob(job, pending, msg.emit, budget);
  if (hooks.afterEach) {
    if (pending !== null) send(pending);
    pending = null;
    try {
      await hooks.afterEach();
    } catch (err) {
      logError('afterEach', err);
    }
  }
  if (pending === null) send(DONE);
  else send(pending, DONE);
}

// ---------------------------------------------------------------- input (fd 3)

const queue = [];
let busy = false;

async function handle(msg) {
  switch (msg.op) {
    case 'init':
      return init(msg);
    case 'batch':
      if (first === null) return fatal('batch before init');
      select(msg.type);
      return batch(msg);
    case 'exit':
      return process.exit(0);
    default:
      process.stderr.write(`node_boot: unknown op ${JSON.stringify(msg.op)} ignored\n`);
  }
}

async function pump() {
  if (busy) return;
  busy = true;
  try {
    while (queue.length > 0) await handle(queue.shift());
  } catch (err) {
    logError('protocol', err);
    process.exit(2);
  }
  busy = false;
}

function protocolError(message) {
  process.stderr.write(`node_boot: protocol error: ${message}\n`);
  process.exit(2);
}

let chunks = [];
let have = 0;

function onData(chunk) {
  chunks.push(chunk);
  have += chunk.length;
  if (have < 4) return;
  let buf = chunks.length === 1 ? chunks[0] : Buffer.concat(chunks, have);
  let off = 0;
  let got = false;
  while (buf.length - off >= 4) {
    const n = buf.readUInt32BE(off);
    if (n > MAX_FRAME) return protocolError(`frame of ${n} bytes`);
    if (buf.length - off - 4 < n) break;
    let msg;
    try {
      msg = JSON.parse(buf.toString('utf8', off + 4, off + 4 + n));
    } catch (err) {
      return protocolError('bad JSON frame: ' + err.message);
    }
    if (msg === null || typeof msg !== 'object') return protocolError('frame is not an object');
    queue.push(msg);
    got = true;
    off += 4 + n;
  }
  if (off === buf.length) {
    chunks = [];
    have = 0;
  } else {
    buf = off === 0 ? buf : buf.subarray(off);
    chunks = [buf];
    have = buf.length;
  }
  if (got) pump();
}

process.on('uncaughtException', (err) => {
  // An error thrown from a handler's callback (timer, event) fails the job that is
  // being awaited, if any, instead of leaving it hanging until its timeout.
  if (running !== null) running.reject(err);
  else logError('uncaught exception', err);
});
process.on('unhandledRejection', (reason) => {
  logError('unhandled rejection', reason);
});

// A net.Socket on the pipe reads through libuv's non-blocking pipe handle; a
// file stream would park a threadpool thread in read(2), and process.exit()
// inside a handler could then hang waiting for it.
const input = new net.Socket({ fd: IN_FD, readable: true, writable: false });
input.on('data', onData);
input.on('error', (err) => protocolError('reading fd 3: ' + err.message));
input.on('end', () => {
  // the daemon closed our input: finish what was received, then exit
  if (have !== 0) process.stderr.write('node_boot: input closed inside a frame\n');
  queue.push({ op: 'exit' });
  pump();
});
