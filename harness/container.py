"""A container as Docker makes one without ``privileged``, on this machine: the
daemon runs as root in a mount namespace of its own with ``/sys/fs/cgroup``
read-only, under ``deploy/seccomp.json`` (loaded here with libseccomp, as runc
would: its rules for the capabilities the container has) and with Docker's
default capabilities only. AppArmor is not applied (``compose.yaml`` runs the
daemons unconfined by it)."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PROFILE = REPO / "deploy" / "seccomp.json"
# Docker's default capabilities (moby's oci/caps/defaults.go)
CAPS = (
    "chown",
    "dac_override",
    "fowner",
    "fsetid",
    "kill",
    "setgid",
    "setuid",
    "setpcap",
    "net_bind_service",
    "net_raw",
    "sys_chroot",
    "mknod",
    "audit_write",
    "setfcap",
)


def wrapper() -> list[str]:
    """The argv prefix that runs a command in the container (it execs the command)."""
    bounding = ",".join(["-all", *(f"+{c}" for c in CAPS)])
    load = [sys.executable, __file__, str(PROFILE)]
    # every cgroup file system read-only, as Docker mounts them (v2, or v1's many)
    inner = (
        "for m in $(awk '$2 ~ \"^/sys/fs/cgroup\" {print $2}' /proc/self/mounts); do"
        ' mount -o bind,remount,ro "$m" || exit 1; done; exec "$@"'
    )
    return [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        inner,
        "sh",
        *load,
        "setpriv",
        "--bounding-set",
        bounding,
        "--inh-caps",
        "-all",
        "--",
    ]


def _applies(rule: dict[str, object], caps: set[str]) -> bool:
    includes = rule.get("includes") or {}
    excludes = rule.get("excludes") or {}
    assert isinstance(includes, dict) and isinstance(excludes, dict)
    if includes.get("arches") and "amd64" not in includes["arches"]:
        return False
    if excludes.get("arches") and "amd64" in excludes["arches"]:
        return False
    if includes.get("caps") and not set(includes["caps"]) <= caps:
        return False
    return not (excludes.get("caps") and set(excludes["caps"]) & caps)


def load(profile: Path) -> None:
    """Load the profile's filter into this process (root, before the capabilities go)."""
    import pyseccomp as seccomp

    ops = {
        "SCMP_CMP_EQ": seccomp.EQ,
        "SCMP_CMP_LT": seccomp.LT,
        "SCMP_CMP_GT": seccomp.GT,
        "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
        "SCMP_CMP_NE": seccomp.NE,
        "SCMP_CMP_GE": seccomp.GE,
        "SCMP_CMP_LE": seccomp.LE,
    }
    data = json.loads(profile.read_text())
    caps = {f"CAP_{c.upper()}" for c in CAPS}
    rules = seccomp.SyscallFilter(seccomp.ERRNO(data.get("defaultErrnoRet", 1)))
    rules.set_attr(seccomp.Attr.CTL_NNP, 0)  # runc loads it as root, without no_new_privs
    for rule in data["syscalls"]:
        if not _applies(rule, caps):
            continue
        action = (
            seccomp.ALLOW
            if rule["action"] == "SCMP_ACT_ALLOW"
            else seccomp.ERRNO(rule.get("errnoRet", 1))
        )
        args = [
            seccomp.Arg(
                a["index"],
                ops[a["op"]],
                a["value"],
                *([a["valueTwo"]] if a.get("valueTwo") else []),
            )
            for a in rule.get("args") or []
        ]
        for name in rule["names"]:
            # a call this libseccomp or architecture does not know is left out
            with contextlib.suppress(RuntimeError, ValueError, OSError):
                rules.add_rule(action, name, *args)
    rules.load()


if __name__ == "__main__":
    import os

    load(Path(sys.argv[1]))
    os.execvp(sys.argv[2], sys.argv[2:])
