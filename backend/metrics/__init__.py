"""Workers' metric samples: the catalogue, ingest from the agents, range queries, pruning."""
