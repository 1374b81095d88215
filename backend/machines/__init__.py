"""GPU machines: registration by their agents, leases, drains and GPU health."""
