"""The python bootstrap's result frames (runners/PROTOCOL.md): the common
result (no output, no follow-on job) is written without json's encoder and
must read back as the same message, whatever its id and result hold."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import pytest

import queue_daemon.runners

BOOT = Path(queue_daemon.runners.__file__).parent / "bootstrap" / "python_boot.py"


def _boot() -> ModuleType:
    spec = importlib.util.spec_from_file_location("python_boot_under_test", BOOT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(frame: bytes) -> dict[str, object]:
    size = int.from_bytes(frame[:4], "big")
    assert size == len(frame) - 4
    message = json.loads(frame[4:])
    assert isinstance(message, dict)
    return message


@pytest.mark.parametrize(
    ("exitcode", "result"),
    [(200, None), (404, "not found"), (200, 'quotes " and \\ and \n and \u00e9 \U0001f600'),
     (500, "\ud800 a lone surrogate")],
)  # fmt: skip
def test_a_plain_result_reads_back_as_the_message(exitcode: int, result: str | None) -> None:
    boot = _boot()
    message = {"op": "result", "id": "0123-x", "exitcode": exitcode, "result": result,
               "output": "", "emits": []}  # fmt: skip
    got = _read(boot.result_frame(message, 1.25))
    expected = {"op": "result", "id": "0123-x", "exitcode": exitcode, "result": result, "ms": 1.25}
    if result is not None:  # a lone surrogate cannot be UTF-8: it reads back as "?"
        expected["result"] = result.encode("utf-8", "replace").decode()
    assert got == expected


def test_a_result_with_output_or_follow_on_jobs_keeps_every_field() -> None:
    boot = _boot()
    message = {"op": "result", "id": "j", "exitcode": 200, "result": None,
               "output": "printed\n", "emits": [["t", "{}"]], "emit_over": 2}  # fmt: skip
    assert _read(boot.result_frame(message, 0.5)) == {**message, "ms": 0.5}


def test_an_exit_code_too_long_to_print_fails_the_job_not_the_context() -> None:
    boot = _boot()
    message = {"op": "result", "id": "j", "exitcode": 10**5000, "result": None,
               "output": "", "emits": []}  # fmt: skip
    got = _read(boot.result_frame(message, 0.0))
    assert (got["id"], got["exitcode"]) == ("j", 500)
    assert "do not fit in a frame" in str(got["result"])
