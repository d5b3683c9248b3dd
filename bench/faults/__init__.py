"""A random fault campaign: ``python -m bench.faults --rounds N --seed S``.

Each round starts a world of its own (two or three daemons on a fresh
database of one PostgreSQL server the campaign runs, three tenants adding
jobs over HTTP, daemon-run python handlers and pulled jobs run by the client
library's ``Worker``), injects the faults a seeded ``random.Random`` chose
for it, heals them, lets the load drain and checks the invariants of
docs/guarantees.md from the store and from the run log every handler appends
to. See docs/guarantees.md, "The fault campaign".
"""
