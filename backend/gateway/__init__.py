"""The gateway: the server's side of the agent protocol (each machine's stream, its commands and
reports). `agent/` is the other side, the process on the machine; the two were once both named
"agents"."""
