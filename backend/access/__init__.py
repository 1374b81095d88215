"""Who is asking: bearer tokens, workspaces and organisation admins."""
