"""The runners' exceptions: one base, so the daemon can catch the package's failures."""


class RunnerError(Exception):
    """Base of every error the runners raise."""


class ProtocolError(RunnerError):
    """A context broke runners/PROTOCOL.md (bad frame, unexpected message)."""


class FrameTooLarge(ProtocolError):
    """A frame over the 64 MiB limit, in either direction."""


class ContextFailed(RunnerError):
    """A context could not start: its handler failed to load (``fatal``) or it died."""


class ModuleError(RunnerError, ValueError):
    """A wasm module that cannot be read or is not a WASI command; the message says why."""


class SandboxError(RunnerError):
    """The sandbox cannot be set up (work root, run-as user)."""
