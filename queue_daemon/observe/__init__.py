"""What the daemon shows of itself: metrics, the queue logfile, throughput and the overview."""
