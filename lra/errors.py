"""Errors the harness raises for bad input.

Every message says what is wrong and what to run or change. The command-line
entry points catch :class:`LRAError`, print its message and exit with status 2,
so a user sees one clear line instead of a traceback.
"""


class LRAError(Exception):
    """Base class for a user-facing error (bad config, missing data, bad file)."""


class ConfigError(LRAError):
    """A configuration value is unknown or inconsistent."""


class DataError(LRAError):
    """Data is missing, malformed or cannot be written."""
