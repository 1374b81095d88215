"""Goodput accounting: the per-minute tick, the hourly and weekly ledgers."""
