"""``tl.log_generate``: every forward pass of HuggingFace's ``generate``, one ``ModelHistory`` per
step (``run.py``), the ``GenerateHistory`` holding them (``result.py``) and its graph page with a
step slider (``page.py``)."""

from .errors import GenerateArgumentError, NotGenerativeError, StepStructureError
from .result import GenerateHistory
from .run import log_generate

__all__ = ["log_generate", "GenerateHistory", "NotGenerativeError", "GenerateArgumentError", "StepStructureError"]
