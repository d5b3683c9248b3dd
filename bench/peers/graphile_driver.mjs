// graphile-worker in one role, for `python -m bench --peers`: the node twin of
// driver.py, with the same roles, arguments and `RESULT {json}` line, started by
// bench/peers/run.py with the project's node and the packages that
// bench/peers/node_env.py installed (`--modules DIR`: DIR/node_modules).
//
// graphile-worker is used as its documentation's performance page shows: jobs
// added through `makeWorkerUtils` (`addJob` one a call, `addJobs` for batches),
// worker processes of `concurrentJobs` jobs each with a local queue of
// `localQueue.size` jobs (0 here: none) and `completeJobBatchDelay` /
// `failJobBatchDelay` 0. The end to end drains with `runOnce` (its CLI's
// `--once`, which its perfTest times); the latency worker is `run()`, woken by
// its LISTEN/NOTIFY. Jobs of the other queue carry another task identifier,
// which no worker's task list names.
//
// Roles: install, enqueue, fill, work, paced (driver.py says what each does).

import { createRequire } from "node:module";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { parseArgs } from "node:util";

// as its perfTest runs it: no log line for each job done (read when it loads)
process.env.NO_LOG_SUCCESS = "1";

const NAME = "graphile-worker";
const NOOP = "noop";
const DEFAULT_QUEUE = "default";

const { values: opts, positionals } = parseArgs({
  allowPositionals: true,
  options: {
    peer: { type: "string", default: NAME },
    dsn: { type: "string" },
    modules: { type: "string" },
    conns: { type: "string", default: "1" },
    batch: { type: "string", default: "1" },
    "start-at": { type: "string", default: "0" },
    seconds: { type: "string", default: "5" },
    jobs: { type: "string", default: "0" },
    queue: { type: "string", default: DEFAULT_QUEUE },
    concurrency: { type: "string", default: "1" },
    drain: { type: "boolean", default: false },
    samples: { type: "string", default: "0" },
    warm: { type: "string", default: "0" },
    rate: { type: "string", default: "100" },
  },
});
const args = {
  dsn: opts.dsn,
  conns: Number(opts.conns),
  batch: Number(opts.batch),
  startAt: Number(opts["start-at"]),
  seconds: Number(opts.seconds),
  jobs: Number(opts.jobs),
  queue: opts.queue,
  concurrency: Number(opts.concurrency),
  drain: opts.drain,
  samples: Number(opts.samples),
  warm: Number(opts.warm),
  rate: Number(opts.rate),
};

/** Seconds since the epoch, below the millisecond (Python's time.time()). */
const now = () => (performance.timeOrigin + performance.now()) / 1000;
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function result(values) {
  process.stdout.write(`RESULT ${JSON.stringify(values)}\n`);
}

async function load(name) {
  const resolve = createRequire(join(opts.modules, "package.json")).resolve;
  return import(pathToFileURL(resolve(name)).href);
}

const ROLES = ["install", "enqueue", "fill", "work", "paced"];
if (!ROLES.includes(positionals[0]) || opts.peer !== NAME || !args.dsn || !opts.modules) {
  process.stderr.write(
    `usage: graphile_driver.mjs {${ROLES.join(",")}} --peer ${NAME} ` +
      "--dsn DSN --modules DIR [the options of driver.py]\n",
  );
  process.exit(2);
}

const worker = await load("graphile-worker");
const pg = (await load("pg")).default;

// its log to stderr (the bench keeps a child's stderr in a file), without debug
const logger = new worker.Logger(() => (level, message) => {
  if (level !== "debug") {
    process.stderr.write(`[${NAME}] ${level}: ${message}\n`);
  }
});

/** A pg pool of `max` clients, `warm` of them connected before it is used. */
async function openPool(max, warm = max) {
  const pool = new pg.Pool({ connectionString: args.dsn, max });
  pool.on("error", (error) => logger.error(`idle client: ${error}`));
  pool.on("connect", (client) => {
    client.on("error", (error) => logger.error(`client: ${error}`));
  });
  const clients = [];
  for (let i = 0; i < Math.min(max, warm); i++) {
    clients.push(await pool.connect());
  }
  for (const client of clients) {
    client.release();
  }
  return pool;
}

