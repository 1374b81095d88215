"""Workers' logs: kept on their machines, fetched over the machine's own stream on request."""
