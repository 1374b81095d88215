"""Organisations, their clusters and pools, and their workspaces."""
