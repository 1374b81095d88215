"""Webhooks: a workspace's events POSTed to its receivers, signed, retried, at least once."""
