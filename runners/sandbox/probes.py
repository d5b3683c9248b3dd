"""What the sandbox finds on the machine when it starts: ``unshare`` for a network
namespace, ``ip`` for its loopback, a python the run-as user can run; and the
scrubbed environment every handler process gets."""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from queue_daemon.runners.errors import SandboxError
from queue_daemon.runners.sandbox.users import RunAs

logger = logging.getLogger(__name__)

SAFE_PATH = "/usr/local/bin:/usr/bin:/bin"
IP_PATH = "/usr/sbin:/sbin:" + SAFE_PATH


def scrubbed_env(home: Path) -> dict[str, str]:
    """The whole environment of a handler: nothing of the daemon's."""
    return {
        "PATH": SAFE_PATH,
        "HOME": str(home),
        "TMPDIR": str(home),
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def find_unshare(run_as: RunAs | None, work_root: Path) -> str | None:
    """``unshare`` if it works here (handlers then get no network), else None (warned)."""
    why = ""
    unshare = shutil.which("unshare", path=SAFE_PATH)
    if run_as is None:
        why = "the daemon is not root"
    elif unshare is None:
        why = "util-linux unshare is missing"
    else:
        try:
            done = subprocess.run(
                [unshare, "--net", "--", "true"],
                env=scrubbed_env(work_root),
                cwd="/",
                capture_output=True,
                timeout=30,
                check=False,
            )
            if done.returncode == 0:
                return unshare
            why = f"unshare --net fails: {done.stderr.decode(errors='replace').strip()}"
        except (OSError, subprocess.SubprocessError) as exc:
            why = f"unshare --net fails: {exc}"
    logger.warning(
        "handlers have network access (%s)",
        why,
        extra={"action": "sandbox_network"},
    )
    return None


def find_private_mounts(unshare: str, work_root: Path) -> bool:
    """Whether handlers can get IPC and mount namespaces of their own, with a
    private tmpfs on /dev/shm (else they share the host's: logged)."""
    probe = "mount -t tmpfs -o size=1m,mode=1777,nosuid,nodev tmpfs /dev/shm"
    try:
        done = subprocess.run(
            [unshare, "--ipc", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", probe],
            env=scrubbed_env(work_root),
            cwd="/",
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        why = str(exc)
    else:
        if done.returncode == 0:
            return True
        why = done.stderr.decode(errors="replace").strip()
    logger.warning(
        "handlers share the host's /dev/shm, /tmp and System V IPC (%s)",
        why,
        extra={"action": "sandbox_mounts"},
    )
    return False


def find_ip(unshare: str, work_root: Path) -> str | None:
    """``ip`` if it can bring a new namespace's loopback up, else None (left down)."""
    ip = shutil.which("ip", path=IP_PATH)
    if ip is None:
        return None
    try:
        done = subprocess.run(
            [unshare, "--net", "--", ip, "link", "set", "lo", "up"],
            env=scrubbed_env(work_root),
            cwd="/",
            capture_output=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        logger.info(
            "handlers' loopback stays down: ip link set lo up fails: %s",
            done.stderr.decode(errors="replace").strip(),
            extra={"action": "sandbox_loopback"},
        )
        return None
    return ip


def find_python(setting: str | None, run_as: RunAs | None, work_root: Path) -> str:
    """An interpreter the run-as user can run: the configured one, else the daemon's
    own, else python3 on the safe PATH (the daemon's may sit in root's home)."""
    if setting is not None:
        candidates = [setting]
    else:
        system = shutil.which("python3", path=SAFE_PATH)
        candidates = [sys.executable, *([system] if system else [])]
    if run_as is None:
        return candidates[0]
    for python in candidates:
        if runs_as(run_as, [python, "-I", "-c", "pass"], work_root):
            if python != candidates[0]:
                logger.info(
                    "python handlers run %s: %s is not usable by %s",
                    python,
                    candidates[0],
                    run_as.name,
                    extra={"action": "python_chosen"},
                )
            return python
    raise SandboxError(f"no python that user {run_as.name} can run: tried {candidates}")


def runs_as(run_as: RunAs, argv: list[str], work_root: Path) -> bool:
    """Whether ``argv`` runs (exit 0) as ``run_as``."""
    done = _run_as(run_as, argv, work_root)
    return done is not None and done.returncode == 0


def _run_as(
    run_as: RunAs | None, argv: list[str], work_root: Path
) -> subprocess.CompletedProcess[bytes] | None:
    """``argv`` run to its end as ``run_as`` (None: the daemon's user); None if it
    could not be started or did not end within 30 s."""
    user: dict[str, Any] = (
        {} if run_as is None else {"user": run_as.uid, "group": run_as.gid, "extra_groups": []}
    )
    try:
        return subprocess.run(
            argv,
            env=scrubbed_env(work_root),
            cwd="/",
            capture_output=True,
            timeout=30,
            check=False,
            **user,
        )
    except (OSError, subprocess.SubprocessError):
        return None


# what an interpreter needs to start and import its libraries: its standard
# library and packages, its executable's directory (and the real one's), and a
# virtualenv's pyvenv.cfg
PYTHON_PATHS = """
import os, sys, sysconfig
paths = sysconfig.get_paths()
found = [paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
found += [os.path.dirname(sys.executable), os.path.dirname(os.path.realpath(sys.executable))]
cfg = os.path.join(os.path.dirname(os.path.dirname(sys.executable)), "pyvenv.cfg")
print("\\n".join(found + ([cfg] if os.path.exists(cfg) else [])))
"""


def python_paths(python: str, run_as: RunAs | None, work_root: Path) -> list[str]:
    """What ``python`` (as ``run_as``) needs to run (``PYTHON_PATHS``); [] if it
    cannot tell."""
    done = _run_as(run_as, [python, "-I", "-c", PYTHON_PATHS], work_root)
    if done is None or done.returncode != 0:
        return []
    return [line for line in done.stdout.decode().splitlines() if line.startswith("/")]
