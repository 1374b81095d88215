"""Workspaces' credentials: set or declared by users, given to workers by their agents."""
