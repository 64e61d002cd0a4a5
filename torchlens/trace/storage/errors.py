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
