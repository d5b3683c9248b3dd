"""Placeholder: built by a later capability (see DESIGN.md)."""
