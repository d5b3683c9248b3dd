"""Reading queue logfiles: plain or gzip (told apart by their magic bytes), line by
line, in the order of their first line's time."""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterable
from pathlib import Path
from typing import IO

import orjson

from queue_daemon.observe.records import GZIP_MAGIC


class LogFile:
    """One logfile opened for reading; ``position`` is how far into the file on
    disk (compressed bytes for gzip) reading has come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._raw: IO[bytes] = path.open("rb")
        gzipped = self._raw.read(2) == GZIP_MAGIC
        self._raw.seek(0)
        self.lines: IO[bytes] = (
            io.BufferedReader(gzip.GzipFile(fileobj=self._raw, mode="rb"), 1 << 20)
            if gzipped
            else self._raw
        )

    @property
    def position(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        self.lines.close()
        self._raw.close()

    def __enter__(self) -> LogFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def first_time(path: Path, probe: int = 100) -> int | None:
    """The time of the first readable record among the first ``probe`` lines."""
    try:
        with LogFile(path) as log:
            for _, raw in zip(range(probe), log.lines, strict=False):
                try:
                    t = orjson.loads(raw).get("t")
                except (orjson.JSONDecodeError, AttributeError):
                    continue
                if isinstance(t, int):
                    return t
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    return None


def in_time_order(paths: Iterable[Path]) -> list[Path]:
    """Rotated files and live files in the order they were written."""
    keyed = [(first_time(p), p.name, p) for p in paths]
    keyed.sort(key=lambda k: (k[0] if k[0] is not None else math.inf, k[1]))
    return [p for _, _, p in keyed]


def file_size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
