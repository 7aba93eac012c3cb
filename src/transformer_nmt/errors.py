"""Errors that are the user's to fix (a bad value, a bad file, a bad combination).

The console scripts (:mod:`transformer_nmt.cli`) print such an error as one line
``error: <message>`` and exit with status 2; any other exception keeps its traceback.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the input or the command; the message names the file, key and values."""


class NoSpaceError(UserError):
    """A write failed because the device is full; the message names the file being written."""


class MissingFileError(UserError, FileNotFoundError):
    """A file the command needs does not exist; the message names it."""
