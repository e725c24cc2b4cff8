"""The Long-Range Arena harness: data, models, training loop, measurement, records, report.

Subpackages, lowest layer first (``pyproject.toml``'s import-linter contract holds the order):
``config`` (schema, compose, setting, identity), ``data`` / ``models`` / ``device`` (what the
backend measures), ``record`` (the store), ``run`` / ``track``, ``train``, ``measure`` /
``report``, and ``cli``.
"""

__version__ = "0.1.0"
