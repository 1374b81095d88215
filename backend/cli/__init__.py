"""Command lines: ``astraeus`` (server side) and ``astra`` (the user's CLI)."""