function identifier(queue) {
  return queue === DEFAULT_QUEUE ? NOOP : `${NOOP}_${queue}`;
}

async function add(utils, n, queue = DEFAULT_QUEUE) {
  const task = identifier(queue);
  if (n === 1) {
    await utils.addJob(task, { t: now() });
  } else {
    await utils.addJobs(Array.from({ length: n }, () => ({ identifier: task, payload: {} })));
  }
}

async function withUtils(conns, fn) {
  const pool = await openPool(conns);
  const utils = await worker.makeWorkerUtils({ pgPool: pool, logger });
  try {
    await fn(utils);
  } finally {
    await utils.release();
    await pool.end();
  }
}

async function install() {
  await worker.runMigrations({ connectionString: args.dsn, logger });
  result({ installed: NAME });
}

async function enqueue() {
  await withUtils(args.conns, async (utils) => {
    const end = args.startAt + args.seconds;
    let counted = 0;
    const loop = async () => {
      for (;;) {
        const began = now();
        if (began >= end) {
          return;
        }
        await add(utils, args.batch);
        if (began >= args.startAt && now() <= end) {
          counted += args.batch;
        }
      }
    };
    await Promise.all(Array.from({ length: args.conns }, loop));
    result({ jobs: counted, seconds: args.seconds });
  });
}

async function fill() {
  await withUtils(args.conns, async (utils) => {
    let left = args.jobs;
    const loop = async () => {
      while (left > 0) {
        const n = Math.min(args.batch, left);
        left -= n;
        await add(utils, n, args.queue);
      }
    };
    const t0 = performance.now();
    await Promise.all(Array.from({ length: args.conns }, loop));
    result({ jobs: args.jobs, seconds: (performance.now() - t0) / 1000 });
  });
}

/** Prints READY, then resolves at the bench's SIGUSR1. */
function started() {
  const alive = setInterval(() => {}, 60_000); // a signal handler alone keeps no process up
  const go = new Promise((resolve) => {
    process.once("SIGUSR1", () => {
      clearInterval(alive);
      resolve();
    });
  });
  process.stdout.write("READY\n");
  return go;
}

async function work() {
  // its performance page's pool: concurrentJobs + 1 clients; a few connected
  // before READY, as the Python peers' workers are
  const pool = await openPool(args.concurrency + 1, 4);
  await worker.runMigrations({ pgPool: pool, logger });
  const latencies = [];
  let seen = 0;
  let runner = null;
  let stopping = false;
  const stop = () => {
    if (runner !== null && !stopping) {
      stopping = true;
      runner.stop().catch((error) => logger.error(`stopping: ${error}`));
    }
  };
  const onJob = (stamp) => {
    const started = now();
    seen += 1;
    if (seen > args.warm) {
      latencies.push(1000 * (started - stamp));
    }
    if (args.samples && latencies.length >= args.samples) {
      stop();
    }
  };
  const options = {
    pgPool: pool,
    logger,
    noHandleSignals: true,
    parsedCronItems: worker.parseCronItems([]), // no crontab (not looked for)
    taskList: {
      [NOOP]: (payload) => {
        if (payload && payload.t != null) {
          onJob(payload.t);
        }
      },
    },
    preset: {
      worker: {
        concurrentJobs: args.concurrency,
        localQueue: { size: args.batch > 0 ? args.batch : -1 },
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  };
  await started();
  try {
    if (args.drain) {
      await worker.runOnce(options);
    } else {
      runner = await worker.run(options);
      await runner.promise;
    }
    result({ latencies_ms: latencies, finished: now() });
  } finally {
    await pool.end();
  }
}

async function paced() {
  await withUtils(4, async (utils) => {
    const every = 1000 / args.rate;
    const total = Math.round(args.rate * args.seconds);
    const start = performance.now();
    const pending = [];
    for (let i = 0; i < total; i++) {
      const delay = start + i * every - performance.now();
      if (delay > 0) {
        await sleep(delay);
      }
      pending.push(add(utils, 1));
    }
    await Promise.all(pending);
    result({ jobs: total });
  });
}

const role = { install, enqueue, fill, work, paced }[positionals[0]];
try {
  await role();
} catch (error) {
  process.stderr.write(`${error?.stack ?? error}\n`);
  process.exit(1);
}
