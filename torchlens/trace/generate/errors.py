"""The errors of ``log_generate``: each keeps the built-in base that says what kind it is."""

from __future__ import annotations

from ...errors import TorchlensError


class NotGenerativeError(TorchlensError, TypeError):
    """``log_generate`` was given a model without a HuggingFace-style ``generate`` method."""


class GenerateArgumentError(TorchlensError, ValueError):
    """A bad argument of ``log_generate`` (``max_new_tokens``, devices of model and input)."""


class StepStructureError(TorchlensError, RuntimeError):
    """A generation step ran differently from the earlier step its saved layers were resolved on."""


__all__ = ["NotGenerativeError", "GenerateArgumentError", "StepStructureError"]
