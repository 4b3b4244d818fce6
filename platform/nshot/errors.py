"""The errors nshot reports to users: one line, no traceback (``nshot: error: ...``, exit 2).

Every module of the platform and every method raises these (or subclasses of them); the
command line prints any :class:`NshotError` as one line. They live here, below everything
else, so that a module needing an error class imports nothing more.
"""

from __future__ import annotations


class NshotError(Exception):
    """Base class of the errors nshot reports to users (printed without a traceback)."""


class ConfigError(NshotError, ValueError):
    """A configuration is invalid; the message names the offending field."""


class UnknownMethodError(NshotError, KeyError):
    """No method is registered under that name."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class CheckpointError(NshotError):
    """A checkpoint is missing, corrupt, too large, or belongs to another method."""


class StorageError(NshotError):
    """Writing to a run's storage failed (no space, permission denied, a read-only file
    system, a vanished directory); the message names the path, what happened, the newest
    complete checkpoint and the command that resumes the run."""
