"""Running handlers: warm sandboxed contexts (python, node), shell and http runners.

The daemon uses ``queue_daemon.runners.pool.RunnerPool`` (and
``queue_daemon.runners.check.check_handler`` when a handler is added);
``runners/PROTOCOL.md`` is the contract between a context and its language
bootstrap.
"""
