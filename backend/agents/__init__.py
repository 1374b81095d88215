"""The server's side of the agent protocol: each machine's stream, its commands and reports."""
