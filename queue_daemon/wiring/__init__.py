"""Building the daemon's parts from its settings: ``queue_daemon.app`` starts and
stops them, in the order its docstring gives."""
