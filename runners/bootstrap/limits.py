"""Set resource limits, then exec a command: the fallback where prlimit is missing.

    python -I -S limits.py as=N cpu=N nofile=N nproc=N fsize=N core=N -- command [args...]

(the names of prlimit's options; ``data=N`` in place of ``as=N`` for node)

Standalone (stdlib only); runs as the handler's user, so it can only lower limits.
"""

import os
import resource
import sys


def main(argv: list[str]) -> None:
    split = argv.index("--")
    values, command = argv[:split], argv[split + 1 :]
    for pair in values:
        name, _, value = pair.partition("=")
        limit = int(value)
        resource.setrlimit(getattr(resource, "RLIMIT_" + name.upper()), (limit, limit))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv[1:])
