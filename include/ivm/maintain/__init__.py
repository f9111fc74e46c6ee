"""Maintenance algorithms, one module each (docs/design.md §1)."""
