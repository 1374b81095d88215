"""Dramatiq actors: thin, named ``domain.verb``, each calling services in its own transactions."""
