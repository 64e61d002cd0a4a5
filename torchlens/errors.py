"""``TorchlensError``: the base class of every exception torchlens defines, so that
``except tl.TorchlensError`` catches what torchlens raises of its own. Each subclass also keeps
the built-in base that says what kind of error it is (``HistoryFileError`` is a ``ValueError``,
``RerunError`` a ``RuntimeError``), so existing ``except`` clauses go on working.

Example:
    >>> import torchlens as tl
    >>> issubclass(tl.HistoryFileError, tl.TorchlensError), issubclass(tl.HistoryFileError, ValueError)
    (True, True)
"""


class TorchlensError(Exception):
    """Base class of the errors torchlens raises itself."""


__all__ = ["TorchlensError"]
