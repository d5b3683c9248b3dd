"""Ingesting: the journal into the store, and the journals of dead daemons."""
