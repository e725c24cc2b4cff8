"""Configs: the typed schema, composing, the run's setting and its identity."""
