"""The queue daemon: HTTP API, ingestion and the loops that wire journal, store and runners."""
