"""WebAssembly modules (WASI preview-1 commands, in the text format) for the
tests and the bench: each returns the module's text."""

from __future__ import annotations

_IMPORTS = """
  (import "wasi_snapshot_preview1" "fd_write"
    (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_read"
    (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
"""
_WRITE = """
  (memory (export "memory") 1)
  ;; write len bytes at ptr to fd; the iovec lives at 0..8, the count at 8
  (func $write (param $fd i32) (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (local.get $fd) (i32.const 0) (i32.const 1) (i32.const 8))))
"""


def _data(text: str, at: int = 64) -> tuple[str, int]:
    raw = text.encode()
    escaped = "".join(f"\\{b:02x}" for b in raw)
    return f'(data (i32.const {at}) "{escaped}")', len(raw)


def module(start: str, *, extra: str = "", imports: str = "") -> str:
    return f'(module {_IMPORTS}{imports}{_WRITE}\n{extra}\n  (func (export "_start") {start}))'


def noop() -> str:
    return '(module (memory (export "memory") 1) (func (export "_start")))'


def prints(text: str, fd: int = 1, exit: int | None = None) -> str:
    """Writes ``text`` to ``fd``, then exits with ``exit`` (or returns)."""
    data, size = _data(text)
    end = "" if exit is None else f"(call $proc_exit (i32.const {exit}))"
    return module(
        f"(call $write (i32.const {fd}) (i32.const 64) (i32.const {size})) {end}", extra=data
    )


def echo() -> str:
    """Copies its stdin to its stdout (the iovec for reads at 16, the buffer at 1024)."""
    return module(
        """
    (local $n i32)
    (block $done
      (loop $more
        (i32.store (i32.const 16) (i32.const 1024))
        (i32.store (i32.const 20) (i32.const 60000))
        (br_if $done (call $fd_read (i32.const 0) (i32.const 16) (i32.const 1) (i32.const 24)))
        (local.set $n (i32.load (i32.const 24)))
        (br_if $done (i32.eqz (local.get $n)))
        (call $write (i32.const 1) (i32.const 1024) (local.get $n))
        (br $more)))"""
    )


def spins() -> str:
    return module("(loop $forever (br $forever))")


def floods(fd: int = 1, size: int = 0) -> str:
    """Writes to ``fd`` for ever: a short line at a time, or ``size`` bytes."""
    data, length = _data("flood flood flood flood flood flood flood\n")
    at = 64
    if size:
        at, length = 1024, size
    return module(
        f"(loop $forever (call $write (i32.const {fd}) (i32.const {at}) (i32.const {length}))"
        " (br $forever))",
        extra=data,
    )


def traps() -> str:
    return module("(unreachable)")


def grows(pages: int) -> str:
    """Grows its memory by ``pages`` (64 KiB each): prints ``S: 200 grown``, or
    ``S: 200 refused`` when the growth fails."""
    grown, grown_size = _data("S: 200 grown\n", 64)
    refused, refused_size = _data("S: 200 refused\n", 128)
    return module(
        f"""
    (if (i32.eq (memory.grow (i32.const {pages})) (i32.const -1))
      (then (call $write (i32.const 1) (i32.const 128) (i32.const {refused_size})))
      (else (call $write (i32.const 1) (i32.const 64) (i32.const {grown_size}))))""",
        extra=grown + refused,
    )


def _two_digits(at: str) -> str:
    """Prints the i32 ``at`` (an instruction's text) as two decimal digits."""
    return f"""
    (i32.store8 (i32.const 300) (i32.add (i32.const 48) (i32.div_u {at} (i32.const 10))))
    (i32.store8 (i32.const 301) (i32.add (i32.const 48) (i32.rem_u {at} (i32.const 10))))
    (call $write (i32.const 1) (i32.const 300) (i32.const 2))"""


def calls(name: str, params: str, args: str, *, extra: str = "") -> str:
    """Calls the WASI function ``name`` (its ``params``, e.g. ``i32 i64``) with
    ``args`` (the text of the instructions) and prints ``S: 200 errno <nn>``, its
    result (00: it worked)."""
    imports = (
        f'(import "wasi_snapshot_preview1" "{name}" (func $probe (param {params}) (result i32)))'
    )
    prefix, size = _data("S: 200 errno ", 256)
    return module(
        f"""
    (local $r i32)
    (local.set $r (call $probe {args}))
    (call $write (i32.const 1) (i32.const 256) (i32.const {size}))
    {_two_digits("(local.get $r)")}""",
        extra=prefix + extra,
        imports=imports,
    )


def opens(path: str) -> str:
    """path_open of ``path`` below fd 3 (where a preopened directory would be)."""
    data, size = _data(path, 512)
    return calls(
        "path_open",
        "i32 i32 i32 i32 i32 i64 i64 i32 i32",
        f"(i32.const 3) (i32.const 0) (i32.const 512) (i32.const {size}) (i32.const 0)"
        " (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 600)",
        extra=data,
    )


def accepts() -> str:
    """sock_accept on fd 3 (where a preopened socket would be)."""
    return calls("sock_accept", "i32 i32 i32", "(i32.const 3) (i32.const 0) (i32.const 400)")


def counts_environ() -> str:
    """Prints ``S: 200 env <nn>``, how many environment variables it has."""
    prefix, size = _data("S: 200 env ", 256)
    imports = (
        '(import "wasi_snapshot_preview1" "environ_sizes_get"'
        " (func $sizes (param i32 i32) (result i32)))"
    )
    return module(
        f"""
    (drop (call $sizes (i32.const 400) (i32.const 404)))
    (call $write (i32.const 1) (i32.const 256) (i32.const {size}))
    {_two_digits("(i32.load (i32.const 400))")}""",
        extra=prefix,
        imports=imports,
    )
