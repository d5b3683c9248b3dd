"""What the tests and the fault campaign (``bench.faults``) both use to drive real
processes: a PostgreSQL server (``pgserver``), daemons and the CLI as an operator
runs them (``daemons``), a tenant's HTTP view with deadline polling (``api``),
and DSN helpers (``databases``).

It is not installed (``pyproject.toml`` packages only ``queue_daemon``); it is
imported from a checkout. It imports neither pytest nor ``tests``, so that
``python -m bench.faults`` runs without the test tools
(``tests/unit/test_layering.py`` checks both).
"""
