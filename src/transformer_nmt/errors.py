"""Errors that are the user's to fix (a bad value, a bad file, a bad combination).

The console scripts (:mod:`transformer_nmt.cli`) print such an error as one line
``error: <message>`` and exit with status 2; any other exception keeps its traceback.
Every kind is defined here; the modules that raise them import them from here.
"""

from __future__ import annotations


class UserError(ValueError):
    """A mistake in the input or the command; the message names the file, key and values."""


class ConfigError(UserError):
    """An invalid configuration found after composition (reported as one ``error:`` line)."""


class Table3Error(UserError):
    """A Table 3 row that cannot be applied to the experiment (names the row, key and values)."""


class DataError(UserError):
    """Bad or missing input data; the message names the file, line and values at fault."""


class WriteError(UserError):
    """A write failed for a cause the user fixes (a full device, a disk quota, the file-size
    limit, a read-only file system); the message names the cause and the file being written,
    and the file's earlier version is left as it was."""


class NoSpaceError(WriteError):
    """A write failed because the device is full; the message names the file being written."""


class MissingFileError(UserError, FileNotFoundError):
    """A file the command needs does not exist; the message names it."""


class MissingDataError(MissingFileError):
    """The prepared data training reads (SentencePiece model, binarized splits) is missing."""


class JsonFileError(UserError):
    """A JSON file of the project (results.json, train_summary.json, a stamp or cache) that
    cannot be read as one: not a regular file, too large, not UTF-8, not JSON, nested too
    deeply or holding a number too large for a float; the message is ``<file>: <problem>``
    (``problem`` holds the part after the file name, for callers that add their advice)."""

    def __init__(self, path: object, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UnreadableCheckpointError(UserError, RuntimeError):
    """A checkpoint file that ``torch.load(weights_only=True)`` cannot read (empty, truncated,
    another format, or Python objects that are refused); the message names the file and its
    size."""


class ExportError(UserError):
    """A model or folder that cannot be converted exactly (export or import); the message
    says why."""


class NotWritableError(ExportError):
    """The folder an export should go to cannot be created or written (permissions, a
    read-only file system)."""
