"""Running pushed jobs: what to claim, batches in contexts, results and follow-on jobs."""
