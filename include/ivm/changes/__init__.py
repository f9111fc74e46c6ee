"""Change logs: reading change files (native CDF-style, Debezium) and trimming them into net deltas."""
