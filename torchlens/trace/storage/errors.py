"""The error a saved history raises when a file of it cannot be used."""

from __future__ import annotations

from ...errors import TorchlensError


class HistoryFileError(TorchlensError, ValueError):
    """A file of a saved history is missing, truncated, corrupted, or of an unknown format.

    ``path`` is the file; the message names it and says what is wrong with it.

    Example:
        >>> str(HistoryFileError("run/torchlens.json", "not valid JSON"))
        'run/torchlens.json: not valid JSON'
    """

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path
        self.problem = problem


class UnreplayableFunctionError(TorchlensError, RuntimeError):
    """A loaded history was asked to call a function it does not call: one that could not be
    saved by name, or one the file names that is not an operation torchlens traces. The
    message names the function; trace the model again to re-run that layer.

    Example:
        >>> isinstance(UnreplayableFunctionError("x"), RuntimeError)
        True
    """
