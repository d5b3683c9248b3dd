"""The domain leaf: the types every room shares (job types and names, a job
through its life, its options and outcomes, tenants, schedules, the queue's
views). It imports nothing of ours, and every room may import it; the stored
``client-type`` name is built and split only here (``names.JobType``).
"""
