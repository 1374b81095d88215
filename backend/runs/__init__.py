"""Runs and their workers: specification, creation, reading, history."""
