"""Strawberry types per domain; ``schema.py`` builds the root."""
