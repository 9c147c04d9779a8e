"""The one exception type whose message a user sees as is: one line, saying what to do."""

from __future__ import annotations


class SeedbedError(Exception):
    """A problem the user can fix (bad settings, unknown env id, corrupt checkpoint).

    The CLI prints ``str(error)`` as one line and exits non-zero, without a traceback.
    """


class ConfigError(SeedbedError):
    """A setting that does not exist or has an invalid value."""
