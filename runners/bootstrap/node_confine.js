'use strict';
// Where a node handler's modules may come from: node's builtins, files below the
// context's own directory, and this directory (the project's bootstraps).
//
// Node would otherwise look for a module in every node_modules from the
// requiring file's directory up to `/` (so in /tmp/node_modules and in any
// node_modules above the daemon's data directory: files another tenant may have
// written), in NODE_PATH and in the user's and node's global folders; and an
// ESM `import` of a handler's own file walks up the same way. The context runs
// node with `--require` of this file, so it takes hold before any other code,
// in the context and in every worker thread the handler starts (they inherit
// the option). node_boot.js requires it too, for a bootstrap started without it.

const fs = require('node:fs');
const path = require('node:path');
const Module = require('node:module');
const { isMainThread } = require('node:worker_threads');
const { fileURLToPath } = require('node:url');

// the context's directory, for worker threads whatever the handler's cwd is then
const ROOT_VARIABLE = 'QUEUE_DAEMON_MODULE_ROOT';
const ROOT = (!isMainThread && process.env[ROOT_VARIABLE]) || fs.realpathSync(process.cwd());
const ROOTS = [ROOT, fs.realpathSync(__dirname)];

function allowed(file) {
  return ROOTS.some((root) => file === root || file.startsWith(root + path.sep));
}

function refused(request, code) {
  const err = new Error(
    `Cannot find module '${request}': a handler may load node's own modules and ` +
      'files below its directory only'
  );
  err.code = code;
  return err;
}

function confineRequire() {
  const nodeModulePaths = Module._nodeModulePaths;
  Module._nodeModulePaths = function ownPaths(from) {
    return nodeModulePaths.call(this, from).filter(allowed);
  };
  Module.globalPaths.length = 0;
  const resolveFilename = Module._resolveFilename;
  Module._resolveFilename = function ownFile(request, ...rest) {
    const resolved = resolveFilename.call(this, request, ...rest);
    if (Module.isBuiltin(resolved) || allowed(resolved)) return resolved;
    throw refused(request, 'MODULE_NOT_FOUND');
  };
}

// ESM: `import` in a handler's own .mjs file (or `import()` in its .js files, or a
// `require` of an ES module) resolves with node's ESM resolver, not the above.
function checkUrl(specifier, url) {
  if (url.startsWith('node:') || url.startsWith('data:')) return; // no file to plant
  if (url.startsWith('file:') && allowed(fileURLToPath(url))) return;
  throw refused(specifier, 'ERR_MODULE_NOT_FOUND');
}

// node < 22.15 has no synchronous hooks: the same check runs in node's loader thread
const ASYNC_HOOKS = `
import { fileURLToPath } from 'node:url';
import { sep } from 'node:path';
let roots = [];
export function initialize(data) { roots = data.roots; }
export async function resolve(specifier, context, nextResolve) {
  const found = await nextResolve(specifier, context);
  const url = found.url;
  if (url.startsWith('node:') || url.startsWith('data:')) return found;
  if (url.startsWith('file:')) {
    const file = fileURLToPath(url);
    if (roots.some((root) => file === root || file.startsWith(root + sep))) return found;
  }
  const err = new Error("Cannot find module '" + specifier + "': a handler may load node's own " +
    'modules and files below its directory only');
  err.code = 'ERR_MODULE_NOT_FOUND';
  throw err;
}
`;

function confineImport() {
  if (typeof Module.registerHooks === 'function') {
    Module.registerHooks({
      resolve(specifier, context, nextResolve) {
        const found = nextResolve(specifier, context);
        checkUrl(specifier, found.url);
        return found;
      },
    });
  } else if (typeof Module.register === 'function') {
    const source = 'data:text/javascript,' + encodeURIComponent(ASYNC_HOOKS);
    Module.register(source, { data: { roots: ROOTS } });
  }
  // older node: no hooks at all (docs/security.md says so)
}

if (!global[Symbol.for('queue-daemon.modules-confined')]) {
  global[Symbol.for('queue-daemon.modules-confined')] = true;
  if (isMainThread) process.env[ROOT_VARIABLE] = ROOT;
  confineRequire();
  confineImport();
}
