"""Maintenance algorithms, one module each (DESIGN.md §1)."""
