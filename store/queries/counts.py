"""Counts of waiting jobs per type (0012): summed from job_states and the moves
appended since the last fold, never by counting jobs one by one."""

from __future__ import annotations

# The waiting jobs of the stored types in {scope} (a condition on ``type``), per
# type: ``queued`` (due now or later) and ``blocked``, as of the statement's
# snapshot. Reads one job_states row per (type, state) and the moves appended
# since the last fold (about a second's worth of statements).
STATE_SUMS = """
SELECT type,
       coalesce(sum(n) FILTER (WHERE state = 'q'), 0)::bigint AS queued,
       coalesce(sum(n) FILTER (WHERE state = 'b'), 0)::bigint AS blocked
FROM (
    SELECT type, state, n FROM job_states WHERE {scope}
    UNION ALL
    SELECT type, state, n FROM job_state_moves WHERE {scope}
) s
GROUP BY type
HAVING sum(n) <> 0
"""

# Folds the moves into job_states in one statement: those it deletes are those
# it adds (a fold running at the same time waits on their rows, then finds them
# gone). Rows that fall to 0 are dropped by DROP_EMPTY_STATES.
FOLD_STATES = """
WITH moved AS (
    DELETE FROM job_state_moves RETURNING type, state, n
)
INSERT INTO job_states AS s (type, state, n)
SELECT type, state, sum(n) FROM moved
GROUP BY type, state
HAVING sum(n) <> 0
ORDER BY type, state
ON CONFLICT (type, state) DO UPDATE SET n = s.n + EXCLUDED.n
"""
DROP_EMPTY_STATES = "DELETE FROM job_states WHERE n = 0"  # job_states_empty_idx
# One daemon folds at a time (the others skip that round).
FOLD_LOCK = "SELECT pg_try_advisory_xact_lock(hashtext('qd_fold_states'))"

# $1 lower bound of the tenant's stored types ('client-'), $2 the upper bound
# ('client.'): its waiting, scheduled and blocked jobs (lock '').
COUNT_WAITING = f"""
SELECT coalesce(sum(queued + blocked), 0)::bigint
FROM ({STATE_SUMS.format(scope="type >= $1 AND type < $2")}) c
"""
