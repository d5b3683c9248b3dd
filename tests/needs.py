"""Tests that need something of the machine (root, a tool, a browser): skipped
with the reason where it is missing, but a failure under ``CI=true``, where
everything the README's test command installs must be there."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def missing(test: str, why: str) -> NoReturn:
    """Skip (or, in CI, fail) ``test`` because ``why``."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{test} cannot run in CI: {why}")
    pytest.skip(why)
